// The pipeline in one process: each stage a thread with its own backend and model slice,
// neighbours joined by inproc links. Equivalence: with fp32 transport, every schedule,
// stage count, microbatch count and recomputation setting gives bitwise the weights of
// single-device gradient accumulation; fp16 activations stay within a stated bound.
#include <gtest/gtest.h>

#include <mutex>
#include <optional>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/pipeline/stage_trainer.h"
#include "runtime/job/job.h"
#include "tests/test_util.h"
#include "transport/local_group.h"
#include "transport/zmq_link.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

using Weights = std::map<std::string, std::vector<float>>;

Weights reference(const PipelineOptions& o, const Dataset& d, int epochs,
                  const char* spec = testing::kTinyNet) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(spec));
  m.build(be, o.seed);
  Optimizer opt(be, OptimizerOptions{});
  TrainOptions t{o.batch, o.seed, o.shuffle, o.microbatches, o.microbatch_shares};
  Trainer trainer(m, opt, t);
  for (int e = 0; e < epochs; ++e) trainer.trainEpoch(d, e, {});
  Weights w;
  for (Param* p : m.params()) w[p->name] = toHost(p->value);
  return w;
}

struct PipelineRun {
  Weights weights;
  std::vector<double> losses;  // the last stage's, per epoch
  EvalResult eval;
  std::vector<StageCounters> counters;                            // replica 0's, by stage
  std::map<std::pair<int, int>, StageCounters> replica_counters;  // by stage and replica
  std::vector<std::vector<double>> replica_losses;                // every last-stage replica's
  std::vector<EvalResult> replica_evals;
  std::map<int64_t, EvalAnswer> answers;  // an evaluation stream's, by first sample
};

