// Finite-difference gradient checks and contracts of the layers that hold state or other
// layers: batch norms (training on batch statistics, running statistics), residual blocks
// and their projections, gates and concatenated branches (tests/core/grad_check.h).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/layers/gate.h"
#include "core/layers/registry.h"
#include "core/layers/residual.h"
#include "core/model.h"
#include "core/model_spec.h"
#include "tests/core/grad_check.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::awayFromZero;
using testing::GradCheck;

// Train mode: the gradients run through the batch's mean and variance too; over the
// channels of images and over features.
TEST(LayerGradTest, BatchNorm) {
  for (const Shape& input : {Shape{3, 4, 3, 2}, Shape{5, 6}}) {
    GradCheck g("batchnorm: {eps: 1e-3}", input);
    const int64_t c = input[1];
    g.backend().upload(g.layer().params().at(0)->value,
                       testing::randomVector(11, c, 0.5f, 1.5f).data());
    g.backend().upload(g.layer().params().at(1)->value, testing::randomVector(13, c).data());
    g.run(testing::randomVector(12, input.numel(), -2, 2));
  }
}

// Training moves the running statistics by the momentum (the variance unbiased), a
// recomputed forward leaves them, inference normalises with them, and a batch with one
// value per channel cannot train.
TEST(LayerTest, BatchNormKeepsRunningStatistics) {
  cpu::CpuBackend be;
  auto layer = makeLayer(
      parseModelSpec("input: [1]\nlayers: [{batchnorm: {momentum: 0.25}}]\n").layers.at(0));
  layer->setup(Shape{2});
  Rng rng(1);
  layer->build(be, rng);
  // Channel 0: 1, 3, 8 (mean 4, unbiased variance 13); channel 1: -2, -2, 4 (0, 12).
  const Tensor x = toDevice(be, {3, 2}, {1, -2, 3, -2, 8, 4});
  Stash stash;
  layer->forward(x, stash, ForwardContext{true, 1});
  const std::vector<Param*> ps = layer->params();
  ASSERT_EQ(ps.size(), 4u);
  EXPECT_EQ(ps[2]->name, "running_mean");
  EXPECT_FALSE(ps[2]->grad.defined());
  EXPECT_FALSE(ps[3]->grad.defined());
  const auto mean = toHost(ps[2]->value), var = toHost(ps[3]->value);
  EXPECT_NEAR(mean[0], 0.25 * 4, 1e-6);
  EXPECT_NEAR(mean[1], 0.0, 1e-6);
  EXPECT_NEAR(var[0], 0.75 + 0.25 * 13, 1e-5);
  EXPECT_NEAR(var[1], 0.75 + 0.25 * 12, 1e-5);
  layer->forward(x, stash, ForwardContext{true, 1, true});
  EXPECT_EQ(toHost(ps[2]->value), mean);
  EXPECT_EQ(toHost(ps[3]->value), var);
  Stash none;
  const auto y = toHost(layer->forward(x, none, ForwardContext{false, 0}));
  EXPECT_NEAR(y[0], (1 - mean[0]) / std::sqrt(var[0] + 1e-5), 1e-5);
  EXPECT_NEAR(y[5], (4 - mean[1]) / std::sqrt(var[1] + 1e-5), 1e-5);
  EXPECT_THROW(layer->backward(toDevice(be, {3, 2}, {1, 1, 1, 1, 1, 1}), none, true),
               InvalidArgument);
  Stash one;
  EXPECT_THROW(layer->forward(toDevice(be, {1, 2}, {1, 2}), one, ForwardContext{true, 1}),
               InvalidArgument);
  EXPECT_THROW(
      makeLayer(parseModelSpec("input: [1]\nlayers: [{batchnorm: {momentum: 2}}]\n").layers.at(0)),
      InvalidArgument);
}

TEST(LayerGradTest, ResidualIdentity) {
  GradCheck g("residual: {layers: [{linear: {out: 6}}, tanh, {linear: {out: 6}}]}", {3, 6});
  g.run(testing::randomVector(14, 18));
}

TEST(LayerGradTest, ResidualWithConvProjection) {
  GradCheck g("residual: {layers: [{conv2d: {out: 4, kernel: 3, stride: 2, padding: 1}}, tanh]}",
              {2, 2, 6, 6});
  g.run(testing::randomVector(15, 2 * 2 * 6 * 6));
  EXPECT_EQ(g.layer().params().size(), 3u);  // conv weight + bias + projection weight
}

