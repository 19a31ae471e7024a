// Tensor-split linear pairs (core/layers/tensor_split.h) against the unsplit model, on the
// in-process group: even and uneven shares, 2 and 3 ranks, the CPU and every OpenCL device
// beside it; the shares' arithmetic; the refusals.
#include "core/layers/tensor_split.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "backends/opencl/devices.h"
#include "backends/registry.h"
#include "core/layers/linear.h"
#include "core/model.h"
#include "core/model_spec.h"
#include "core/optimizer.h"
#include "tests/test_util.h"
#include "transport/local_group.h"

namespace tandem {
namespace {

using testing::expectThrowWith;
using testing::randomVector;

// Two pairs ([0, 2] through relu, [4, 6] through sigmoid), a layer norm between them and a
// last linear with nothing to pair with; sizes that leave vector tails.
constexpr const char* kMlp = R"(name: split-mlp
input: [13]
layers:
  - {linear: {out: 127}}
  - relu
  - {linear: {out: 13}}
  - layernorm
  - {linear: {out: 7}}
  - sigmoid
  - {linear: {out: 9}}
  - {linear: {out: 3}}
)";
// One pair: its backward's incoming gradient is exact, so every parameter gradient is.
constexpr const char* kPair = R"(name: split-pair
input: [13]
layers: [{linear: {out: 127}}, gelu, {linear: {out: 7}}]
)";
// A pair of convolutions (output channels, then input channels) through relu and max
// pooling, then a linear left whole.
constexpr const char* kCnn = R"(name: split-cnn
input: [3, 9, 9]
layers:
  - {conv2d: {out: 13, kernel: 3, padding: 1}}
  - relu
  - {maxpool2d: {kernel: 2}}
  - {conv2d: {out: 7, kernel: 3}}
  - flatten
  - {linear: {out: 4}}
)";
constexpr int64_t kBatch = 5;
constexpr uint64_t kSeed = 4;

struct Pass {
  std::vector<float> y, dx;
  std::map<std::string, std::vector<float>> grads;
  std::map<std::string, std::vector<float>> params;  // after `steps` SGD steps
};

// Forward and backward of the whole batch (then `steps` SGD steps, each from a fresh
// forward and backward) on one rank; `split` makes it a rank of `group`.
Pass run(Backend& backend, Group* group, const std::vector<double>& shares, int steps = 0,
         const char* spec = kMlp) {
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
    const Tensor y = model.forward(toDevice(backend, xs, randomVector(1 + s, xs.numel())), stash,
                                   ForwardContext{true, 3});
    const Tensor dx =
        model.backward(toDevice(backend, ys, randomVector(2 + s, ys.numel())), stash, true);
    if (s == 0) {
      out.y = toHost(y);
      out.dx = toHost(dx);
      for (const Param* p : model.params()) out.grads[p->name] = toHost(p->grad);
    }
    if (s < steps) sgd.step(model.params());
  }
  for (const Param* p : model.params()) out.params[p->name] = toHost(p->value);
  return out;
}

std::vector<Pass> runSplit(const std::vector<std::string>& devices,
                           const std::vector<double>& shares, int steps = 0,
                           const char* spec = kMlp) {
  const auto ranks = static_cast<int>(devices.size());
  auto groups = transport::makeLocalGroup(ranks);
  std::vector<Pass> out(devices.size());
  testing::expectNoErrors(testing::onThreads(ranks, [&](int r) {
    auto backend = makeBackend(devices[static_cast<size_t>(r)]);
    out[static_cast<size_t>(r)] =
        run(*backend, groups[static_cast<size_t>(r)].get(), shares, steps, spec);
  }));
  return out;
}

// Rank r's slice of the whole layer's tensor [rows, cols]: rows [b, e) of a column layer's
// weight, columns [b, e) of a row layer's.
std::vector<float> sliceOf(const std::vector<float>& whole, int64_t cols, int64_t b, int64_t e,
                           bool by_rows) {
  std::vector<float> out;
  const int64_t rows = static_cast<int64_t>(whole.size()) / cols;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      if (by_rows ? (i >= b && i < e) : (j >= b && j < e))
        out.push_back(whole[static_cast<size_t>(i * cols + j)]);
  return out;
}