// A pipeline of p stages, stage s with replicas[s] replicas (default one each): each
// replica a thread; every replica of a stage linked to every replica of the next;
// replicas of a stage share an in-process group.
PipelineRun pipeline(int p, const PipelineOptions& options, const Dataset& d, int epochs,
                     transport::Codec codec = transport::Codec::kRaw, const Dataset* test = nullptr,
                     std::vector<int> replicas = {}, const EvalStream* stream = nullptr,
                     const char* spec = testing::kTinyNet, int chunks = 1) {
  static int run_id = 0;
  const std::string id = std::to_string(run_id++);
  replicas.resize(static_cast<size_t>(p), 1);
  auto R = [&](int s) { return replicas[static_cast<size_t>(s)]; };
  transport::Context ctx;
  // Interleaved (chunks > 1): stage s holds the equal split's ranges s, p + s, ...
  const auto ranges = runtime::equalStageRanges(Model(parseModelSpec(spec)).size(), p * chunks);
  // down[s][i][j] is replica i of stage s's end of its link to replica j of stage s + 1;
  // up[s][i][j] the other end. Interleaved, the last stage's link goes to the first.
  using Links = std::vector<std::vector<std::unique_ptr<transport::ZmqLink>>>;
  std::vector<Links> down(static_cast<size_t>(p)), up(static_cast<size_t>(p));
  auto R1 = [&](int s) { return R(s % p); };
  for (int s = 0; s + 1 < p || (chunks > 1 && s < p); ++s) {
    auto& ds = down[static_cast<size_t>(s)];
    auto& us = up[static_cast<size_t>(s)];
    ds.resize(static_cast<size_t>(R(s)));
    us.resize(static_cast<size_t>(R(s)));
    for (int i = 0; i < R(s); ++i) {
      for (int j = 0; j < R1(s + 1); ++j) {
        transport::LinkOptions a, b;
        const std::string name = "inproc://pipe" + id + "-" + std::to_string(s) + "-" +
                                 std::to_string(i) + "-" + std::to_string(j);
        a.bind = name + "-down";
        b.bind = name + "-up";
        a.codec = b.codec = codec;
        a.timeout = b.timeout = 20s;
        ds[static_cast<size_t>(i)].push_back(std::make_unique<transport::ZmqLink>(ctx, a));
        us[static_cast<size_t>(i)].push_back(std::make_unique<transport::ZmqLink>(ctx, b));
        ds[static_cast<size_t>(i)].back()->connect(us[static_cast<size_t>(i)].back()->endpoint());
        us[static_cast<size_t>(i)].back()->connect(ds[static_cast<size_t>(i)].back()->endpoint());
      }
    }
  }
  std::vector<std::vector<std::unique_ptr<Group>>> groups;
  for (int s = 0; s < p; ++s) groups.push_back(transport::makeLocalGroup(R(s)));
  PipelineRun run;
  std::vector<std::vector<Weights>> parts(static_cast<size_t>(p));  // by stage and replica
  for (int s = 0; s < p; ++s) parts[static_cast<size_t>(s)].resize(static_cast<size_t>(R(s)));
  run.counters.resize(static_cast<size_t>(p));
  std::mutex mu;
  std::vector<std::exception_ptr> errors;
  std::vector<std::thread> threads;
  for (int s = 0; s < p; ++s) {
    for (int r = 0; r < R(s); ++r) {
      threads.emplace_back([&, s, r] {
        try {
          cpu::CpuBackend be(cpu::CpuOptions{1});
          Model m(parseModelSpec(spec));
          std::vector<LayerRange> mine;
          for (int c = 0; c < chunks; ++c) mine.push_back(ranges[static_cast<size_t>(c * p + s)]);
          m.build(be, options.seed, mine);
          Optimizer opt(be, OptimizerOptions{});
          std::vector<Link*> prev_links, next_links;
          const bool ring = chunks > 1;
          const int before = (s + p - 1) % p;
          for (int i = 0; (s > 0 || ring) && i < R(before); ++i)
            prev_links.push_back(
                up[static_cast<size_t>(before)][static_cast<size_t>(i)][static_cast<size_t>(r)]
                    .get());
          for (int j = 0; (s + 1 < p || ring) && j < R1(s + 1); ++j)
            next_links.push_back(
                down[static_cast<size_t>(s)][static_cast<size_t>(r)][static_cast<size_t>(j)].get());
          std::optional<ReplicaLinks> prev, next;
          if (!prev_links.empty()) prev.emplace(prev_links);
          if (!next_links.empty()) next.emplace(next_links);
          PipelineOptions o = options;
          o.replicas = groups[static_cast<size_t>(s)][static_cast<size_t>(r)].get();
          StageTrainer st(m, StageRange::interleaved(s, p, mine), prev ? &*prev : nullptr,
                          next ? &*next : nullptr, &opt, o);
          const Dataset* data = s == 0 ? &d : nullptr;
          std::vector<double> losses;
          for (int e = 0; e < epochs; ++e)
            losses.push_back(st.trainEpoch(data, d.size(), e, {}).train_loss);
          EvalResult eval;
          EvalStream es = stream ? *stream : EvalStream{};
          if (stream)
            es.answer = [&](const EvalAnswer& a) {
              std::lock_guard lock(mu);
              EXPECT_TRUE(run.answers.emplace(a.first, a).second) << "answered twice: " << a.first;
            };
          if (test) eval = st.evaluate(s == 0 ? test : nullptr, test->size(), 50, es);
          Weights w;
          for (Param* param : m.params()) w[param->name] = toHost(param->value);
          std::lock_guard lock(mu);
          parts[static_cast<size_t>(s)][static_cast<size_t>(r)] = w;
          if (r == 0) run.counters[static_cast<size_t>(s)] = st.executor().counters();
          run.replica_counters[{s, r}] = st.executor().counters();
          if (s == p - 1) {
            run.replica_losses.push_back(losses);
            run.replica_evals.push_back(eval);
          }
        } catch (...) {
          std::lock_guard lock(mu);
          errors.push_back(std::current_exception());
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) std::rethrow_exception(e);
  for (int s = 0; s < p; ++s) {
    const std::vector<Weights>& stage = parts[static_cast<size_t>(s)];
    for (int r = 1; r < R(s); ++r)  // replicas stay bitwise identical
      EXPECT_EQ(stage[static_cast<size_t>(r)], stage[0]) << "stage " << s << " replica " << r;
    run.weights.insert(stage[0].begin(), stage[0].end());
  }
  // Every replica of the last stage reports the whole step's loss and the whole test set.
  run.losses = run.replica_losses.at(0);
  run.eval = run.replica_evals.at(0);
  for (size_t r = 1; r < run.replica_losses.size(); ++r) {
    EXPECT_EQ(run.replica_losses[r], run.losses);
    EXPECT_EQ(run.replica_evals[r].samples, run.eval.samples);
    EXPECT_EQ(run.replica_evals[r].accuracy, run.eval.accuracy);
  }
  return run;
}

// The equivalence sweeps' options: batches of 32 cut into m microbatches.
PipelineOptions sweepOptions(ScheduleKind kind, int64_t m) {
  PipelineOptions o;
  o.schedule = kind;
  o.microbatches = m;
  o.batch = 32;
  o.seed = 5;
  return o;
}

TEST(PipelineTest, BitwiseEqualToSingleDeviceAccumulation) {
  const Dataset d = testing::quadrants(72, 1);  // 72 = 2 batches of 32 and one of 8
  for (const ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kZeroBubbleH1}) {
    for (const int64_t m : {1, 2, 4, 8}) {
      PipelineOptions o = sweepOptions(kind, m);
      const Weights want = reference(o, d, 1);
      for (const int p : {2, 3, 4}) {
        for (const bool recompute : {false, true}) {
          o.recompute = recompute;
          const PipelineRun got = pipeline(p, o, d, 1);
          ASSERT_EQ(got.weights.size(), want.size());
          for (const auto& [name, w] : want)
            ASSERT_EQ(got.weights.at(name), w) << name << ": " << scheduleName(kind) << " p=" << p
                                               << " m=" << m << " recompute=" << recompute;
          // 1F1B keeps at most p - s microbatches stashed, ZB-H1 what 1F1B's first stage
          // does (min(p, m)) on every stage; GPipe all of them.
          for (int s = 0; s < p; ++s) {
            const int64_t peak = got.counters[static_cast<size_t>(s)].peak_stash;
            ASSERT_LE(peak, kind == ScheduleKind::kGPipe  ? m
                            : kind == ScheduleKind::k1F1B ? std::min<int64_t>(p - s, m)
                                                          : std::min<int64_t>(p, m));
          }
        }
      }
    }
  }
}

// A first stage whose first layers hold no weights (a flatten before the first linear
// layer) runs them, and that layer without its input gradient, whole in its zero-bubble
// backward: still bitwise single-device accumulation.
TEST(PipelineTest, AFlattenedFirstStageSplitsItsBackwardBitwise) {
  const char* spec = R"(name: flat
input: [1, 8, 8]
layers:
  - flatten
  - linear: {out: 16}
  - relu
  - linear: {out: 12}
  - relu
  - linear: {out: 4}
)";
  const Dataset d = testing::quadrants(72, 1);
  for (const int64_t m : {2, 4}) {
    const PipelineOptions o = sweepOptions(ScheduleKind::kZeroBubbleH1, m);
    const Weights want = reference(o, d, 1, spec);
    for (const int p : {2, 3}) {
      const PipelineRun got =
          pipeline(p, o, d, 1, transport::Codec::kRaw, nullptr, {}, nullptr, spec);
      ASSERT_EQ(got.weights.size(), want.size());
      for (const auto& [name, w] : want)
        ASSERT_EQ(got.weights.at(name), w) << name << " p=" << p << " m=" << m;
    }
  }
}

// Interleaved 1F1B: each of p stages holds v chunks of the equal split into p v ranges,
// the last stage's chunks passing on to the first's over a ring link. The weights are
// bitwise single-device accumulation's for every p, v and microbatch count (one that
// p does not divide among them, and an epoch's short last batch), with or without
// recomputation; a stage holds no more chunk-microbatches than the schedule's warm-up
// plus one; the evaluation passes every chunk and matches one device.
TEST(PipelineTest, InterleavedStagesAreBitwiseSingleDeviceAccumulation) {
  const Dataset d = testing::quadrants(72, 1), test = testing::quadrants(40, 2);
  for (const int64_t m : {2, 4, 6, 8}) {
    PipelineOptions o = sweepOptions(ScheduleKind::kInterleaved1F1B, m);
    const Weights want = reference(o, d, 1);
    for (const auto& [p, v] :
         std::vector<std::pair<int, int>>{{2, 2}, {3, 2}, {4, 2}, {2, 4}, {3, 3}}) {
      for (const bool recompute : {false, true}) {
        if (recompute && m != 4) continue;
        o.recompute = recompute;
        const PipelineRun got =
            pipeline(p, o, d, 1, transport::Codec::kRaw, &test, {}, nullptr, testing::kTinyNet, v);
        const std::string what = "p=" + std::to_string(p) + " v=" + std::to_string(v) +
                                 " m=" + std::to_string(m) +
                                 " recompute=" + std::to_string(recompute);
        ASSERT_EQ(got.weights.size(), want.size()) << what;
        for (const auto& [name, w] : want)
          ASSERT_EQ(got.weights.at(name), w) << name << " " << what;
        EXPECT_EQ(got.eval.samples, 40) << what;
        for (int s = 0; s < p; ++s) {
          const StageCounters& c = got.counters[static_cast<size_t>(s)];
          if (m % p == 0) {
            EXPECT_LE(c.peak_stash, std::min<int64_t>(2 * (p - s - 1) + (v - 1) * p + 1, v * m))
                << what << " stage " << s;
          }
          EXPECT_GT(c.microbatches, 0) << what;
        }
      }
    }
  }
  // The evaluation through the chunks is one device's with the same weights.
  const PipelineOptions o = sweepOptions(ScheduleKind::kInterleaved1F1B, 4);
  const PipelineRun got =
      pipeline(2, o, d, 1, transport::Codec::kRaw, &test, {}, nullptr, testing::kTinyNet, 2);
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model one(parseModelSpec(testing::kTinyNet));
  one.build(be, o.seed);
  for (Param* param : one.params()) be.upload(param->value, got.weights.at(param->name).data());
  const EvalResult want = evaluate(one, test, 50);
  EXPECT_EQ(got.eval.accuracy, want.accuracy);
  EXPECT_NEAR(got.eval.loss, want.loss, 1e-5 * want.loss);
}

// Batch norms across stages: each microbatch normalised by its own statistics and moving
// the running ones, as single-device accumulation does — the weights and the running
// statistics end bitwise equal, for each schedule, with activation recomputation too
// (a recomputed forward must not move them twice); evaluation uses the running ones.
TEST(PipelineTest, BatchNormsAcrossStagesAreBitwiseSingleDeviceAccumulation) {
  const char* spec = R"(name: bn
input: [1, 8, 8]
layers:
  - conv2d: {out: 4, kernel: 3, padding: 1, bias: false}
  - batchnorm
  - relu
  - maxpool2d: {kernel: 2}
  - flatten
  - linear: {out: 16}
  - batchnorm: {momentum: 0.2}
  - gelu
  - linear: {out: 4}
)";
  const Dataset d = testing::quadrants(72, 1), test = testing::quadrants(40, 2);
  for (const ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kZeroBubbleH1}) {
    for (const int64_t m : {1, 4}) {  // (the batch of 8 in 4: two samples a microbatch)
      PipelineOptions o = sweepOptions(kind, m);
      const Weights want = reference(o, d, 1, spec);
      ASSERT_EQ(want.count("1.running_var"), 1u);
      for (const int p : {2, 3}) {
        for (const bool recompute : {false, true}) {
          o.recompute = recompute;
          const PipelineRun got =
              pipeline(p, o, d, 1, transport::Codec::kRaw, &test, {}, nullptr, spec);
          ASSERT_EQ(got.weights.size(), want.size());
          for (const auto& [name, w] : want)
            ASSERT_EQ(got.weights.at(name), w) << name << ": " << scheduleName(kind) << " p=" << p
                                               << " m=" << m << " recompute=" << recompute;
          EXPECT_EQ(got.eval.samples, 40);
        }
      }
    }
  }
}

