// Tensor-split attention (by key/value head groups), SwiGLU MLPs (by hidden features) and
// the transformer and llama blocks made of them (core/layers/tensor_split.h), against the
// unsplit model on the in-process group: outputs, gradients and SGD steps, even and uneven
// shares over 2 and 3 ranks; greedy generation on every rank at once, the same tokens as one
// process; the parts merged back into the whole model; the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>

#include "backends/opencl/devices.h"
#include "backends/registry.h"
#include "core/generate.h"
#include "core/layers/tensor_split.h"
#include "core/model.h"
#include "core/model_spec.h"
#include "core/optimizer.h"
#include "core/train/tensor_generate.h"
#include "core/train/tensor_parallel.h"
#include "tests/test_util.h"
#include "transport/local_group.h"

// Its own namespace: tensor_split_test.cpp has helpers of the same names (Pass, run,
// runSplit ...), and the tests' unity build may compile both as one source.
namespace tandem::split_blocks_test {
namespace {

using testing::expectThrowWith;
using testing::randomVector;

// Two GPT-2 blocks (4 heads of 6, MLPs of 40 and 52), the head left whole.
constexpr const char* kGpt = R"(name: split-gpt
input: [6]
layers:
  - embedding: {vocab: 256, dim: 24}
  - positional: {context: 6}
  - transformer: {heads: 4, mlp: 40}
  - transformer: {heads: 4, mlp: 52}
  - layernorm
  - linear: {out: 256}
)";
// Llama blocks: grouped-query attention (2 groups of 2 query heads) with rotary embedding,
// then multi-head attention with qkv biases; SwiGLU MLPs.
constexpr const char* kLlama = R"(name: split-llama
input: [5, 16]
layers:
  - llama: {heads: 4, kv_heads: 2, mlp: 24, rope_theta: 10000}
  - llama: {heads: 4, mlp: 20, rope_theta: 10000, qkv_bias: true}
)";
constexpr int64_t kBatch = 3;
constexpr uint64_t kSeed = 6;

struct Pass {
  std::vector<float> y, dx;
  std::map<std::string, std::vector<float>> grads, params;  // params: after the steps
  std::map<std::string, std::optional<ParamSlice>> slices;
  int64_t param_count = 0;
};

bool tokens(const Model& m) { return m.inputShape().rank() == 1; }

// Forward and backward of one batch, then `steps` SGD steps, on one rank of `group` (or
// the whole model with none).
Pass run(Backend& backend, Group* group, const std::vector<double>& shares, const char* spec,
         int steps = 0) {
  Model model(parseModelSpec(spec));
  if (group) model.splitForTensor(0, Model::kEnd, *group, shares);
  model.build(backend, kSeed);
  const Shape xs = model.inputShape().withBatch(kBatch);
  const Shape ys = model.outputShape().withBatch(kBatch);
  Optimizer sgd(backend, OptimizerOptions{});
  Pass out;
  for (int s = 0; s <= steps; ++s) {
    Stash stash;
    model.zeroGrad();
    const Tensor x = tokens(model)
                         ? toDeviceI32(backend, xs, testing::randomTokens(xs.numel(), 1 + s, 40))
                         : toDevice(backend, xs, randomVector(1 + s, xs.numel()));
    const Tensor y = model.forward(x, stash, ForwardContext{true, 3});
    const Tensor dy = toDevice(backend, ys, randomVector(2 + s, ys.numel()));
    const Tensor dx = model.backward(dy, stash, !tokens(model));
    if (s == 0) {
      out.y = toHost(y);
      if (!tokens(model)) out.dx = toHost(dx);
      for (const Param* p : model.params()) out.grads[p->name] = toHost(p->grad);
    }
    if (s < steps) sgd.step(model.params());
  }
  for (Param* p : model.params()) {
    out.params[p->name] = toHost(p->value);
    out.slices[p->name] = p->slice;
  }
  out.param_count = model.paramCount();
  return out;
}

