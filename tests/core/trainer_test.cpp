// The training loop: determinism (same seed, bitwise the same weights), learning on a
// synthetic problem, and shape checks between model and data.
#include "core/train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/loss.h"
#include "core/model_spec.h"
#include "core/train/microbatch.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

std::vector<std::vector<float>> trainAndDump(uint64_t seed, int threads,
                                             const std::string& opt_kind) {
  cpu::CpuBackend be(cpu::CpuOptions{threads});
  Model m(parseModelSpec(testing::kTinyNet));
  m.build(be, seed);
  OptimizerOptions o;
  o.kind = opt_kind;
  o.lr = opt_kind == "adamw" ? 0.01f : 0.05f;
  Optimizer opt(be, o);
  Trainer t(m, opt, TrainOptions{16, seed, true});
  const Dataset d = testing::quadrants(200, 1);
  for (int e = 0; e < 2; ++e) t.trainEpoch(d, e, {});
  std::vector<std::vector<float>> out;
  for (Param* p : m.params()) out.push_back(toHost(p->value));
  return out;
}

TEST(TrainerTest, SameSeedGivesBitwiseIdenticalWeights) {
  for (const char* kind : {"sgd", "adamw"}) {
    const auto a = trainAndDump(3, 2, kind);
    EXPECT_EQ(a, trainAndDump(3, 2, kind)) << kind;
    EXPECT_NE(a, trainAndDump(4, 2, kind)) << kind;
  }
}

TEST(TrainerTest, LearnsASyntheticProblem) {
  cpu::CpuBackend be;
  Model m(parseModelSpec(testing::kTinyNet));
  m.build(be, 1);
  Optimizer opt(be, OptimizerOptions{});
  Trainer t(m, opt, TrainOptions{16, 1, true});
  const Dataset train = testing::quadrants(800, 1), test = testing::quadrants(200, 2);
  const double before = evaluate(m, test, 64).accuracy;
  EpochReport r{};
  for (int e = 0; e < 3; ++e) r = t.trainEpoch(train, e, {});
  const EvalResult after = evaluate(m, test, 64);
  EXPECT_GT(after.accuracy, 0.9) << "before training: " << before;
  EXPECT_LT(r.train_loss, 0.5);
  EXPECT_EQ(after.samples, 200);
}

TEST(TrainerTest, ProgressReportsEveryStep) {
  cpu::CpuBackend be;
  Model m(parseModelSpec(testing::kTinyNet));
  m.build(be, 1);
  Optimizer opt(be, OptimizerOptions{});
  Trainer t(m, opt, TrainOptions{30, 1, false});
  std::vector<StepReport> reports;
  t.trainEpoch(testing::quadrants(100, 1), 0, [&](const StepReport& r) { reports.push_back(r); });
  ASSERT_EQ(reports.size(), 4u);  // 30 + 30 + 30 + 10
  EXPECT_EQ(reports.back().step, 4);
  EXPECT_EQ(reports.back().steps, 4);
  EXPECT_EQ(t.globalStep(), 4);
}

TEST(TrainerTest, ModelAndDataMustAgree) {
  cpu::CpuBackend be;
  Model m(loadModelSpec(TANDEM_SOURCE_DIR "/examples/models/mlp.yaml"));
  m.build(be, 1);
  Optimizer opt(be, OptimizerOptions{});
  Trainer t(m, opt, TrainOptions{});
  testing::expectThrowWith<InvalidArgument>(
      [&] { t.trainEpoch(testing::quadrants(10, 1), 0, {}); },
      {"takes [1, 28, 28]", "quadrants samples are [1, 8, 8]"});
}

TEST(LossTest, MseAndAccuracy) {
  cpu::CpuBackend be;
  Tensor pred = toDevice(be, {2, 2}, {1, 2, 3, 4}), target = toDevice(be, {2, 2}, {1, 0, 0, 4});
  Tensor grad = be.empty({2, 2});
  EXPECT_DOUBLE_EQ(mseLoss(be, pred, target, 0.25f, grad), 13.0);
  EXPECT_EQ(toHost(grad), (std::vector<float>{0, 1, 1.5f, 0}));
  EXPECT_EQ(countCorrect({0, 1, 5, 2, 3, 3}, {1, 0, 0}, 2), 3);  // ties go to the first
}