// A GPT across stages (token ids into the first, a label per token at the last) ends
// bitwise where single-device accumulation does, and evaluates per token as one device.
TEST(PipelineTest, AGptAcrossStagesIsBitwiseSingleDeviceAccumulation) {
  const Dataset d = testing::phrases(72, 8, 1), test = testing::phrases(30, 8, 2);
  for (const ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kZeroBubbleH1}) {
    for (const int64_t m : {1, 4}) {
      const PipelineOptions o = sweepOptions(kind, m);
      const Weights want = reference(o, d, 1, testing::kTinyGpt);
      for (const int p : {2, 3}) {
        const PipelineRun got =
            pipeline(p, o, d, 1, transport::Codec::kRaw, &test, {}, nullptr, testing::kTinyGpt);
        ASSERT_EQ(got.weights.size(), want.size());
        for (const auto& [name, w] : want)
          ASSERT_EQ(got.weights.at(name), w)
              << name << ": " << scheduleName(kind) << " p=" << p << " m=" << m;
        EXPECT_EQ(got.eval.samples, 30);
        EXPECT_LE(got.eval.accuracy, 1.0);
      }
    }
  }
  // The evaluation matches one device's with the same (bitwise equal) weights, per token.
  const PipelineOptions o = sweepOptions(ScheduleKind::k1F1B, 1);
  const PipelineRun got =
      pipeline(2, o, d, 1, transport::Codec::kRaw, &test, {}, nullptr, testing::kTinyGpt);
  cpu::CpuBackend be;
  Model one(parseModelSpec(testing::kTinyGpt));
  one.build(be, o.seed);
  for (Param* param : one.params()) be.upload(param->value, got.weights.at(param->name).data());
  const EvalResult want = evaluate(one, test, 50);
  EXPECT_NEAR(got.eval.loss, want.loss, 1e-5 * want.loss);
  EXPECT_EQ(got.eval.accuracy, want.accuracy);
}