std::vector<Pass> runSplit(const std::vector<double>& shares, const char* spec, int steps = 0,
                           std::vector<std::string> devices = {}) {
  const auto ranks = static_cast<int>(shares.size());
  if (devices.empty()) devices.assign(shares.size(), "cpu");
  auto groups = transport::makeLocalGroup(ranks);
  std::vector<Pass> out(shares.size());
  testing::expectNoErrors(testing::onThreads(ranks, [&](int r) {
    auto backend = makeBackend(devices[static_cast<size_t>(r)]);
    out[static_cast<size_t>(r)] =
        run(*backend, groups[static_cast<size_t>(r)].get(), shares, spec, steps);
  }));
  return out;
}

// Each rank's values of `got` are its slices (Param::slice) of the whole model's, or the
// whole where it holds none, to `tol`; the slices of all ranks cover every value once.
void expectSlicesOf(const std::vector<Pass>& split,
                    const std::map<std::string, std::vector<float>> Pass::*values,
                    const Pass& whole, float tol) {
  for (const auto& [name, want] : whole.*values) {
    std::vector<int> covered(want.size(), 0);
    for (size_t r = 0; r < split.size(); ++r) {
      const std::optional<ParamSlice>& slice = split[r].slices.at(name);
      const std::vector<float>& got = (split[r].*values).at(name);
      testing::expectCloseAll(got, slice ? takeSlice(want, *slice) : want, tol,
                              name + " on rank " + std::to_string(r));
      if (!slice) continue;
      std::vector<float> marks(want.size(), 0.0f);
      placeSlice(*slice, std::vector<float>(got.size(), 1.0f), marks);
      for (size_t i = 0; i < marks.size(); ++i) covered[i] += marks[i] > 0 ? 1 : 0;
    }
    if (split[0].slices.at(name)) {
      EXPECT_EQ(std::count(covered.begin(), covered.end(), 1),
                static_cast<std::ptrdiff_t>(covered.size()))
          << name << ": the ranks' slices do not cover the whole once";
    }
  }
}

void expectMatches(const std::vector<Pass>& split, const Pass& whole, float tol,
                   bool alike = true) {
  for (size_t r = 0; r < split.size(); ++r) {
    const std::string rank = "rank " + std::to_string(r);
    testing::expectCloseAll(split[r].y, whole.y, tol, rank + " output");
    testing::expectCloseAll(split[r].dx, whole.dx, tol, rank + " input gradient");
    if (alike) {
      EXPECT_EQ(split[r].y, split[0].y) << rank << ": alike ranks end with the same output";
    }
    EXPECT_LT(split[r].param_count, whole.param_count) << rank;
  }
  expectSlicesOf(split, &Pass::grads, whole, tol);
}

TEST(TensorSplitBlocksTest, TransformerBlocksSplitByHeadsAndHiddenFeatures) {
  auto cpu = makeBackend("cpu");
  const Pass whole = run(*cpu, nullptr, {}, kGpt);
  for (const std::vector<double>& shares :
       std::vector<std::vector<double>>{{1, 1}, {1, 3}, {1, 2, 1}}) {
    SCOPED_TRACE(::testing::Message() << shares.size() << " ranks, first share " << shares[0]);
    const std::vector<Pass> split = runSplit(shares, kGpt);
    expectMatches(split, whole, 1e-5f);
    // 1 : 3 over 4 heads: one head on rank 0 (its 6 query rows, 6 key rows, 6 value rows).
    if (shares == std::vector<double>{1, 3}) {
      EXPECT_EQ(split[0].params.at("2.0.body.1.qkv.weight").size(), 18u * 24u);
    }
  }
}

// A CPU and each OpenCL device the machine has sharing the blocks 3 : 1.
TEST(TensorSplitBlocksTest, ACpuAndAnOpenClDeviceShareTheBlocks) {
  auto cpu = makeBackend("cpu");
  for (const char* spec : {kGpt, kLlama}) {
    const Pass whole = run(*cpu, nullptr, {}, spec);
    for (const auto& d : opencl::listClDevices()) {
      SCOPED_TRACE(d.label());
      expectMatches(runSplit({3, 1}, spec, 0, {"cpu", d.label()}), whole, 1e-4f, false);
    }
  }
}