// A GPT learns a repeating phrase: the per-token loss falls from about ln 256 = 5.5 to
// well under 1 (most next bytes are certain), and held-out accuracy is per token.
TEST(TrainerTest, AGptLearnsTextAndIsScoredPerToken) {
  cpu::CpuBackend be(cpu::CpuOptions{2});
  Model m(parseModelSpec(testing::kTinyGpt));
  m.build(be, 1);
  EXPECT_EQ(labelsPerSample(m), 8);
  OptimizerOptions o;
  o.kind = "adamw";
  o.lr = 0.01f;
  Optimizer opt(be, o);
  Trainer t(m, opt, TrainOptions{16, 1, true, 2});
  const Dataset train = testing::phrases(320, 8, 1), held = testing::phrases(64, 8, 2);
  const EvalResult before = evaluate(m, held, 32);
  EXPECT_GT(before.loss, 4.0);
  for (int e = 0; e < 4; ++e) t.trainEpoch(train, e, {});
  const EvalResult after = evaluate(m, held, 32);
  EXPECT_LT(after.loss, 1.0);
  EXPECT_GT(after.accuracy, 0.7);
  EXPECT_EQ(after.samples, 64);
}

TEST(TrainerTest, TextDataNeedsALanguageModelOfItsShape) {
  cpu::CpuBackend be;
  const Dataset text = testing::phrases(4, 8, 1);
  Model classifier(parseModelSpec(testing::kTinyNet));
  classifier.build(be, 1);
  testing::expectThrowWith<InvalidArgument>([&] { checkClassifier(classifier, text); },
                                            {"takes [1, 8, 8]", "phrases samples are [8]"});
  Model narrow(
      parseModelSpec("input: [8]\nlayers: [{embedding: {vocab: 100, dim: 8}}, "
                     "{linear: {out: 100}}]\n"));
  testing::expectThrowWith<InvalidArgument>([&] { checkClassifier(narrow, text); },
                                            {"outputs [8, 100]", "needs [8, 256]", "vocab 256"});
  Model small(
      parseModelSpec("input: [8]\nlayers: [{embedding: {vocab: 100, dim: 8}}, "
                     "{linear: {out: 256}}]\n"));
  testing::expectThrowWith<InvalidArgument>([&] { checkClassifier(small, text); },
                                            {"embeds 100 token ids", "has 256 (bytes)"});
  Model numbers(parseModelSpec("input: [8]\nlayers: [{linear: {out: 256}}]\n"));
  testing::expectThrowWith<InvalidArgument>([&] { checkClassifier(numbers, text); },
                                            {"takes numbers", "gives token ids", "embedding"});
}

// A language model's logits [N, T, C] with labels [N, T]: every token is one row, so the
// loss and gradient are those of the same rows written as [N*T, C].
TEST(LossTest, TokenLevelCrossEntropyTreatsEveryTokenAsARow) {
  cpu::CpuBackend be;
  const std::vector<float> logits = testing::randomVector(3, 2 * 3 * 5, -2, 2);
  const std::vector<int32_t> labels = {0, 4, 2, 1, 1, 3};
  Tensor g3 = be.empty({2, 3, 5}), g2 = be.empty({6, 5});
  const double l3 = softmaxCrossEntropy(be, toDevice(be, {2, 3, 5}, logits),
                                        toDeviceI32(be, {2, 3}, labels), 0.5f, g3);
  const double l2 =
      softmaxCrossEntropy(be, toDevice(be, {6, 5}, logits), toDeviceI32(be, {6}, labels), 0.5f, g2);
  EXPECT_EQ(l3, l2);
  EXPECT_EQ(toHost(g3), toHost(g2));
  EXPECT_GT(l3, 0.0);
  EXPECT_THROW(softmaxCrossEntropy(be, toDevice(be, {2, 3, 5}, logits),
                                   toDeviceI32(be, {2}, {0, 1}), 1.0f, Tensor()),
               InvalidArgument);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

std::vector<int64_t> counts(const std::vector<MicrobatchSlice>& slices) {
  std::vector<int64_t> out;
  int64_t offset = 0;
  for (const MicrobatchSlice& s : slices) {
    EXPECT_EQ(s.offset, offset);  // contiguous, in order
    offset += s.count;
    out.push_back(s.count);
  }
  return out;
}

// Unequal replicas' microbatches: replica (first + k) mod R takes microbatch k, and the
// step's samples go to the replicas in proportion to their shares.
TEST(MicrobatchTest, SharesCutEachReplicasPartOfTheBatch) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(counts(splitBatch(64, 2, {3, 1}, 0)), (V{48, 16}));
  EXPECT_EQ(counts(splitBatch(64, 2, {3, 1}, 1)), (V{16, 48}));  // replica 1's first
  EXPECT_EQ(counts(splitBatch(64, 4, {3, 1}, 8)), (V{24, 8, 24, 8}));
  // Three microbatches for two replicas: replica 0 takes two, its 3/4 over both.
  EXPECT_EQ(counts(splitBatch(40, 3, {3, 1}, 0)), (V{15, 10, 15}));
  EXPECT_EQ(counts(splitBatch(40, 3, {3, 1}, 1)), (V{5, 30, 5}));
  // A share too small for a sample still gets one; fewer samples than microbatches.
  EXPECT_EQ(counts(splitBatch(10, 2, {1000, 1}, 0)), (V{9, 1}));
  EXPECT_EQ(counts(splitBatch(1, 2, {3, 1}, 0)), (V{1}));
  // No shares: splitBatch's equal cut.
  EXPECT_EQ(counts(splitBatch(10, 3, {}, 5)), counts(splitBatch(10, 3)));
  testing::expectThrowWith<InvalidArgument>(
      [] {
        splitBatch(10, 2, {1, -1}, 0);
      },
      {"non-negative"});
}