// A GPT trains across stages as the other models do: replicated stages (the embedding's
// among them) end within rounding of the unreplicated pipeline, and fp16 / bf16
// activations and gradients on the links run and end close to fp32's loss.
TEST(PipelineTest, AGptWithReplicatedStagesOrCodecsTrainsAsOtherModelsDo) {
  const Dataset d = testing::phrases(96, 8, 1);
  const PipelineOptions o = sweepOptions(ScheduleKind::k1F1B, 4);
  const PipelineRun plain =
      pipeline(3, o, d, 2, transport::Codec::kRaw, nullptr, {}, nullptr, testing::kTinyGpt);
  for (const std::vector<int>& replicas : {std::vector<int>{2, 1, 1}, {1, 2, 2}}) {
    const PipelineRun got =
        pipeline(3, o, d, 2, transport::Codec::kRaw, nullptr, replicas, nullptr, testing::kTinyGpt);
    for (const auto& [name, w] : plain.weights) {
      const std::vector<float>& g = got.weights.at(name);
      ASSERT_EQ(g.size(), w.size());
      for (size_t i = 0; i < w.size(); ++i)
        ASSERT_NEAR(g[i], w[i], 1e-5f * (1 + std::abs(w[i])))
            << "replicas " << replicas[0] << replicas[1] << replicas[2] << " " << name;
    }
  }
  for (const transport::Codec codec : {transport::Codec::kF16, transport::Codec::kBF16}) {
    const PipelineRun got = pipeline(3, o, d, 2, codec, nullptr, {}, nullptr, testing::kTinyGpt);
    EXPECT_NE(got.weights, plain.weights);  // the codec really ran
    EXPECT_NEAR(got.losses.back(), plain.losses.back(), 0.02 * plain.losses.back());
  }
}