// With a bias, as ResNet's downsample (a batch norm folded into its 1x1 convolution).
TEST(LayerGradTest, ResidualWithBiasedProjections) {
  GradCheck conv(
      "residual: {proj_bias: true, layers: [{conv2d: {out: 4, kernel: 3, stride: 2, "
      "padding: 1}}]}",
      {2, 2, 6, 6});
  conv.run(testing::randomVector(20, 2 * 2 * 6 * 6));
  ASSERT_EQ(conv.layer().params().size(), 4u);  // conv weight and bias, proj weight and bias
  EXPECT_EQ(conv.layer().params()[3]->name, "proj.bias");
  EXPECT_EQ(conv.layer().paramCount(), 4 * 2 * 9 + 4 + 4 * 2 + 4);
  GradCheck linear("residual: {proj_bias: true, layers: [{linear: {out: 3}}]}", {2, 5});
  linear.run(testing::randomVector(21, 2 * 5));
  EXPECT_EQ(linear.layer().params().size(), 4u);
}

// A shortcut projection's stride: the smallest that maps the input's pixels to the
// body's, odd sizes too (torchvision's resnet18 on 28x28 images: 7 -> 4); none for a
// growth or a size no stride gives.
TEST(LayerTest, AProjectionTakesTheStrideThatMapsOddSizes) {
  EXPECT_EQ(projectionStride(8, 4), 2);
  EXPECT_EQ(projectionStride(7, 4), 2);
  EXPECT_EQ(projectionStride(10, 3), 4);
  EXPECT_EQ(projectionStride(5, 5), 1);
  EXPECT_EQ(projectionStride(2, 1), 2);
  EXPECT_EQ(projectionStride(4, 3), 0);
  EXPECT_EQ(projectionStride(3, 4), 0);
  EXPECT_EQ(projectionStride(int64_t{1} << 30, 1), int64_t{1} << 30);
  auto layer = makeLayer(parseModelSpec("input: [1]\nlayers: [{residual: {layers: [{conv2d: "
                                        "{out: 4, kernel: 3, stride: 2, padding: 1}}]}}]\n")
                             .layers.at(0));
  EXPECT_EQ(layer->setup(Shape{2, 7, 7}), (Shape{4, 4, 4}));
  const Model resnet18(loadModelSpec(TANDEM_SOURCE_DIR "/examples/models/resnet18.yaml"));
  EXPECT_EQ(resnet18.paramCount(), 11175370);
  // torchvision's mobilenet_v2 with the same stem and classes holds 2,236,106 too.
  const Model mobilenet(loadModelSpec(TANDEM_SOURCE_DIR "/examples/models/mobilenet_v2.yaml"));
  EXPECT_EQ(mobilenet.paramCount(), 2236106);
  EXPECT_EQ(mobilenet.outputShape(), (Shape{10}));
}

// ResNet's downsample as it trains: the projection, then a batch norm on the batch's
// statistics; its parameters after the projection's, its spec written back.
TEST(LayerGradTest, ResidualWithNormalisedProjections) {
  GradCheck conv(
      "residual: {proj_norm: true, proj_eps: 0.001, layers: [{conv2d: {out: 4, kernel: 3, "
      "stride: 2, padding: 1}}]}",
      {3, 2, 6, 6});
  // A batch norm's output does not change with its input's scale, so the curvature in the
  // projection's weights grows as they shrink: weights of magnitude >= 1 keep the finite
  // differences within their tolerance.
  std::vector<float> w = awayFromZero(27, 4 * 2);
  for (float& v : w) v *= 3.0f;
  conv.backend().upload(conv.layer().params().at(2)->value, w.data());
  conv.run(testing::randomVector(22, 3 * 2 * 6 * 6));
  const std::vector<Param*> ps = conv.layer().params();
  ASSERT_EQ(ps.size(), 7u);  // conv weight and bias, proj weight, norm's four
  EXPECT_EQ(ps[2]->name, "proj.0.weight");
  EXPECT_EQ(ps[6]->name, "proj.1.running_var");
  const LayerSpec spec = conv.layer().spec();
  EXPECT_EQ(std::get<double>(spec.attrs.at("proj_eps")), double{0.001f});
  EXPECT_EQ(std::get<double>(spec.attrs.at("proj_momentum")), double{0.1f});
  GradCheck linear("residual: {proj_norm: true, proj_bias: true, layers: [{linear: {out: 3}}]}",
                   {4, 5});
  std::vector<float> v = awayFromZero(28, 3 * 5);
  for (float& x : v) x *= 3.0f;
  linear.backend().upload(linear.layer().params().at(2)->value, v.data());
  linear.run(testing::randomVector(23, 4 * 5));
  EXPECT_EQ(linear.layer().params().size(), 8u);
  EXPECT_THROW(makeLayer(parseModelSpec("input: [1]\nlayers: [{residual: {proj_eps: 0.1, layers: "
                                        "[relu]}}]\n")
                             .layers.at(0)),
               InvalidArgument);
}