// Measured shares: each replica's samples (replica (first + k) mod R took microbatch k)
// over its seconds, as fractions of 1; nothing to compare gives none.
TEST(MicrobatchTest, MeasuredSharesAreEachReplicasSamplesPerSecond) {
  using V = std::vector<double>;
  const std::vector<MicrobatchSlice> cut = slicesOf({30, 10, 30, 10});
  // Replica 0 took 60 samples in 1 s, replica 1 took 20 in 0.5 s: 60 and 40 a second.
  V got = measuredShares(cut, 0, {1.0, 0.5});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_DOUBLE_EQ(got[0], 0.6);
  EXPECT_DOUBLE_EQ(got[1], 0.4);
  // From microbatch 1: replica 1 took the 30s, 120 a second against replica 0's 20.
  got = measuredShares(cut, 1, {1.0, 0.5});
  EXPECT_DOUBLE_EQ(got[0], 1.0 / 7);
  EXPECT_DOUBLE_EQ(got[1], 6.0 / 7);
  // Three replicas over four microbatches: replica 0 took two (40 samples in 2 s), the
  // others 10 and 30 in 1 s: 20, 10 and 30 a second.
  got = measuredShares(cut, 0, {2.0, 1.0, 1.0});
  ASSERT_EQ(got.size(), 3u);
  EXPECT_DOUBLE_EQ(got[0], 1.0 / 3);
  EXPECT_DOUBLE_EQ(got[1], 1.0 / 6);
  EXPECT_DOUBLE_EQ(got[2], 0.5);
  // A replica with no time, or no sample (two microbatches, three replicas).
  EXPECT_EQ(measuredShares(cut, 0, {1.0, 0.0}), V{});
  EXPECT_EQ(measuredShares(slicesOf({5, 5}), 0, {1.0, 1.0, 1.0}), V{});
  EXPECT_EQ(measuredShares(cut, 0, {1.0, std::nan("")}), V{});
}

// Several steps: each replica's median, scaled to sum to 1; one stretched step (the
// second) moves nothing.
TEST(MicrobatchTest, MedianSharesIgnoreAStepThatAQuotaStretched) {
  using V = std::vector<double>;
  EXPECT_EQ(medianShares({{0.8, 0.2}}), (V{0.8, 0.2}));
  V got = medianShares({{0.8, 0.2}, {0.5, 0.5}, {0.8, 0.2}});
  EXPECT_DOUBLE_EQ(got[0], 0.8);
  EXPECT_DOUBLE_EQ(got[1], 0.2);
  // Even counts: the middle two's mean; medians of 0.7 and 0.2 scaled to 7/9 and 2/9.
  got = medianShares({{0.6, 0.1}, {0.8, 0.3}});
  EXPECT_DOUBLE_EQ(got[0], 0.7 / 0.9);
  EXPECT_DOUBLE_EQ(got[1], 0.2 / 0.9);
  testing::expectThrowWith<InvalidArgument>(
      [] {
        medianShares({{0.5, 0.5}, {1.0}});
      },
      {"measured shares for 1 and 2 replicas"});
  testing::expectThrowWith<InvalidArgument>([] { medianShares({}); }, {"no step"});
}
}  // namespace
}  // namespace tandem