TEST(PipelineTest, TrainsAndEvaluatesLikeOneDevice) {
  const Dataset train = testing::quadrants(400, 1), test = testing::quadrants(200, 2);
  PipelineOptions o;
  o.batch = 16;
  o.microbatches = 4;
  const PipelineRun got = pipeline(3, o, train, 2, transport::Codec::kRaw, &test);
  ASSERT_EQ(got.losses.size(), 2u);
  EXPECT_LT(got.losses[1], got.losses[0]);
  // The evaluation runs through the stages forward-only; one device gives the same.
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(testing::kTinyNet));
  m.build(be, o.seed);
  for (Param* p : m.params()) be.upload(p->value, got.weights.at(p->name).data());
  const EvalResult want = evaluate(m, test, 50);
  EXPECT_EQ(got.eval.samples, 200);
  EXPECT_EQ(got.eval.accuracy, want.accuracy);
  EXPECT_NEAR(got.eval.loss, want.loss, 1e-5);
  EXPECT_GT(got.eval.accuracy, 0.8);
}

// Hybrid: replicas of a stage take every R-th microbatch and sum their gradients at the
// flush. The sum's order differs from one device's accumulation (each replica adds its
// own microbatches, then the replicas add in rank order), so the weights match the
// un-replicated pipeline within float rounding, not bitwise.
TEST(PipelineTest, ReplicatedStagesMatchTheUnreplicatedPipeline) {
  const Dataset d = testing::quadrants(72, 1);  // batches of 32, 32 and 8
  const std::vector<std::vector<int>> configs = {{1, 2, 1}, {2, 1, 1}, {1, 1, 2}, {2, 3, 2}};
  for (const ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (const int64_t m : {1, 3, 4}) {
      PipelineOptions o = sweepOptions(kind, m);
      const Weights want = reference(o, d, 2);
      for (const std::vector<int>& replicas : configs) {
        const PipelineRun got = pipeline(3, o, d, 2, transport::Codec::kRaw, nullptr, replicas);
        std::string where =
            std::string(scheduleName(kind)).append(" m=" + std::to_string(m) + " replicas");
        // (append, not `" " + std::string`: GCC 12 warns of an overlap that is not there)
        for (const int r : replicas) where.append(" ").append(std::to_string(r));
        ASSERT_EQ(got.weights.size(), want.size()) << where;
        for (const auto& [name, w] : want) {
          const std::vector<float>& g = got.weights.at(name);
          ASSERT_EQ(g.size(), w.size());
          for (size_t i = 0; i < w.size(); ++i)
            ASSERT_NEAR(g[i], w[i], 1e-5f * (1 + std::abs(w[i])))
                << where << " " << name << "[" << i << "]";
        }
        // Each replica of a stage ran its share of the microbatches, not all of them.
        for (int s = 0; s < 3; ++s) {
          const int64_t total = 2 * 3 * m;  // epochs x steps x microbatches
          const int64_t r = replicas[static_cast<size_t>(s)];
          EXPECT_EQ(got.counters[static_cast<size_t>(s)].microbatches, (total + r - 1) / r)
              << where << " stage " << s;
        }
      }
    }
  }
}

