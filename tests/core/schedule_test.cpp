// Schedules as data: every generated list for p <= 8, m <= 32 validates, with the peak
// stash each schedule promises; the validator catches incomplete, out-of-order and
// deadlocking lists, naming the stage and action.
#include "core/pipeline/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::expectThrowWith;

TEST(ScheduleTest, EveryGeneratedListValidatesWithItsPeakStash) {
  for (int p = 1; p <= 8; ++p) {
    for (int64_t m = 1; m <= 32; ++m) {
      for (ScheduleKind kind :
           {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kForwardOnly}) {
        const auto lists = scheduleActions(kind, p, m);
        ScheduleReport r;
        ASSERT_NO_THROW(r = validateSchedule(lists, m, isTraining(kind)))
            << scheduleName(kind) << " p=" << p << " m=" << m;
        ASSERT_EQ(r.peak_stash.size(), static_cast<size_t>(p));
        for (int s = 0; s < p; ++s) {
          // Stages after the first split every backward; the first sends no gradient.
          const auto& list = lists[static_cast<size_t>(s)];
          const auto weight_grads = std::count_if(list.begin(), list.end(), [](const Action& a) {
            return a.type == ActionType::kWeightGradient;
          });
          ASSERT_EQ(weight_grads, isTraining(kind) && s > 0 ? m : 0) << "p=" << p << " s=" << s;
          const int64_t peak = r.peak_stash[static_cast<size_t>(s)];
          if (kind == ScheduleKind::kGPipe) {
            ASSERT_EQ(peak, m) << "p=" << p << " m=" << m;
          }
          if (kind == ScheduleKind::k1F1B) {
            ASSERT_LE(peak, p - s) << "p=" << p << " m=" << m << " s=" << s;
            ASSERT_EQ(peak, std::min<int64_t>(p - s, m));
          }
        }
        // With uniform forward and backward costs both training schedules reach exactly
        // the bubble formula; forward-only streaming too (one pass).
        const double formula = static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
        ASSERT_NEAR(r.bubble, formula, 1e-12) << scheduleName(kind) << " p=" << p << " m=" << m;
      }
    }
  }
}

TEST(ScheduleTest, OneFOneBInterleavesAfterItsWarmUp) {
  using A = ActionType;
  const std::vector<Action> want = {{A::kRecvActivation, 0}, {A::kForward, 0},
                                    {A::kSendActivation, 0}, {A::kRecvActivation, 1},
                                    {A::kForward, 1},        {A::kSendActivation, 1},
                                    {A::kRecvGradient, 0},   {A::kBackward, 0},
                                    {A::kSendGradient, 0},   {A::kWeightGradient, 0},
                                    {A::kRecvActivation, 2}, {A::kForward, 2},
                                    {A::kSendActivation, 2}, {A::kRecvGradient, 1},
                                    {A::kBackward, 1},       {A::kSendGradient, 1},
                                    {A::kWeightGradient, 1}, {A::kRecvGradient, 2},
                                    {A::kBackward, 2},       {A::kSendGradient, 2},
                                    {A::kWeightGradient, 2}, {A::kStep, 0}};
  EXPECT_EQ(stageActions(ScheduleKind::k1F1B, 1, 3, 3), want);  // stage 1 of 3: 1 warm-up
}