// Squeeze-and-excitation: the body's channel values scale the input's channels (a smooth
// bottleneck, so finite differences never straddle a kink); and an element-wise gate.
TEST(LayerGradTest, GatePerChannelAndElementwise) {
  GradCheck se(
      "gate: {layers: [globalavgpool, {linear: {out: 2}}, silu, {linear: {out: 4}}, sigmoid]}",
      {2, 4, 3, 3});
  se.run(testing::randomVector(22, 2 * 4 * 3 * 3));
  EXPECT_TRUE(dynamic_cast<const Gate&>(se.layer()).perChannel());
  EXPECT_EQ(se.layer().outputShape(), (Shape{4, 3, 3}));
  ASSERT_EQ(se.layer().params().size(), 4u);
  EXPECT_EQ(se.layer().params()[0]->name, "body.1.weight");
  GradCheck each("gate: {layers: [{linear: {out: 6}}, tanh]}", {3, 6});
  each.run(testing::randomVector(23, 3 * 6));
  EXPECT_FALSE(dynamic_cast<const Gate&>(each.layer()).perChannel());
}

// A body whose output is neither the input's shape nor one value per channel.
TEST(LayerTest, GateRefusesABodyOfAnotherShape) {
  for (const char* body : {"[flatten]", "[globalavgpool, {linear: {out: 3}}]"}) {
    SCOPED_TRACE(body);
    auto gate = makeLayer(
        parseModelSpec("input: [1]\nlayers:\n  - gate: {layers: " + std::string(body) + "}\n")
            .layers.at(0));
    try {
      gate->setup(Shape{4, 3, 3});
      FAIL() << "accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("gate: the body maps [4, 3, 3]"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(
      makeLayer(parseModelSpec("input: [1]\nlayers: [{gate: {layers: []}}]\n").layers.at(0)),
      Error);
}

// Branches joined along channels (a fire module's 1x1 and 3x3 expansions) and features.
TEST(LayerGradTest, ConcatOfBranches) {
  GradCheck fire(
      "concat: {layers: [{conv2d: {out: 2, kernel: 1}}, {chain: {layers: [{conv2d: {out: 3, "
      "kernel: 3, padding: 1}}, tanh]}}]}",
      {2, 2, 4, 4});
  fire.run(testing::randomVector(24, 2 * 2 * 4 * 4));
  EXPECT_EQ(fire.layer().outputShape(), (Shape{5, 4, 4}));
  ASSERT_EQ(fire.layer().params().size(), 4u);
  EXPECT_EQ(fire.layer().params()[2]->name, "1.0.weight");
  GradCheck features(
      "concat: {layers: [{linear: {out: 2}}, {chain: {layers: [{linear: {out: 3}}, sigmoid]}}, "
      "tanh]}",
      {3, 4});
  features.run(testing::randomVector(25, 3 * 4));
  EXPECT_EQ(features.layer().outputShape(), (Shape{9}));
  // A DenseNet layer: its input passed on (identity) with new channels appended; the
  // input's gradient is the identity's share plus the branch's.
  GradCheck dense(
      "concat: {layers: [identity, {chain: {layers: [batchnorm, tanh, {conv2d: {out: 2, "
      "kernel: 3, padding: 1}}]}}]}",
      {2, 3, 4, 4});
  dense.run(testing::randomVector(26, 2 * 3 * 4 * 4));
  EXPECT_EQ(dense.layer().outputShape(), (Shape{5, 4, 4}));
  EXPECT_EQ(dense.layer().params()[0]->name, "1.0.weight");
}

// ShuffleNet's rearrangements: a slice of the channels (its input gradient zero outside
// them) and the channel shuffle (a permutation; its backward the inverse one), on [C, H, W]
// and [D] samples.
TEST(LayerGradTest, ChannelSliceAndShuffle) {
  GradCheck slice("slice: {begin: 1, end: 4}", {2, 5, 2, 3});
  slice.run(testing::randomVector(27, 2 * 5 * 2 * 3));
  EXPECT_EQ(slice.layer().outputShape(), (Shape{3, 2, 3}));
  GradCheck features("slice: {begin: 0, end: 2}", {3, 7});
  features.run(testing::randomVector(28, 3 * 7));
  GradCheck shuffle("channel_shuffle: {groups: 3}", {2, 6, 2, 2});
  shuffle.run(testing::randomVector(29, 2 * 6 * 2 * 2));
  EXPECT_EQ(shuffle.layer().outputShape(), (Shape{6, 2, 2}));
  GradCheck flat("channel_shuffle: {groups: 2}", {3, 4});
  flat.run(testing::randomVector(30, 3 * 4));
}

// The values themselves: output channel k * G + g is input channel g * K + k; a slice is
// its channels; each sample of a batch alike.
TEST(LayerTest, ChannelShuffleAndSliceMoveTheRightChannels) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  const auto run = [&](const std::string& yaml, const Shape& input) {
    auto layer = makeLayer(parseModelSpec("input: [1]\nlayers:\n  - " + yaml + "\n").layers.at(0));
    layer->setup(input.dropFirst());
    Rng rng(1);
    layer->build(be, rng);
    std::vector<float> x(static_cast<size_t>(input.numel()));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
    Stash stash;
    return toHost(layer->forward(toDevice(be, input, x), stash, ForwardContext{}));
  };
  // Two samples of 6 channels of 2 values: channel c holds 2c, 2c + 1 (+ 12 in sample 1);
  // the output's channels are the input's in `order`.
  const auto channels = [](std::initializer_list<int> order) {
    std::vector<float> v;
    for (const int sample : {0, 1})
      for (const int c : order)
        for (const int i : {0, 1}) v.push_back(static_cast<float>(12 * sample + 2 * c + i));
    return v;
  };
  EXPECT_EQ(run("channel_shuffle: {groups: 2}", {2, 6, 1, 2}), channels({0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(run("channel_shuffle: {groups: 3}", {2, 6, 1, 2}), channels({0, 2, 4, 1, 3, 5}));
  EXPECT_EQ(run("channel_shuffle: {groups: 1}", {1, 4, 2}),
            (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(run("slice: {begin: 1, end: 3}", {2, 4, 2}),
            (std::vector<float>{2, 3, 4, 5, 10, 11, 12, 13}));
}

TEST(LayerTest, ChannelSliceAndShuffleRefuseWhatTheirInputCannotGive) {
  auto layer = [](const std::string& yaml) {
    return makeLayer(parseModelSpec("input: [1]\nlayers:\n  - " + yaml + "\n").layers.at(0));
  };
  testing::expectThrowWith<InvalidArgument>([&] { layer("slice: {begin: 2, end: 2}"); },
                                            {"slice: channels [2, 2)", "non-empty range"});
  testing::expectThrowWith<InvalidArgument>([&] { layer("slice: {begin: -1, end: 2}"); },
                                            {"slice: channels [-1, 2)"});
  testing::expectThrowWith<InvalidArgument>([&] { layer("slice: {begin: 0}"); }, {"'end'"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        layer("slice: {begin: 2, end: 6}")->setup({4, 3});
      },
      {"slice: channels [2, 6) of an input [4, 3] of 4"});
  testing::expectThrowWith<InvalidArgument>([&] { layer("channel_shuffle: {groups: 0}"); },
                                            {"'groups' is 0"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        layer("channel_shuffle: {groups: 4}")->setup({6, 2, 2});
      },
      {"channel_shuffle: 4 groups do not divide the 6 channels of [6, 2, 2]"});
}

TEST(LayerTest, ConcatRefusesBranchesThatDoNotMeet) {
  auto layer = [](const std::string& yaml) {
    return makeLayer(parseModelSpec("input: [1]\nlayers:\n  - " + yaml + "\n").layers.at(0));
  };
  auto two =
      layer("concat: {layers: [{conv2d: {out: 2, kernel: 1}}, {conv2d: {out: 2, kernel: 3}}]}");
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        two->setup(Shape{2, 4, 4});
      },
      {"concat: branch 1 gives [2, 2, 2], branch 0 [2, 4, 4]", "past the first dimension"});
  testing::expectThrowWith<InvalidArgument>([&] { layer("concat: {layers: [relu]}"); },
                                            {"concat: 'layers' must list two or more"});
  testing::expectThrowWith<InvalidArgument>([&] { layer("avgpool2d: {kernel: 2, ceil: true}"); },
                                            {"'ceil' is for maxpool2d only"});
}

TEST(LayerGradTest, ResidualWithLinearProjection) {
  GradCheck g("residual: {layers: [{linear: {out: 3}}, sigmoid]}", {2, 5});
  g.run(testing::randomVector(16, 10));
}

}  // namespace
}  // namespace tandem