// Unequal replicas (a fast and a slow node): every batch is cut so that each replica's
// microbatches hold its share of the samples. The weights are single-device accumulation's
// cut the same way, within float rounding; the replicas' forwards took 3 : 1 of the
// samples (a batch of 8 left over: 6 and 2), and with three microbatches to two replicas
// the one taking two gets its share over both.
TEST(PipelineTest, UnequalReplicasTakeTheirSharesOfEveryBatch) {
  const Dataset d = testing::quadrants(72, 1);  // batches of 32, 32 and 8
  for (const int64_t m : {2, 4, 3}) {
    PipelineOptions o = sweepOptions(ScheduleKind::k1F1B, m);
    o.microbatch_shares = {3, 1};
    const Weights want = reference(o, d, 2);
    for (const std::vector<int>& replicas : {std::vector<int>{2, 1}, {1, 2}}) {
      const PipelineRun got = pipeline(2, o, d, 2, transport::Codec::kRaw, nullptr, replicas);
      const std::string where = "m=" + std::to_string(m) + " replicas " +
                                std::to_string(replicas[0]) + std::to_string(replicas[1]);
      for (const auto& [name, w] : want) {
        const std::vector<float>& g = got.weights.at(name);
        ASSERT_EQ(g.size(), w.size()) << where;
        for (size_t i = 0; i < w.size(); ++i)
          ASSERT_NEAR(g[i], w[i], 1e-5f * (1 + std::abs(w[i]))) << where << " " << name;
      }
      const int s = replicas[0] == 2 ? 0 : 1;
      const int64_t fast = got.replica_counters.at({s, 0}).samples;
      const int64_t slow = got.replica_counters.at({s, 1}).samples;
      EXPECT_EQ(fast + slow, 2 * 72) << where;
      if (m % 2 == 0)
        EXPECT_EQ(fast, 3 * slow) << where;
      else  // three microbatches: the replica with two takes its share in two parts
        EXPECT_NEAR(static_cast<double>(fast) / static_cast<double>(slow), 3.0, 0.5) << where;
      EXPECT_EQ(got.replica_counters.at({1 - s, 0}).samples, 2 * 72) << where;
    }
  }
}

// Replicas sum their gradients in buckets as their last backward of the step finishes
// each layer (a split backward's weight gradients on the later stages, a whole backward
// on the first): buckets of 64 bytes (one per parameter and more) give bitwise the
// weights of one bucket per stage, since two replicas add the same pairs either way.
TEST(PipelineTest, ReplicatedStagesSumTheSameInAnyBucketSize) {
  const Dataset d = testing::quadrants(72, 1);
  for (const std::vector<int>& replicas : {std::vector<int>{2, 1, 2}, {1, 2, 1}}) {
    PipelineOptions o = sweepOptions(ScheduleKind::k1F1B, 3);
    o.bucket_bytes = size_t{1} << 30;
    const PipelineRun one = pipeline(3, o, d, 2, transport::Codec::kRaw, nullptr, replicas);
    o.bucket_bytes = 64;
    const PipelineRun many = pipeline(3, o, d, 2, transport::Codec::kRaw, nullptr, replicas);
    EXPECT_EQ(many.weights, one.weights)
        << "replicas " << replicas[0] << replicas[1] << replicas[2];
    EXPECT_EQ(many.losses, one.losses);
  }
}