TEST(ScheduleTest, TheValidatorNamesWhatIsWrong) {
  using A = ActionType;
  const int64_t m = 2;
  auto lists = scheduleActions(ScheduleKind::k1F1B, 2, m);

  auto broken = lists;  // stage 1 never receives activation 1
  std::erase(broken[1], Action{A::kRecvActivation, 1});
  expectThrowWith<InvalidArgument>([&] { validateSchedule(broken, m, true); },
                                   {"stage 1", "forward 1", "before its activation"});

  broken = lists;  // stage 0 waits for gradient 0 before sending activation 0: deadlock
  broken[0] = {{A::kForward, 0},      {A::kRecvGradient, 0},   {A::kSendActivation, 0},
               {A::kForward, 1},      {A::kSendActivation, 1}, {A::kBackward, 0},
               {A::kRecvGradient, 1}, {A::kBackward, 1},       {A::kStep, 0}};
  expectThrowWith<InvalidArgument>(
      [&] { validateSchedule(broken, m, true); },
      {"deadlock", "stage 0 waits at action 1 (receive gradient 0)", "stage 1 waits"});

  broken = lists;  // a backward twice
  broken[1].insert(broken[1].end() - 1, Action{A::kBackward, 0});
  expectThrowWith<InvalidArgument>([&] { validateSchedule(broken, m, true); },
                                   {"stage 1", "backward twice"});

  broken = lists;  // no step
  broken[0].pop_back();
  expectThrowWith<InvalidArgument>([&] { validateSchedule(broken, m, true); },
                                   {"stage 0 never steps"});

  broken = lists;  // a gradient sent that nobody receives
  std::erase(broken[0], Action{A::kRecvGradient, 1});
  expectThrowWith<InvalidArgument>([&] { validateSchedule(broken, m, true); },
                                   {"stage 0", "backward 1", "before its gradient"});

  broken = lists;  // stage 1 never sends gradient 1: stage 0 waits forever
  std::erase(broken[1], Action{A::kSendGradient, 1});
  expectThrowWith<InvalidArgument>([&] { validateSchedule(broken, m, true); },
                                   {"deadlock", "receive gradient 1"});

  broken = lists;  // a step before the last backward
  broken[1].pop_back();
  broken[1].insert(broken[1].end() - 3, Action{A::kStep, 0});
  expectThrowWith<InvalidArgument>([&] { validateSchedule(broken, m, true); },
                                   {"stage 1", "a step before the backward of microbatch 1"});

  broken = lists;  // a weight gradient before its backward
  std::erase(broken[1], Action{A::kWeightGradient, 0});
  broken[1].insert(broken[1].begin() + 2, Action{A::kWeightGradient, 0});
  expectThrowWith<InvalidArgument>([&] { validateSchedule(broken, m, true); },
                                   {"stage 1", "weight gradient 0", "runs before its backward"});

  broken = lists;  // a weight gradient twice
  broken[1].insert(broken[1].end() - 1, Action{A::kWeightGradient, 1});
  expectThrowWith<InvalidArgument>([&] { validateSchedule(broken, m, true); },
                                   {"stage 1", "weight gradient twice"});

  broken = lists;  // a split backward whose weight gradient never runs
  std::erase(broken[1], Action{A::kWeightGradient, 1});
  expectThrowWith<InvalidArgument>(
      [&] { validateSchedule(broken, m, true); },
      {"stage 1", "a step before the weight gradient of microbatch 1"});

  expectThrowWith<InvalidArgument>(
      [&] { validateSchedule(scheduleActions(ScheduleKind::k1F1B, 2, 2), 2, false); },
      {"not allowed in a forward-only schedule"});
  expectThrowWith<InvalidArgument>([&] { validateSchedule(lists, 3, true); },
                                   {"a step before the backward of microbatch 2"});
  auto forward_only = scheduleActions(ScheduleKind::kForwardOnly, 2, 2);
  expectThrowWith<InvalidArgument>([&] { validateSchedule(forward_only, 3, false); },
                                   {"stage 0 never forwards microbatch 2"});
}