TEST(TensorSplitBlocksTest, LlamaBlocksSplitByKeyValueGroups) {
  auto cpu = makeBackend("cpu");
  const Pass whole = run(*cpu, nullptr, {}, kLlama);
  for (const std::vector<double>& shares : std::vector<std::vector<double>>{{1, 1}, {1, 3}}) {
    SCOPED_TRACE(::testing::Message() << "first share " << shares[0]);
    expectMatches(runSplit(shares, kLlama), whole, 1e-5f);
  }
}

// Three SGD steps: every rank's parameters stay its slices of the whole model's.
TEST(TensorSplitBlocksTest, TrainingStepsFollowTheWholeModel) {
  auto cpu = makeBackend("cpu");
  for (const char* spec : {kGpt, kLlama}) {
    const Pass whole = run(*cpu, nullptr, {}, spec, 3);
    // (kLlama's first block has 2 key/value groups: 2 ranks at most.)
    const std::vector<Pass> split =
        runSplit(spec == kGpt ? std::vector<double>{2, 1, 1} : std::vector<double>{2, 1}, spec, 3);
    expectSlicesOf(split, &Pass::params, whole, 1e-5f);
    for (const auto& [name, values] : split[1].params)
      if (!split[1].slices.at(name)) {
        EXPECT_EQ(values, split[0].params.at(name)) << name;
      }
  }
}

// Generation run by every rank at once (TensorParallelGenerator: the whole model's weights
// copied into the ranks' parts) picks the same tokens as one process, greedy and sampled,
// for several prompts.
TEST(TensorSplitBlocksTest, GenerationOnEveryRankMatchesOneProcess) {
  auto cpu = makeBackend("cpu");
  Model whole(parseModelSpec(testing::kTinyGpt));
  whole.build(*cpu, 11);  // not the ranks' build seed: their weights come from it
  const std::vector<std::vector<int32_t>> prompts = {
      testing::randomTokens(3, 1), testing::randomTokens(1, 2), testing::randomTokens(5, 3)};
  SamplingOptions sampled;
  sampled.temperature = 0.8f;
  sampled.top_k = 20;
  // 1 : 1 and 3 : 1 on the CPU, and a CPU rank beside each OpenCL device (whose logits
  // differ from the CPU's by rounding: rank 0's choices are what both feed back).
  std::vector<std::pair<std::vector<double>, std::string>> cases{{{1, 1}, "cpu"}, {{3, 1}, "cpu"}};
  for (const auto& d : opencl::listClDevices()) cases.push_back({{1, 1}, d.label()});
  for (const auto& [shares, second] : cases) {
    SCOPED_TRACE(second);
    auto groups = transport::makeLocalGroup(2);
    std::vector<std::unique_ptr<Backend>> backends;
    backends.push_back(makeBackend("cpu"));
    backends.push_back(makeBackend(second));
    TensorParallelGenerator ranks(whole, {backends[0].get(), backends[1].get()},
                                  {groups[0].get(), groups[1].get()}, shares);
    EXPECT_EQ(describe(Sequence(parseModelSpec(testing::kTinyGpt).layers), ranks.roles()),
              "0 embedding whole, 1 positional whole, 2 transformer split, 3 layernorm whole, "
              "4 linear whole");
    for (const auto& prompt : prompts) {
      const int64_t count = 8 - static_cast<int64_t>(prompt.size());
      for (const SamplingOptions& o : {SamplingOptions{}, sampled}) {
        const Generation want = generate(whole, prompt, count, o);
        std::vector<int32_t> heard;
        const Generation got =
            ranks.generate(prompt, count, o, true, [&](int32_t t) { heard.push_back(t); });
        EXPECT_EQ(got.tokens, want.tokens);
        EXPECT_EQ(heard, want.tokens);
        for (size_t i = 0; i < want.logits.size(); ++i)
          testing::expectCloseAll(got.logits[i], want.logits[i], second == "cpu" ? 1e-5f : 1e-4f,
                                  "logits");
      }
    }
  }
}

