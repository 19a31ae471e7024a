// GenerationLedger: the prompts a generation run passed on and the tokens it answered,
// and the sequences it resumes after a loss.
#include "runtime/job/generation_ledger.h"

#include <gtest/gtest.h>

#include "core/random.h"

namespace tandem::runtime {
namespace {

using namespace std::chrono_literals;

Prompt promptOf(int64_t id, std::vector<int32_t> tokens, int64_t count, float temperature = 0,
                uint64_t seed = 1) {
  return Prompt{id, std::move(tokens), count, temperature, 0, seed, 1};
}

// What the ledger gives the coordinator, until nothing comes within a short wait.
std::vector<Message> drain(GenerationLedger& l) {
  std::vector<Message> out;
  for (;;) {
    std::optional<Message> m = l.pop(1ms);
    if (!m) return out;
    const bool done = std::holds_alternative<PromptsDone>(*m);
    out.push_back(std::move(*m));
    if (done) return out;
  }
}

Token tokenOf(int64_t id, int64_t index, int32_t token) { return Token{id, index, token, 0.5f}; }

TEST(GenerationLedgerTest, PromptsAndCancelsPassThroughInOrderAndTokensKeepTheirNumbers) {
  PromptQueue q;
  GenerationLedger l(q);
  q.push(promptOf(1, {5, 6}, 3));
  q.cancel(1);
  q.push(promptOf(2, {7}, 2));
  q.close();
  const std::vector<Message> got = drain(l);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(std::get<Prompt>(got[0]), promptOf(1, {5, 6}, 3));
  EXPECT_EQ(std::get<CancelPrompt>(got[1]).id, 1);
  EXPECT_EQ(std::get<Prompt>(got[2]), promptOf(2, {7}, 2));
  EXPECT_TRUE(std::holds_alternative<PromptsDone>(got[3]));
  // Before any loss a token is the stages' own.
  EXPECT_EQ(l.answered(tokenOf(2, 0, 9)), tokenOf(2, 0, 9));
  EXPECT_EQ(l.inFlight(), 1);  // 1 cancelled, 2 with one of its two tokens
  EXPECT_EQ(l.answered(tokenOf(2, 1, 4)), tokenOf(2, 1, 4));
  EXPECT_EQ(l.inFlight(), 0);
  // A request it never passed on comes back as it is.
  EXPECT_EQ(l.answered(tokenOf(40, 3, 1)), tokenOf(40, 3, 1));
  // Once the caller's queue ended, it stays ended.
  EXPECT_TRUE(std::holds_alternative<PromptsDone>(*l.pop(1ms)));
}

// After a loss each sequence in flight comes again as its prompt and the tokens it was
// answered, for the tokens it lacks, its sampler advanced past the draws made; its next
// tokens are numbered on from those. Cancelled ones, and ones answered in full, do not
// come again; the caller's prompts follow.
TEST(GenerationLedgerTest, ASequenceInFlightResumesFromItsPromptAndTheTokensItWasAnswered) {
  PromptQueue q;
  GenerationLedger l(q);
  q.push(promptOf(1, {5, 6}, 4));           // greedy: 2 of 4 answered at the loss
  q.push(promptOf(2, {7}, 3, 0.8f, 42));    // sampled: 1 of 3
  q.push(promptOf(3, {8}, 2));              // answered in full
  q.push(promptOf(4, {9}, 5));              // cancelled
  q.push(promptOf(5, {1, 2, 3}, 2, 0.5f));  // passed on, not started: nothing answered
  ASSERT_EQ(drain(l).size(), 5u);
  l.answered(tokenOf(1, 0, 10));
  l.answered(tokenOf(1, 1, 11));
  l.answered(tokenOf(2, 0, 20));
  l.answered(tokenOf(3, 0, 30));
  l.answered(tokenOf(3, 1, 31));
  q.cancel(4);
  ASSERT_EQ(drain(l).size(), 1u);
  q.push(promptOf(6, {4}, 1));  // after the loss, not yet read by any run
  EXPECT_EQ(l.inFlight(), 3);

  EXPECT_EQ(l.resume(), 3);
  const std::vector<Message> again = drain(l);
  ASSERT_EQ(again.size(), 4u);
  EXPECT_EQ(std::get<Prompt>(again[0]), promptOf(1, {5, 6, 10, 11}, 2));
  EXPECT_EQ(std::get<Prompt>(again[1]), promptOf(2, {7, 20}, 2, 0.8f, Rng::seedAfter(42, 1)));
  EXPECT_EQ(std::get<Prompt>(again[2]), promptOf(5, {1, 2, 3}, 2, 0.5f, 1));
  EXPECT_EQ(std::get<Prompt>(again[3]), promptOf(6, {4}, 1));
  // The resumed runs number from 0; the caller hears them on from the tokens before.
  EXPECT_EQ(l.answered(tokenOf(1, 0, 12)), tokenOf(1, 2, 12));
  EXPECT_EQ(l.answered(tokenOf(2, 0, 22)), tokenOf(2, 1, 22));
  EXPECT_EQ(l.answered(tokenOf(5, 0, 50)), tokenOf(5, 0, 50));
  EXPECT_EQ(l.answered(tokenOf(6, 0, 60)), tokenOf(6, 0, 60));

  // A second loss: from every token answered in both runs, numbered on again.
  EXPECT_EQ(l.resume(), 3);
  const std::vector<Message> third = drain(l);
  ASSERT_EQ(third.size(), 3u);
  EXPECT_EQ(std::get<Prompt>(third[0]), promptOf(1, {5, 6, 10, 11, 12}, 1));
  EXPECT_EQ(std::get<Prompt>(third[1]), promptOf(2, {7, 20, 22}, 1, 0.8f, Rng::seedAfter(42, 2)));
  EXPECT_EQ(std::get<Prompt>(third[2]), promptOf(5, {1, 2, 3, 50}, 1, 0.5f, Rng::seedAfter(1, 1)));
  EXPECT_EQ(l.answered(tokenOf(1, 0, 13)), tokenOf(1, 3, 13));
  EXPECT_EQ(l.inFlight(), 2);
}

// A cancel the caller sent that no run read before the loss (a client gone, the model's
// end-of-text token) keeps its sequence from resuming; the queue's end comes after the
// resumed ones.
TEST(GenerationLedgerTest, CancelsAndTheEndNotYetReadAreHonouredOnResuming) {
  PromptQueue q;
  GenerationLedger l(q);
  q.push(promptOf(1, {5}, 4));
  q.push(promptOf(2, {6}, 4));
  ASSERT_EQ(drain(l).size(), 2u);
  l.answered(tokenOf(1, 0, 10));
  q.cancel(2);
  q.close();
  EXPECT_EQ(l.resume(), 1);
  const std::vector<Message> again = drain(l);
  ASSERT_EQ(again.size(), 3u);
  EXPECT_EQ(std::get<Prompt>(again[0]), promptOf(1, {5, 10}, 3));
  EXPECT_EQ(std::get<CancelPrompt>(again[1]).id, 2);  // (the coordinator drops it: not in flight)
  EXPECT_TRUE(std::holds_alternative<PromptsDone>(again[2]));
}

TEST(RngTest, ASeedAfterDrawsContinuesTheStream) {
  Rng a(77);
  for (int i = 0; i < 5; ++i) a.next();
  Rng b(Rng::seedAfter(77, 5));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.next(), b.next());
  EXPECT_EQ(Rng::seedAfter(77, 0), 77u);
}

}  // namespace
}  // namespace tandem::runtime