// ZB-H1: every list validates; each stage holds at most what 1F1B's first stage does
// (min(p, m) microbatches until their weight gradients); every stage splits its backwards
// and runs backwards and weight gradients in ascending microbatch order (the gradient sums
// of single-device accumulation); with a forward, a backward and a weight gradient one
// tick each it never takes longer than 1F1B under the same ticks, and with m = p its bubble
// is the paper's (p-1)(F+B-W) of stage time.
TEST(ScheduleTest, ZeroBubbleFillsTheBubbleWithWeightGradients) {
  for (int p = 1; p <= 8; ++p) {
    for (int64_t m = 1; m <= 32; ++m) {
      const auto zb = scheduleActions(ScheduleKind::kZeroBubbleH1, p, m);
      ScheduleReport r;
      ASSERT_NO_THROW(r = validateSchedule(zb, m, true, 1, 1)) << "p=" << p << " m=" << m;
      const ScheduleReport one =
          validateSchedule(scheduleActions(ScheduleKind::k1F1B, p, m), m, true, 1, 1);
      for (int s = 0; s < p; ++s) {
        const auto& list = zb[static_cast<size_t>(s)];
        EXPECT_EQ(list, stageActions(ScheduleKind::kZeroBubbleH1, s, p, m));
        EXPECT_LE(r.peak_stash[static_cast<size_t>(s)], std::min<int64_t>(p, m))
            << "p=" << p << " m=" << m << " s=" << s;
        int64_t next_b = 0, next_w = 0;
        for (const Action& a : list) {
          if (a.type == ActionType::kBackward) {
            EXPECT_EQ(a.microbatch, next_b++);
          }
          if (a.type == ActionType::kWeightGradient) {
            EXPECT_EQ(a.microbatch, next_w++);
          }
        }
        EXPECT_EQ(next_w, m);
      }
      EXPECT_LE(r.makespan, one.makespan) << "p=" << p << " m=" << m;
      EXPECT_EQ(*std::max_element(r.peak_stash.begin(), r.peak_stash.end()),
                *std::max_element(one.peak_stash.begin(), one.peak_stash.end()));
      if (m == p) {
        EXPECT_NEAR(r.bubble, bubbleFormula(ScheduleKind::kZeroBubbleH1, p, m), 1e-12)
            << "p=" << p << " m=" << m;
      }
    }
  }
  EXPECT_NEAR(bubbleFormula(ScheduleKind::kZeroBubbleH1, 4, 8), 3.0 / 27, 1e-12);
  EXPECT_NEAR(bubbleFormula(ScheduleKind::k1F1B, 4, 8), 3.0 / 11, 1e-12);
  // The weight gradients wait: on the third stage of four the first runs after the
  // backward of a later microbatch.
  const auto s1 = stageActions(ScheduleKind::kZeroBubbleH1, 2, 4, 8);
  const auto w0 = std::find(s1.begin(), s1.end(), Action{ActionType::kWeightGradient, 0});
  const auto b1 = std::find(s1.begin(), s1.end(), Action{ActionType::kBackward, 1});
  EXPECT_LT(b1 - s1.begin(), w0 - s1.begin());
}