// Tensor-parallel training of a GPT over 2 ranks (1 : 3) against one device: the losses
// agree, and the merged model and optimizer state are the whole one's. (SGD with momentum:
// the key biases' true gradient is zero — softmax ignores what is added to a whole row of
// scores — so their computed gradients are rounding noise, which Adam scales up to steps
// of the learning rate, differently for the split and the whole model.)
TEST(TensorSplitBlocksTest, TensorParallelTrainerMergesSplitBlocksBack) {
  const Dataset data = testing::phrases(24, 6, 3);
  const TrainOptions options{4, 3, true};
  OptimizerOptions sgd;
  sgd.lr = 0.05f;
  auto cpu = makeBackend("cpu");
  Model whole(parseModelSpec(kGpt));
  whole.build(*cpu, options.seed);
  Optimizer whole_opt(*cpu, sgd);
  Trainer trainer(whole, whole_opt, options);
  const EpochReport want = trainer.trainEpoch(data, 0, {});

  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(makeBackend("cpu"));
  backends.push_back(makeBackend("cpu"));
  auto groups = transport::makeLocalGroup(2);
  TensorParallelTrainer tp(parseModelSpec(kGpt), {backends[0].get(), backends[1].get()},
                           {groups[0].get(), groups[1].get()}, {1, 3}, sgd, options);
  EXPECT_EQ(describe(Sequence(parseModelSpec(kGpt).layers), tp.roles()),
            "0 embedding whole, 1 positional whole, 2 transformer split, 3 transformer split, "
            "4 layernorm whole, 5 linear whole");
  const EpochReport got = tp.trainEpoch(data, 0, {});
  EXPECT_NEAR(got.train_loss, want.train_loss, 1e-5 * (1 + want.train_loss));
  const TensorParts merged = tp.merged(*cpu);
  for (const Param* p : whole.params())
    testing::expectCloseAll(toHost(merged.model->param(p->name).value), toHost(p->value), 1e-4f,
                            p->name);
  std::map<std::string, Tensor> want_state;
  for (const auto& [name, t] : whole_opt.state()) want_state[name] = t;
  const auto state = merged.optimizer->state();
  ASSERT_EQ(state.size(), want_state.size());
  for (const auto& [name, t] : state)
    testing::expectCloseAll(toHost(t), toHost(want_state.at(name)), 1e-4f, name);
}

TEST(TensorSplitBlocksTest, RefusesWhatItCannotSplit) {
  auto three = transport::makeLocalGroup(3);
  // Two key/value groups cannot go to three ranks.
  expectThrowWith<InvalidArgument>(
      [&] {
        Model m(parseModelSpec(kLlama));
        m.splitForTensor(0, Model::kEnd, *three[0], {1, 1, 1});
      },
      {"attention (its 2 key/value head groups as features) has 2 features",
       "fewer than the 3 ranks"});
  // int8 blocks do not split, and nothing else is there to.
  expectThrowWith<InvalidArgument>(
      [&] {
        Model m(parseModelSpec(
            "name: q\ninput: [5, 16]\nlayers:\n  - llama: {heads: 4, mlp: 24, weights: int8}\n"));
        m.splitForTensor(0, Model::kEnd, *three[0], {1, 1, 1});
      },
      {"hold no pair", "int8 weights"});
  // A tensor part of a quantized attention is refused by the layer itself.
  Model q(
      parseModelSpec("name: q\ninput: [5, 16]\nlayers: [{attention: {heads: 4, weights: "
                     "int8}}]\n"));
  uint64_t tag = 0;
  expectThrowWith<InvalidArgument>(
      [&] {
        dynamic_cast<TensorSplitBlock&>(q.layer(0)).splitTensor(*three[0], {1, 1, 1}, tag);
      },
      {"int8 weights cannot be tensor-split"});
}

}  // namespace
}  // namespace tandem::split_blocks_test