// Every rank's output and input gradient agree with the unsplit model's to rounding, and
// with each other's bitwise where the ranks' devices are alike (the layers after an
// all-reduce run on each rank's own device: to rounding across devices); each rank's
// gradients are its slices of the unsplit ones, to rounding (an all-reduce in forward
// regroups the sums every later layer sees).
void expectMatches(const std::vector<Pass>& split, const Pass& whole,
                   const std::vector<double>& shares, float tol, bool alike) {
  const std::vector<int64_t> hidden1 = shareBounds(127, shares, "layer 0");
  const std::vector<int64_t> hidden2 = shareBounds(7, shares, "layer 4");
  for (size_t r = 0; r < split.size(); ++r) {
    const Pass& p = split[r];
    const std::string rank = "rank " + std::to_string(r);
    testing::expectCloseAll(p.y, whole.y, tol, rank + " output");
    testing::expectCloseAll(p.dx, whole.dx, tol, rank + " input gradient");
    if (alike) {
      EXPECT_EQ(p.y, split[0].y) << rank;
      EXPECT_EQ(p.dx, split[0].dx) << rank;
    }
    const auto& g = p.grads;
    const auto& w = whole.grads;
    const int64_t b1 = hidden1[r], e1 = hidden1[r + 1], b2 = hidden2[r], e2 = hidden2[r + 1];
    testing::expectCloseAll(g.at("0.weight"), sliceOf(w.at("0.weight"), 13, b1, e1, true), tol,
                            rank);
    testing::expectCloseAll(g.at("0.bias"), sliceOf(w.at("0.bias"), 1, b1, e1, true), tol, rank);
    testing::expectCloseAll(g.at("2.weight"), sliceOf(w.at("2.weight"), 127, b1, e1, false), tol,
                            rank);
    testing::expectCloseAll(g.at("2.bias"), w.at("2.bias"), tol, rank);
    testing::expectCloseAll(g.at("3.gamma"), w.at("3.gamma"), tol, rank);
    testing::expectCloseAll(g.at("4.weight"), sliceOf(w.at("4.weight"), 13, b2, e2, true), tol,
                            rank);
    testing::expectCloseAll(g.at("4.bias"), sliceOf(w.at("4.bias"), 1, b2, e2, true), tol, rank);
    testing::expectCloseAll(g.at("6.weight"), sliceOf(w.at("6.weight"), 7, b2, e2, false), tol,
                            rank);
    testing::expectCloseAll(g.at("6.bias"), w.at("6.bias"), tol, rank);
    testing::expectCloseAll(g.at("7.weight"), w.at("7.weight"), tol, rank);
  }
}