// Interleaved 1F1B: every list for p <= 8, v <= 4 and m a multiple of p up to 32
// validates; with a chunk's forward and backward one tick each its bubble is exactly the
// formula (p-1)/(vm+p-1), v times smaller in ticks than 1F1B's over the same work (each
// 1F1B tick a whole stage: v chunks' worth); each chunk runs its backwards in ascending
// microbatch order (single-device accumulation's sums); a stage stashes no more than
// Megatron's warm-up plus one, and chunk 1 of stage 0 receives from the last stage.
TEST(ScheduleTest, InterleavedOneFOneBShrinksTheBubbleByItsChunks) {
  for (int p = 1; p <= 8; ++p)
    for (int v = 1; v <= 4; ++v)
      for (int64_t m = p; m <= 32; m += p) {
        const auto lists = scheduleActions(ScheduleKind::kInterleaved1F1B, p, m, v);
        ScheduleReport r;
        ASSERT_NO_THROW(r = validateSchedule(lists, m, true))
            << "p=" << p << " v=" << v << " m=" << m;
        EXPECT_NEAR(r.bubble, bubbleFormula(ScheduleKind::kInterleaved1F1B, p, m, v), 1e-12)
            << "p=" << p << " v=" << v << " m=" << m;
        EXPECT_EQ(r.makespan, 2 * (v * m + p - 1)) << "p=" << p << " v=" << v << " m=" << m;
        for (int s = 0; s < p; ++s) {
          const auto& list = lists[static_cast<size_t>(s)];
          EXPECT_EQ(list, stageActions(ScheduleKind::kInterleaved1F1B, s, p, m, v));
          std::vector<int64_t> next_b(static_cast<size_t>(v), 0);
          for (const Action& a : list)
            if (a.type == ActionType::kBackward) {
              EXPECT_EQ(a.microbatch, next_b[static_cast<size_t>(a.chunk)]++);
            }
          for (int64_t n : next_b) EXPECT_EQ(n, m);
          const int64_t warmup = std::min<int64_t>(2 * (p - s - 1) + (v - 1) * p, v * m);
          EXPECT_LE(r.peak_stash[static_cast<size_t>(s)], warmup + 1);
        }
      }
  // One chunk is 1F1B's timing.
  EXPECT_EQ(
      validateSchedule(scheduleActions(ScheduleKind::kInterleaved1F1B, 4, 8, 1), 8, true).makespan,
      validateSchedule(scheduleActions(ScheduleKind::k1F1B, 4, 8), 8, true).makespan);
  EXPECT_NEAR(bubbleFormula(ScheduleKind::kInterleaved1F1B, 4, 8, 2), 3.0 / 19, 1e-12);
  // Stage 0's chunk 1 is virtual stage p: its activations come from the last stage's chunk 0.
  const auto s0 = stageActions(ScheduleKind::kInterleaved1F1B, 0, 2, 2, 2);
  EXPECT_NE(std::find(s0.begin(), s0.end(), Action{ActionType::kRecvActivation, 0, 1}), s0.end());
  EXPECT_EQ(std::find(s0.begin(), s0.end(), Action{ActionType::kRecvActivation, 0, 0}), s0.end());
  // A list that sends chunk 1's activation before chunk 0's forward made it is caught.
  auto bad = scheduleActions(ScheduleKind::kInterleaved1F1B, 2, 2, 2);
  auto& l1 = bad[1];
  const auto f = std::find(l1.begin(), l1.end(), Action{ActionType::kForward, 0, 0});
  ASSERT_NE(f, l1.end());
  l1.erase(f);
  expectThrowWith<InvalidArgument>([&] { validateSchedule(bad, 2, true); },
                                   {"stage 1", "send activation 0", "not yet computed"});
  expectThrowWith<InvalidArgument>(
      [] { stageActions(ScheduleKind::kInterleaved1F1B, 0, 4, 8, 65); },
      {"chunks per stage must be 1 to 64, got 65"});
  expectThrowWith<InvalidArgument>([] { stageActions(ScheduleKind::k1F1B, 0, 4, 8, 2); },
                                   {"'1f1b' runs one chunk per stage", "interleaved"});
  const std::string text = renderSchedule(ScheduleKind::kInterleaved1F1B, 2, 2, 2);
  EXPECT_NE(text.find("2 chunks per stage"), std::string::npos) << text;
  EXPECT_NE(text.find("stage 0 |F0a|F1a|F0b|"), std::string::npos) << text;
  EXPECT_NE(text.find("receive activation 0 of chunk 1"), std::string::npos) << text;
  EXPECT_NE(text.find("formula (p-1)/(vm+p-1)"), std::string::npos) << text;
}