TEST(PipelineTest, ReplicatedLastStageEvaluatesTheWholeTestSet) {
  const Dataset train = testing::quadrants(200, 1), test = testing::quadrants(150, 2);
  PipelineOptions o;
  o.batch = 16;
  o.microbatches = 4;
  const PipelineRun one = pipeline(3, o, train, 1, transport::Codec::kRaw, &test);
  const PipelineRun two = pipeline(3, o, train, 1, transport::Codec::kRaw, &test, {2, 1, 2});
  EXPECT_EQ(two.eval.samples, 150);
  EXPECT_NEAR(two.eval.loss, one.eval.loss, 1e-4);
  EXPECT_NEAR(two.losses.at(0), one.losses.at(0), 1e-4);
  EXPECT_GT(two.eval.accuracy, 0.5);
}

TEST(PipelineTest, AnEvaluationStreamAnswersEveryRequestOnceAndResumesAtABatch) {
  const Dataset train = testing::quadrants(128, 1);
  const Dataset test = testing::quadrants(230, 2);
  const PipelineOptions o = sweepOptions(ScheduleKind::k1F1B, 4);  // batches of 32
  // The last stage has two replicas: each answers its own requests.
  EvalStream all;
  const PipelineRun whole =
      pipeline(3, o, train, 1, transport::Codec::kRaw, &test, {1, 1, 2}, &all);
  // The answers tile the test set: batches of 50 in microbatches of ceil(50 / 4).
  int64_t next = 0, correct = 0;
  double loss = 0;
  for (const auto& [first, a] : whole.answers) {
    EXPECT_EQ(first, next);
    EXPECT_EQ(a.columns, 4);
    EXPECT_EQ(static_cast<int64_t>(a.outputs.size()), a.count * a.columns);
    next += a.count;
    correct += a.correct;
    loss += a.loss_sum;
  }
  EXPECT_EQ(next, 230);
  EXPECT_EQ(whole.answers.size(), 4u * 4 + 4);  // 4 batches of 50 and one of 30, 4 each
  EXPECT_EQ(static_cast<double>(correct) / 230, whole.eval.accuracy);
  EXPECT_NEAR(loss / 230, whole.eval.loss, 1e-5);
  // Resumed at the third batch: the same requests from there, bitwise the same answers.
  EvalStream later;
  later.from = 100;
  const PipelineRun tail =
      pipeline(3, o, train, 1, transport::Codec::kRaw, &test, {1, 1, 2}, &later);
  EXPECT_EQ(tail.eval.samples, 130);
  ASSERT_FALSE(tail.answers.empty());
  EXPECT_EQ(tail.answers.begin()->first, 100);
  for (const auto& [first, a] : tail.answers) {
    ASSERT_EQ(whole.answers.count(first), 1u) << first;
    const EvalAnswer& w = whole.answers.at(first);
    EXPECT_EQ(a.count, w.count);
    EXPECT_EQ(a.outputs, w.outputs) << "sample " << first;
    EXPECT_EQ(a.correct, w.correct);
  }
  EXPECT_EQ(tail.answers.size(), whole.answers.size() - 8);
  EvalStream odd;
  odd.from = 30;
  testing::expectThrowWith<InvalidArgument>(
      [&] { pipeline(1, o, train, 1, transport::Codec::kRaw, &test, {}, &odd); },
      {"starts at a batch of the 230 samples, not at 30"});
}

TEST(PipelineTest, APacedStreamFeedsNoFasterThanItsRate) {
  // A lower bound only: sleeping until a request's turn never ends early.
  const Dataset train = testing::quadrants(32, 1);
  const Dataset test = testing::quadrants(80, 2);
  const PipelineOptions o = sweepOptions(ScheduleKind::k1F1B, 4);  // batches of 32
  EvalStream paced;
  paced.interval = 25ms;
  paced.answer = [](const EvalAnswer&) {};
  const auto t0 = std::chrono::steady_clock::now();
  const PipelineRun r = pipeline(2, o, train, 1, transport::Codec::kRaw, &test, {}, &paced);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(r.answers.size(), 4u + 4);  // batches of 50 and 30, four requests each
  EXPECT_GE(took, 7 * 25ms);            // 8 requests: the last fed 7 intervals after the first
}