TEST(TensorSplitTest, SharesAreWholeFeaturesInProportion) {
  EXPECT_EQ(shareBounds(8, {1, 3}, "l"), (std::vector<int64_t>{0, 2, 8}));
  EXPECT_EQ(shareBounds(7, {1, 2, 4}, "l"), (std::vector<int64_t>{0, 1, 3, 7}));
  EXPECT_EQ(shareBounds(10, {1, 1, 1}, "l"), (std::vector<int64_t>{0, 4, 7, 10}));
  EXPECT_EQ(shareBounds(3, {100, 1, 1}, "l"), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(shareBounds(127, {1}, "l"), (std::vector<int64_t>{0, 127}));
  EXPECT_EQ(shareBounds(13, {0.25, 0.75}, "l"), (std::vector<int64_t>{0, 3, 13}));
  expectThrowWith<InvalidArgument>(
      [] {
        shareBounds(3, {1, 1, 1, 1}, "layer 2 (linear)");
      },
      {"layer 2 (linear) has 3 features", "4 ranks"});
  expectThrowWith<InvalidArgument>(
      [] {
        shareBounds(8, {1, 0}, "l");
      },
      {"rank 1's share 0 is not positive"});
  expectThrowWith<InvalidArgument>([] { shareBounds(8, {}, "l"); }, {"no ranks"});
}

TEST(TensorSplitTest, PairsSplitAndTheRestStaysWhole) {
  Model model(parseModelSpec(kMlp));
  auto groups = transport::makeLocalGroup(2);
  const auto roles = model.splitForTensor(0, Model::kEnd, *groups[1], {1, 3});
  EXPECT_EQ(describe(Sequence(parseModelSpec(kMlp).layers), roles),
            "0 linear column, 1 relu slice, 2 linear row, 3 layernorm whole, 4 linear column, "
            "5 sigmoid slice, 6 linear row, 7 linear whole");
  // Rank 1 of 1:3 holds hidden features [32, 127) and [2, 7): shapes and costs follow.
  EXPECT_EQ(model.layer(0).outputShape(), Shape({95}));
  EXPECT_EQ(model.layer(1).outputShape(), Shape({95}));
  EXPECT_EQ(model.layer(2).outputShape(), Shape({13}));
  EXPECT_EQ(model.layer(4).outputShape(), Shape({5}));
  EXPECT_EQ(model.outputShape(), Shape({3}));
  EXPECT_EQ(model.layer(0).paramCount(), 95 * 13 + 95);
  EXPECT_EQ(model.layer(2).paramCount(), 13 * 95 + 13);
  EXPECT_EQ(model.layer(2).flops(), 2 * 95 * 13 + 13);
  EXPECT_EQ(model.layer(7).paramCount(), 3 * 9 + 3);

  // Convolutions by channels: rank 1 of 1 : 3 holds channels [3, 13) of 13.
  Model cnn(parseModelSpec(kCnn));
  const auto conv_roles = cnn.splitForTensor(0, Model::kEnd, *groups[1], {1, 3});
  EXPECT_EQ(describe(Sequence(parseModelSpec(kCnn).layers), conv_roles),
            "0 conv2d column, 1 relu slice, 2 maxpool2d slice, 3 conv2d row, 4 flatten whole, "
            "5 linear whole");
  EXPECT_EQ(cnn.layer(0).outputShape(), Shape({10, 9, 9}));
  EXPECT_EQ(cnn.layer(2).outputShape(), Shape({10, 4, 4}));
  EXPECT_EQ(cnn.layer(3).outputShape(), Shape({7, 2, 2}));
  EXPECT_EQ(cnn.layer(0).paramCount(), 10 * 27 + 10);
  EXPECT_EQ(cnn.layer(3).paramCount(), 7 * 10 * 9 + 7);
}

TEST(TensorSplitTest, SplitForwardAndBackwardEqualTheWholeOnCpu) {
  auto cpu = makeBackend("cpu");
  const Pass whole = run(*cpu, nullptr, {});
  for (const std::vector<double>& shares :
       std::vector<std::vector<double>>{{1, 1}, {1, 3}, {1, 2, 4}}) {
    SCOPED_TRACE(::testing::Message() << shares.size() << " ranks, first share " << shares[0]);
    const std::vector<std::string> devices(shares.size(), "cpu");
    expectMatches(runSplit(devices, shares), whole, shares, 1e-5f, true);
  }
}

// One pair on the CPU: the column part's forward is bitwise the whole layer's columns (no
// sum regrouped), so every parameter gradient is bitwise the whole one's slice; the output
// and the input gradient (each an all-reduce) to rounding.
TEST(TensorSplitTest, OnePairsGradientsAreBitwiseTheWholeOnes) {
  auto cpu = makeBackend("cpu");
  const Pass whole = run(*cpu, nullptr, {}, 0, kPair);
  for (const std::vector<double>& shares :
       std::vector<std::vector<double>>{{1, 1}, {1, 3}, {1, 2, 4}}) {
    const std::vector<std::string> devices(shares.size(), "cpu");
    const std::vector<Pass> split = runSplit(devices, shares, 0, kPair);
    const std::vector<int64_t> h = shareBounds(127, shares, "layer 0");
    for (size_t r = 0; r < split.size(); ++r) {
      const auto& g = split[r].grads;
      const auto& w = whole.grads;
      SCOPED_TRACE(::testing::Message() << "rank " << r << " of " << shares.size());
      testing::expectCloseAll(split[r].y, whole.y, 1e-5f, "output");
      testing::expectCloseAll(split[r].dx, whole.dx, 1e-5f, "input gradient");
      EXPECT_EQ(g.at("0.weight"), sliceOf(w.at("0.weight"), 13, h[r], h[r + 1], true));
      EXPECT_EQ(g.at("0.bias"), sliceOf(w.at("0.bias"), 1, h[r], h[r + 1], true));
      EXPECT_EQ(g.at("2.weight"), sliceOf(w.at("2.weight"), 127, h[r], h[r + 1], false));
      EXPECT_EQ(g.at("2.bias"), w.at("2.bias"));
    }
  }
}

// One layer shared by a CPU and an OpenCL device (each device the machine has), 3 : 1.
TEST(TensorSplitTest, ACpuAndAnOpenClDeviceShareOneLayer) {
  auto cpu = makeBackend("cpu");
  const Pass whole = run(*cpu, nullptr, {});
  std::vector<std::vector<std::string>> pairs{{"cpu", "cpu"}};
  for (const auto& d : opencl::listClDevices()) pairs.push_back({"cpu", d.label()});
  for (const auto& devices : pairs) {
    SCOPED_TRACE(devices[1]);
    expectMatches(runSplit(devices, {3, 1}), whole, {3, 1}, 1e-4f, false);
  }
}

// Three SGD steps: every rank's parameters stay the slices of the unsplit model's, to
// rounding, and the replicated ones (biases of row layers, the rest) agree across ranks.
TEST(TensorSplitTest, TrainingStepsFollowTheWholeModel) {
  auto cpu = makeBackend("cpu");
  const Pass whole = run(*cpu, nullptr, {}, 3);
  const std::vector<double> shares{2, 1, 1};
  const std::vector<Pass> split = runSplit({"cpu", "cpu", "cpu"}, shares, 3);
  const std::vector<int64_t> hidden = shareBounds(127, shares, "layer 0");
  for (size_t r = 0; r < split.size(); ++r) {
    const auto& p = split[r].params;
    const auto& w = whole.params;
    testing::expectCloseAll(p.at("0.weight"),
                            sliceOf(w.at("0.weight"), 13, hidden[r], hidden[r + 1], true), 1e-5f,
                            "0.weight");
    testing::expectCloseAll(p.at("2.weight"),
                            sliceOf(w.at("2.weight"), 127, hidden[r], hidden[r + 1], false), 1e-5f,
                            "2.weight");
    for (const char* name : {"2.bias", "3.gamma", "6.bias", "7.weight", "7.bias"}) {
      testing::expectCloseAll(p.at(name), w.at(name), 1e-5f, name);
      EXPECT_EQ(p.at(name), split[0].params.at(name)) << name << " rank " << r;
    }
  }
}

// Convolutions split by channels, 2 and 3 ranks, on the CPU and with a CPU rank beside each
// OpenCL device: outputs and gradients the whole model's to rounding, the convolutions'
// biases' gradients bitwise on CPU ranks (their incoming gradients come through the whole
// linear from the exact loss gradient).
TEST(TensorSplitTest, ConvolutionsSplitByChannels) {
  auto cpu = makeBackend("cpu");
  const Pass whole = run(*cpu, nullptr, {}, 0, kCnn);
  const auto& w = whole.grads;
  std::vector<std::vector<std::string>> cases{{"cpu", "cpu"}, {"cpu", "cpu", "cpu"}};
  for (const auto& d : opencl::listClDevices()) cases.push_back({"cpu", d.label()});
  for (const auto& devices : cases) {
    const bool alike = devices.back() == "cpu";
    const std::vector<double> shares =
        devices.size() == 3 ? std::vector<double>{1, 2, 4} : std::vector<double>{1, 3};
    const std::vector<Pass> split = runSplit(devices, shares, 0, kCnn);
    const std::vector<int64_t> h = shareBounds(13, shares, "layer 0");
    const float tol = alike ? 1e-5f : 1e-4f;
    for (size_t r = 0; r < split.size(); ++r) {
      SCOPED_TRACE(::testing::Message()
                   << "rank " << r << " of " << devices.size() << " (" << devices[r] << ")");
      const auto& g = split[r].grads;
      testing::expectCloseAll(split[r].y, whole.y, tol, "output");
      testing::expectCloseAll(split[r].dx, whole.dx, tol, "input gradient");
      testing::expectCloseAll(g.at("5.weight"), w.at("5.weight"), tol, "5.weight");
      const std::vector<float> w0 = sliceOf(w.at("0.weight"), 27, h[r], h[r + 1], true);
      const std::vector<float> b0 = sliceOf(w.at("0.bias"), 1, h[r], h[r + 1], true);
      // [7, 13 * 9] by input channels: each channel a run of 9 in a row.
      const std::vector<float> w3 = sliceOf(w.at("3.weight"), 117, h[r] * 9, h[r + 1] * 9, false);
      if (!alike) {
        testing::expectCloseAll(g.at("0.weight"), w0, tol, "0.weight");
        testing::expectCloseAll(g.at("3.weight"), w3, tol, "3.weight");
        continue;
      }
      // The CPU's weight-gradient kernels block by channels, so to rounding; the biases'
      // sums do not depend on them.
      testing::expectCloseAll(g.at("0.weight"), w0, tol, "0.weight");
      testing::expectCloseAll(g.at("3.weight"), w3, tol, "3.weight");
      EXPECT_EQ(g.at("0.bias"), b0);
      EXPECT_EQ(g.at("3.bias"), w.at("3.bias"));
    }
  }
}

TEST(TensorSplitTest, RefusesWhatItCannotSplit) {
  auto groups = transport::makeLocalGroup(4);
  auto eight = transport::makeLocalGroup(8);
  expectThrowWith<InvalidArgument>(
      [&] {
        Model m(parseModelSpec(kMlp));
        m.splitForTensor(0, Model::kEnd, *eight[0], std::vector<double>(8, 1.0));
      },
      {"layer 4 (linear) has 7 features", "fewer than the 8 ranks"});
  expectThrowWith<InvalidArgument>(
      [&] {
        Model m(
            parseModelSpec("name: n\ninput: [4]\nlayers: [{linear: {out: 8}}, layernorm, "
                           "{linear: {out: 2}}]\n"));
        m.splitForTensor(0, Model::kEnd, *groups[0], {1, 1, 1, 1});
      },
      {"layers [0, 3) hold no pair of linear layers"});
  expectThrowWith<InvalidArgument>(
      [&] {
        Model m(parseModelSpec(kMlp));
        m.splitForTensor(0, Model::kEnd, *groups[0], {1, 1});
      },
      {"2 shares for a group of 4 ranks"});
  expectThrowWith<InvalidArgument>(
      [&] {
        Model m(
            parseModelSpec("name: n\ninput: [4]\nlayers: [{linear: {out: 8, weights: int8}}, "
                           "relu, {linear: {out: 2}}]\n"));
        m.splitForTensor(0, Model::kEnd, *groups[0], {1, 1, 1, 1});
      },
      {"hold no pair", "int8 weights and grouped convolutions do not split"});
  expectThrowWith<InvalidArgument>(
      [&] {
        Model m(
            parseModelSpec("name: n\ninput: [4, 5, 5]\nlayers: [{conv2d: {out: 8, kernel: 3, "
                           "groups: 2}}, relu, {conv2d: {out: 2, kernel: 3}}]\n"));
        m.splitForTensor(0, Model::kEnd, *groups[0], {1, 1, 1, 1});
      },
      {"hold no pair", "grouped convolutions do not split"});
  auto cpu = makeBackend("cpu");
  expectThrowWith<InvalidArgument>(
      [&] {
        Model m(parseModelSpec(kMlp));
        m.build(*cpu, 1);
        m.splitForTensor(0, Model::kEnd, *groups[0], {1, 1, 1, 1});
      },
      {"a tensor split comes before build"});
}

}  // namespace
}  // namespace tandem