// A step whose microbatches the stages do not divide (an epoch's last, short batch) still
// gets complete, deadlock-free lists that run each chunk's backwards in microbatch order,
// holding no more than every forward; where the kind's warm-up fits, it is kept. An
// interleaved stage's forward-only lists pass each microbatch through every chunk.
TEST(ScheduleTest, InterleavedRunsAnyMicrobatchCountAndForwardsInItsOrder) {
  int warmups_kept = 0;
  for (int p = 2; p <= 6; ++p)
    for (int v = 2; v <= 3; ++v)
      for (int64_t m = 1; m <= 3 * p; ++m) {
        const std::string what =
            "p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m);
        const auto lists = scheduleActions(ScheduleKind::kInterleaved1F1B, p, m, v);
        ScheduleReport r;
        ASSERT_NO_THROW(r = validateSchedule(lists, m, true)) << what;
        for (const auto& list : lists) {
          std::vector<int64_t> next_b(static_cast<size_t>(v), 0);
          for (const Action& a : list)
            if (a.type == ActionType::kBackward) {
              EXPECT_EQ(a.microbatch, next_b[static_cast<size_t>(a.chunk)]++) << what;
            }
          for (int64_t n : next_b) EXPECT_EQ(n, m) << what;
        }
        for (int64_t peak : r.peak_stash) EXPECT_LE(peak, v * m) << what;
        // The last stage's warm-up is (v - 1) p forwards when the kind's fits.
        int64_t forwards = 0;
        for (const Action& a : lists.back()) {
          if (a.type == ActionType::kBackward) break;
          forwards += a.type == ActionType::kForward;
        }
        if (m % p != 0 && forwards == std::min<int64_t>((v - 1) * p, v * m) + 1) ++warmups_kept;
        const auto eval = scheduleActions(ScheduleKind::kForwardOnly, p, m, v);
        ASSERT_NO_THROW(validateSchedule(eval, m, false)) << what;
        int64_t last_forwards = 0;
        for (const Action& a : eval.back())
          last_forwards += a.type == ActionType::kForward && a.chunk == v - 1;
        EXPECT_EQ(last_forwards, m) << what;
        EXPECT_EQ(std::count_if(eval[0].begin(), eval[0].end(),
                                [](const Action& a) { return a.type == ActionType::kBackward; }),
                  0);
      }
  EXPECT_GT(warmups_kept, 0);
  // Forward-only lists name a chunk only on interleaved stages.
  expectThrowWith<InvalidArgument>([] { stageActions(ScheduleKind::kGPipe, 0, 2, 4, 2); },
                                   {"'gpipe' runs one chunk per stage"});
}

TEST(ScheduleTest, NamesAndBadArguments) {
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kZeroBubbleH1,
                         ScheduleKind::kInterleaved1F1B, ScheduleKind::kForwardOnly})
    EXPECT_EQ(parseSchedule(scheduleName(k)), k);
  expectThrowWith<InvalidArgument>([] { parseSchedule("zb-v"); },
                                   {"'zb-v'", "gpipe, 1f1b, zb-h1, interleaved or forward"});
  EXPECT_THROW(stageActions(ScheduleKind::kGPipe, 3, 3, 4), InvalidArgument);
  EXPECT_THROW(stageActions(ScheduleKind::kGPipe, 0, 3, 0), InvalidArgument);
}

TEST(ScheduleTest, TheDiagramShowsEveryCellAndTheBubble) {
  const std::string text = renderSchedule(ScheduleKind::kGPipe, 2, 2);
  // 2 stages x (m + p - 1) x 2 = 6 ticks; stage 1 starts one tick late.
  EXPECT_NE(text.find("stage 0 |F0|F1|..|..|B0|B1|"), std::string::npos) << text;
  EXPECT_NE(text.find("stage 1 |..|F0|F1|B0|B1|..|"), std::string::npos) << text;
  EXPECT_NE(text.find("bubble: 0.333333"), std::string::npos) << text;
  EXPECT_NE(text.find("stage 1: receive activation 0, forward 0"), std::string::npos) << text;
  // ZB-H1 draws its weight gradients, the first stage's too.
  const std::string zb = renderSchedule(ScheduleKind::kZeroBubbleH1, 2, 2);
  EXPECT_NE(zb.find("|W0|"), std::string::npos) << zb;
  EXPECT_NE(zb.find("receive gradient 0, backward 0, weight gradient 0"), std::string::npos)
      << zb;
  EXPECT_NE(zb.find("formula (p-1)/(3m+p-1)"), std::string::npos) << zb;
}

}  // namespace
}  // namespace tandem