TEST(PipelineTest, AReplicatedLastStageRefusesToServeOutputs) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(testing::kTinyNet));
  m.build(be, 1);
  const auto group = transport::makeLocalGroup(2);
  ExecutorOptions o;
  o.replicas = group[0].get();
  StageExecutor ex(m, StageRange{0, 1, 0, m.size()}, nullptr, nullptr, nullptr, o);
  const StepInfo serve{0, 4, false, false};
  testing::expectThrowWith<Unsupported>(
      [&] {
        ex.run(stageActions(ScheduleKind::kForwardOnly, 0, 1, 2), serve, [&](int64_t) {
          return MicrobatchInput{be.empty({2, 1, 8, 8}), Tensor()};
        });
      },
      {"stage 0", "replicated last stage cannot serve outputs without labels"});
}

TEST(PipelineTest, Fp16ActivationsStayCloseToFp32) {
  // fp16 rounds each activation and gradient to 11 significant bits (relative error
  // <= 2^-11); over 2 epochs the final loss stays within 2% of the fp32 run's.
  const Dataset d = testing::quadrants(400, 1);
  PipelineOptions o;
  o.batch = 16;
  o.microbatches = 4;
  const PipelineRun fp32 = pipeline(3, o, d, 2);
  const PipelineRun fp16 = pipeline(3, o, d, 2, transport::Codec::kF16);
  EXPECT_NE(fp16.weights, fp32.weights);  // the codec really ran
  EXPECT_NEAR(fp16.losses.back(), fp32.losses.back(), 0.02 * fp32.losses.back());
}

TEST(PipelineTest, MisconfiguredStagesAreNamed) {
  cpu::CpuBackend be;
  Model m(parseModelSpec(testing::kTinyNet));
  m.build(be, 1, 0, 3);
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        StageExecutor(m, StageRange{0, 2, 0, 3}, nullptr, nullptr, nullptr, {});
      },
      {"stage 0", "link to the next stage"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        Stash st;
        m.forward(be.zeros({1, 16, 4, 4}), st, {}, 3, 5);
      },
      {"layers [3, 5) run, but only [0, 3) are built"});
  // Interleaved stages: chunks in order, a ring link on both sides, no replicas, and
  // only the interleaved schedule; a model built in chunks runs only those.
  Model chunked(parseModelSpec(testing::kTinyNet));
  chunked.build(be, 1, {{0, 2}, {5, 7}});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        Stash st;
        chunked.forward(be.zeros({1, 4, 4, 4}), st, {}, 2, 5);
      },
      {"layers [2, 5) run, but only [0, 2), [5, 7) are built"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        chunked.build(be, 1, {{5, 7}, {0, 2}});
      },
      {"[0, 2) does not come after [5, 7)"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        StageExecutor(chunked, StageRange::interleaved(0, 2, {{0, 2}, {1, 7}}), nullptr, nullptr,
                      nullptr, {});
      },
      {"stage 0", "(chunk 1)", "do not come after the chunk before"});
  transport::Context ctx;
  transport::LinkOptions lo;
  lo.bind = "inproc://misconfigured-ring";
  transport::ZmqLink ring(ctx, lo);
  const StageRange two = StageRange::interleaved(0, 2, {{0, 2}, {5, 7}});
  testing::expectThrowWith<InvalidArgument>(
      [&] { StageExecutor(chunked, two, nullptr, &ring, nullptr, {}); },
      {"stage 0", "link to the previous stage", "or holds several chunks"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        StageExecutor(chunked, StageRange::interleaved(0, 1, {{0, 2}, {5, 7}}), &ring, &ring,
                      nullptr, {});
      },
      {"an interleaved stage needs other stages"});
  const auto pair = transport::makeLocalGroup(2);
  ExecutorOptions replicated;
  replicated.replicas = pair[0].get();
  testing::expectThrowWith<Unsupported>(
      [&] { StageExecutor(chunked, two, &ring, &ring, nullptr, replicated); },
      {"stage 0", "interleaved stages cannot have replicas"});
  testing::expectThrowWith<InvalidArgument>(
      [&] { StageTrainer(chunked, two, &ring, &ring, nullptr, PipelineOptions{}); },
      {"stage 0 holds 2 model chunks", "only the interleaved schedule", "'1f1b'"});
  const Dataset d = testing::quadrants(8, 1);
  StageTrainer lone(m, StageRange{0, 1, 0, 3}, nullptr, nullptr, nullptr, PipelineOptions{});
  testing::expectThrowWith<InvalidArgument>([&] { lone.trainEpoch(nullptr, 8, 0, {}); },
                                            {"the dataset goes to the first stage only"});
}

}  // namespace
}  // namespace tandem
