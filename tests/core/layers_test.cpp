// Finite-difference gradient checks of the single layers (tests/core/grad_check.h says
// how), and what else a layer promises: shapes refused, cost facts, the split backward,
// attention against its definition; batch norms and blocks in block_layers_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>

#include "backends/composed_conv.h"
#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/layers/conv2d.h"
#include "core/layers/registry.h"
#include "core/model.h"
#include "core/model_spec.h"
#include "tests/core/grad_check.h"
#include "tests/forwarding_backend.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::awayFromZero;
using testing::distinctValues;
using testing::GradCheck;

TEST(LayerGradTest, Linear) {
  GradCheck g("linear: {out: 7}", {3, 13});
  g.run(testing::randomVector(1, 3 * 13));
}

TEST(LayerGradTest, LinearOnSequences) {
  GradCheck g("linear: {out: 5, bias: false}", {2, 3, 4});
  g.run(testing::randomVector(2, 24));
  EXPECT_EQ(g.layer().outputShape(), (Shape{3, 5}));
}

// The batched weight gradient's group: its partials [group, OC, K] within the column
// buffer [K, chunk * OH*OW], at most the chunk, and at least two samples or none.
TEST(LayerGradTest, ConvWeightGradGroupFitsTheColumnBufferAndNeedsTwoSamples) {
  Window2d first;  // the example CNN's first convolution: 784 pixels, 32 output channels
  first.channels = 1, first.height = first.width = 28, first.kernel_h = first.kernel_w = 3;
  first.pad_h = first.pad_w = 1;
  EXPECT_EQ(convColumnChunk(first, 32, 64), 41);
  EXPECT_EQ(convWeightGradGroup(first, 32, 41), 41);
  EXPECT_EQ(convWeightGradGroup(first, 32, 1), 0);  // one sample: one product
  Window2d deep;  // 7x7 pixels, 512 output channels: a sample's partial outgrows its columns
  deep.channels = 512, deep.height = deep.width = 7, deep.kernel_h = deep.kernel_w = 3;
  deep.pad_h = deep.pad_w = 1;
  EXPECT_EQ(convWeightGradGroup(deep, 512, 10), 0);  // 10 x 49 / 512: under two
  EXPECT_EQ(convWeightGradGroup(deep, 512, 21), 2);  // 21 x 49 / 512 = 2
  for (const int64_t chunk : {2, 5, 21, 100}) {
    const int64_t group = convWeightGradGroup(deep, 512, chunk);
    EXPECT_LE(group * 512, chunk * 49) << chunk;
    EXPECT_LE(group, chunk);
  }
}

// What a convolution says its scratch is (Layer::workspaceBytes, which the partitioner's
// memory model counts, whatever the device) bounds what its forward holds beyond its input
// and output: what a backend that composes convolution from im2col and gemm holds at most
// in any of its three ops (one sample's columns; a chunk's columns and channel-major
// output; or the batched weight gradient's columns and partials; no more past its chunk),
// and at least the CPU kernels' column tiles.
TEST(LayerGradTest, Conv2dScratchIsTheMostItsComposedOpsHold) {
  for (const int64_t batch : {1, 16, 600}) {
    for (const int threads : {1, 2}) {
      cpu::CpuBackend be(cpu::CpuOptions{threads});
      Model m(parseModelSpec(
          "input: [3, 12, 12]\nlayers:\n  - conv2d: {out: 8, kernel: 3, padding: 1}\n"));
      m.build(be, 1);
      const Tensor x = be.zeros({batch, 3, 12, 12});
      int64_t before = be.memoryUse().live;
      Stash stash;
      const Tensor y = m.forward(x, stash, ForwardContext{true, 0});
      const int64_t cpu_scratch = be.memoryUse().peak - before - y.numel() * 4;
      EXPECT_GT(cpu_scratch, 0);
      EXPECT_LE(cpu_scratch, m.layer(0).workspaceBytes(batch)) << "batch " << batch;
      // A backend that composes the ops holds the most of its three ops' scratch: the
      // forward's, or (batch 16: one product per sample) the batched weight gradient's.
      const auto* conv = static_cast<const Conv2d*>(&m.layer(0));
      int64_t most = 0;
      for (int op = 0; op < 3; ++op) {
        cpu::CpuBackend fresh(cpu::CpuOptions{threads});
        const Tensor x2 = fresh.zeros({batch, 3, 12, 12}), dy = fresh.zeros({batch, 8, 12, 12});
        const Tensor w = fresh.zeros({8, 3, 3, 3}), b = fresh.zeros({8});
        before = fresh.memoryUse().live;
        if (op == 0) backends::composedConv2d(fresh, "cpu", x2, w, b, conv->window(), dy);
        if (op == 1) backends::composedConv2dBackwardData(fresh, "cpu", dy, w, conv->window(), x2);
        if (op == 2)
          backends::composedConv2dBackwardWeight(fresh, "cpu", x2, dy, conv->window(), w, b);
        most = std::max(most, fresh.memoryUse().peak - before);
      }
      // The CPU backend rounds each of the (at most three) buffers up to 64 bytes.
      EXPECT_GE(most, m.layer(0).workspaceBytes(batch)) << "batch " << batch;
      EXPECT_LT(most, m.layer(0).workspaceBytes(batch) + 3 * 64) << "batch " << batch;
    }
  }
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(
      parseModelSpec("input: [3, 12, 12]\nlayers:\n  - conv2d: {out: 8, kernel: 3, padding: 1}\n"));
  m.build(be, 1);
  // 600 samples run in chunks: the scratch of a chunk, not of the batch.
  EXPECT_EQ(m.layer(0).workspaceBytes(600), m.layer(0).workspaceBytes(100000));
  EXPECT_LT(m.layer(0).workspaceBytes(600), 600 / 16 * m.layer(0).workspaceBytes(16));
}

TEST(LayerGradTest, Conv2dWithStrideAndPadding) {
  GradCheck g("conv2d: {out: 3, kernel: 3, stride: 2, padding: 1}", {2, 2, 7, 5});
  g.run(testing::randomVector(3, 2 * 2 * 7 * 5));
}

TEST(LayerGradTest, Conv2dRectangularKernelManySamples) {
  // Large enough planes that the batch runs in im2col chunks of 3, 3 and 1 samples.
  GradCheck g("conv2d: {out: 4, kernel: [3, 2], padding: [1, 0]}", {7, 8, 64, 65});
  g.run(testing::randomVector(4, 7 * 8 * 64 * 65));
}

TEST(LayerGradTest, GroupedAndDepthwiseConv2d) {
  GradCheck grouped("conv2d: {out: 6, kernel: 3, padding: 1, groups: 3}", {2, 6, 5, 4});
  grouped.run(testing::randomVector(15, 2 * 6 * 5 * 4));
  GradCheck depthwise("conv2d: {out: 4, kernel: 3, stride: 2, padding: 1, groups: 4, bias: false}",
                      {3, 4, 7, 6});
  depthwise.run(testing::randomVector(16, 3 * 4 * 7 * 6));
  GradCheck multiplier("conv2d: {out: 4, kernel: 1, groups: 2}", {1, 2, 3, 3});  // 2 out per in
  multiplier.run(testing::randomVector(17, 2 * 3 * 3));
}

// A convolution of G groups is one whose weight is zero outside its groups' blocks: the
// same output, input gradient and (inside the blocks) weight gradient, within rounding.
TEST(LayerTest, AGroupedConvolutionIsABlockDiagonalOne) {
  cpu::CpuBackend be(cpu::CpuOptions{2});
  const int64_t n = 3, c = 6, oc = 9, groups = 3, cg = c / groups, og = oc / groups;
  Model grouped(
      parseModelSpec("input: [6, 5, 7]\nlayers: [{conv2d: {out: 9, kernel: 3, "
                     "stride: [1, 2], padding: 1, groups: 3}}]\n"));
  Model whole(parseModelSpec(
      "input: [6, 5, 7]\nlayers: [{conv2d: {out: 9, kernel: 3, stride: [1, 2], padding: 1}}]\n"));
  grouped.build(be, 4);
  whole.build(be, 5);
  const std::vector<float> wg = toHost(grouped.params()[0]->value);  // [9, 2, 3, 3]
  std::vector<float> w(static_cast<size_t>(oc * c * 9), 0.0f);
  for (int64_t o = 0; o < oc; ++o)
    for (int64_t i = 0; i < cg; ++i)
      for (int64_t k = 0; k < 9; ++k)
        w[static_cast<size_t>((o * c + (o / og) * cg + i) * 9 + k)] =
            wg[static_cast<size_t>((o * cg + i) * 9 + k)];
  be.upload(whole.params()[0]->value, w.data());
  be.copy(grouped.params()[1]->value, whole.params()[1]->value);
  const Tensor x = toDevice(be, {n, c, 5, 7}, testing::randomVector(18, n * c * 35));
  Stash sg, sw;
  const Tensor yg = grouped.forward(x, sg, ForwardContext{true, 0});
  const Tensor yw = whole.forward(x, sw, ForwardContext{true, 0});
  ASSERT_EQ(yg.shape(), yw.shape());
  const std::vector<float> a = toHost(yg), b = toHost(yw);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5f) << i;
  const Tensor dy = toDevice(be, yg.shape(), testing::randomVector(19, yg.numel()));
  const std::vector<float> dxg = toHost(grouped.backward(dy, sg, true));
  const std::vector<float> dxw = toHost(whole.backward(dy, sw, true));
  for (size_t i = 0; i < dxg.size(); ++i) ASSERT_NEAR(dxg[i], dxw[i], 1e-5f) << i;
  const std::vector<float> dwg = toHost(grouped.params()[0]->grad);
  const std::vector<float> dww = toHost(whole.params()[0]->grad);
  for (int64_t o = 0; o < oc; ++o)
    for (int64_t i = 0; i < cg; ++i)
      for (int64_t k = 0; k < 9; ++k)
        ASSERT_NEAR(dwg[static_cast<size_t>((o * cg + i) * 9 + k)],
                    dww[static_cast<size_t>((o * c + (o / og) * cg + i) * 9 + k)], 1e-4f);
  const std::vector<float> dbg = toHost(grouped.params()[1]->grad);
  const std::vector<float> dbw = toHost(whole.params()[1]->grad);
  for (size_t i = 0; i < dbg.size(); ++i) ASSERT_NEAR(dbg[i], dbw[i], 1e-4f);
  // Groups that do not divide the channels are refused, named.
  EXPECT_THROW(Model(parseModelSpec("input: [6, 5, 7]\nlayers: [{conv2d: {out: 8, kernel: 1, "
                                    "groups: 3}}]\n")),
               InvalidArgument);
  testing::expectThrowWith<InvalidArgument>(
      [] {
        Model(
            parseModelSpec("input: [5, 5, 7]\nlayers: [{conv2d: {out: 6, kernel: 1, "
                           "groups: 3}}]\n"));
      },
      {"'groups' 3 must divide the input's 5 channels"});
}

TEST(LayerGradTest, MaxPool) {
  GradCheck g("maxpool2d: {kernel: 3, stride: 2, padding: 1}", {2, 2, 7, 7});
  g.run(distinctValues(5, 2 * 2 * 7 * 7));
}

TEST(LayerGradTest, AvgPool) {
  GradCheck g("avgpool2d: {kernel: 2}", {2, 3, 7, 6});
  g.run(testing::randomVector(6, 2 * 3 * 7 * 6));
}

TEST(LayerGradTest, GlobalAvgPool) {
  GradCheck g("globalavgpool", {2, 3, 5, 7});
  g.run(testing::randomVector(7, 2 * 3 * 5 * 7));
}

TEST(LayerGradTest, Activations) {
  for (const char* kind : {"relu", "gelu", "tanh", "sigmoid", "silu"}) {
    SCOPED_TRACE(kind);
    GradCheck g(kind, {3, 13});
    g.run(awayFromZero(8, 39));
  }
}

// Away from their bounds (-3, 0, 3 and 6), where the derivative jumps.
TEST(LayerGradTest, HardActivations) {
  std::vector<float> x = testing::randomVector(14, 3 * 13, -8, 8);
  for (float& v : x)
    for (const float bound : {-3.0f, 0.0f, 3.0f, 6.0f})
      if (std::abs(v - bound) < 0.1f) v = bound + (v < bound ? -0.25f : 0.25f);
  for (const char* kind : {"relu6", "hardsigmoid", "hardswish"}) {
    SCOPED_TRACE(kind);
    GradCheck g(kind, {3, 13});
    g.run(x);
  }
}

TEST(LayerGradTest, FlattenAndDropout) {
  GradCheck f("flatten", {2, 3, 2, 2});
  f.run(testing::randomVector(9, 24));
  EXPECT_EQ(f.layer().outputShape(), (Shape{12}));
  GradCheck d("dropout: {p: 0.3}", {4, 31});  // the mask is fixed by the context's seed
  d.run(testing::randomVector(10, 124));
}

TEST(LayerGradTest, LayerNorm) {
  GradCheck g("layernorm", {3, 13});
  // Perturb gamma and beta away from 1 and 0 so their gradients are exercised generally.
  for (Param* p : g.layer().params())
    g.backend().upload(p->value, testing::randomVector(11, 13, 0.5f, 1.5f).data());
  g.run(testing::randomVector(12, 39, -2, 2));
}

TEST(LayerGradTest, RmsNorm) {
  GradCheck g("rmsnorm: {eps: 1e-5}", {3, 13});
  g.backend().upload(g.layer().params().at(0)->value,
                     testing::randomVector(11, 13, 0.5f, 1.5f).data());
  g.run(testing::randomVector(12, 39, -2, 2));
}

TEST(LayerGradTest, SwiGluOnSequences) {
  GradCheck g("swiglu: {hidden: 7}", {2, 3, 5});
  g.run(testing::randomVector(13, 30, -2, 2));
  EXPECT_EQ(g.layer().outputShape(), (Shape{3, 5}));
  EXPECT_EQ(g.layer().paramCount(), 3 * 5 * 7);
}

TEST(LayerGradTest, EmbeddingTable) {
  GradCheck g("embedding: {vocab: 11, dim: 4}", {2, 3});
  // Ids as floats cannot be perturbed; check the table only.
  Stash stash;
  auto& be = g.backend();
  Tensor ids = toDeviceI32(be, {2, 3}, {1, 4, 1, 10, 0, 4});
  Param* table = g.layer().params().at(0);
  be.fill(table->grad, 0.0f);
  Tensor y = g.layer().forward(ids, stash, {});
  const auto w = testing::randomVector(13, y.numel());
  EXPECT_FALSE(g.layer().backward(toDevice(be, y.shape(), w), stash, true).defined());
  const auto grad = toHost(table->grad);
  const int32_t id_list[] = {1, 4, 1, 10, 0, 4};
  std::vector<double> want(44, 0.0);
  for (int p = 0; p < 6; ++p)
    for (int j = 0; j < 4; ++j) want[id_list[p] * 4 + j] += w[p * 4 + j];
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(grad[i], want[i], 1e-6);
}

TEST(LayerGradTest, CausalAttention) {
  GradCheck g("attention: {heads: 2}", {2, 5, 8});
  g.run(testing::randomVector(17, 80));
}

TEST(LayerGradTest, AttentionWithoutMaskOneHead) {
  GradCheck g("attention: {heads: 1, causal: false}", {2, 4, 6});
  g.run(testing::randomVector(18, 48));
}

TEST(LayerGradTest, PositionalEmbedding) {
  GradCheck g("positional: {context: 6}", {2, 4, 3});
  g.run(testing::randomVector(19, 24));
}

TEST(LayerGradTest, TransformerBlock) {
  GradCheck g("transformer: {heads: 2, mlp: 12}", {2, 4, 8});
  // Every parameter away from its initial 1 / 0 so layer norm's gradients are general.
  for (Param* p : g.layer().params())
    if (p->name.find("gamma") != std::string::npos || p->name.find("beta") != std::string::npos)
      g.backend().upload(p->value, testing::randomVector(20, 8, 0.5f, 1.5f).data());
  g.run(testing::randomVector(21, 64, -2, 2));
  EXPECT_EQ(g.layer().params().size(), 12u);  // 2 norms, qkv, out, 2 MLP linears: w + b each
}

TEST(LayerGradTest, GroupedRotaryAttention) {
  for (const char* spec : {"attention: {heads: 4, kv_heads: 2, rope_theta: 100}",
                           "attention: {heads: 2, kv_heads: 1, qkv_bias: false, out_bias: false, "
                           "rope_theta: 50, rope_scaling: llama3, rope_factor: 4, "
                           "rope_original_context: 3}"}) {
    SCOPED_TRACE(spec);
    GradCheck g(spec, {2, 5, 8});
    g.run(testing::randomVector(23, 80, -2, 2));
  }
}

TEST(LayerGradTest, LlamaBlock) {
  GradCheck g("llama: {heads: 2, kv_heads: 1, mlp: 12, rope_theta: 10000}", {2, 4, 8});
  for (Param* p : g.layer().params())
    if (p->name.find("gamma") != std::string::npos)
      g.backend().upload(p->value, testing::randomVector(20, 8, 0.5f, 1.5f).data());
  g.run(testing::randomVector(21, 64, -2, 2));
  EXPECT_EQ(g.layer().params().size(), 7u);  // 2 norms, qkv, out, gate, up, down
}

// Attention's forward against a plain reference written from the definition (PyTorch's
// layout: in_proj rows are Q, K, V; head h owns columns [h*hs, (h+1)*hs) of each), in
// double, with the causal mask applied as -inf before the softmax.
TEST(LayerTest, AttentionComputesCausalMultiHeadAttention) {
  const int64_t batch = 2, t = 5, d = 6, heads = 3, hs = 2;
  cpu::CpuBackend be;
  auto layer =
      makeLayer(parseModelSpec("input: [1]\nlayers: [{attention: {heads: 3}}]\n").layers[0]);
  layer->setup({t, d});
  Rng rng(5);
  layer->build(be, rng);
  const auto w_qkv = toHost(layer->params()[0]->value), b_qkv = toHost(layer->params()[1]->value);
  const auto w_out = toHost(layer->params()[2]->value), b_out = toHost(layer->params()[3]->value);
  const auto x = testing::randomVector(22, batch * t * d, -2, 2);
  Stash stash;
  const auto y = toHost(layer->forward(toDevice(be, {batch, t, d}, x), stash, {}));
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<double> qkv(t * 3 * d), merged(t * d);
    for (int64_t i = 0; i < t; ++i)
      for (int64_t o = 0; o < 3 * d; ++o) {
        double acc = b_qkv[o];
        for (int64_t k = 0; k < d; ++k) acc += w_qkv[o * d + k] * double(x[(b * t + i) * d + k]);
        qkv[i * 3 * d + o] = acc;
      }
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> score(t, -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < hs; ++e)
            dot += qkv[i * 3 * d + h * hs + e] * qkv[j * 3 * d + d + h * hs + e];
          score[j] = dot / std::sqrt(double(hs));
          mx = std::max(mx, score[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(score[j] - mx);
        for (int64_t e = 0; e < hs; ++e) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j)
            acc += std::exp(score[j] - mx) / sum * qkv[j * 3 * d + 2 * d + h * hs + e];
          merged[i * d + h * hs + e] = acc;
        }
      }
    for (int64_t i = 0; i < t; ++i)
      for (int64_t o = 0; o < d; ++o) {
        double want = b_out[o];
        for (int64_t k = 0; k < d; ++k) want += w_out[o * d + k] * merged[i * d + k];
        EXPECT_NEAR(y[(b * t + i) * d + o], want, 1e-5) << "sample " << b << " token " << i;
      }
  }
}

// Token i of a causal block's output depends on tokens 0..i only: changing the last
// token changes the last output row and leaves every other row bitwise alone.
TEST(LayerTest, ATransformerBlockNeverLooksAhead) {
  cpu::CpuBackend be;
  auto layer =
      makeLayer(parseModelSpec("input: [1]\nlayers: [{transformer: {heads: 2}}]\n").layers[0]);
  const int64_t t = 6, d = 8;
  layer->setup({t, d});
  Rng rng(6);
  layer->build(be, rng);
  auto x = testing::randomVector(23, t * d);
  Stash s1, s2;
  const auto y1 = toHost(layer->forward(toDevice(be, {1, t, d}, x), s1, {}));
  for (int64_t k = 0; k < d; ++k) x[(t - 1) * d + k] += 0.5f;
  const auto y2 = toHost(layer->forward(toDevice(be, {1, t, d}, x), s2, {}));
  for (int64_t i = 0; i < (t - 1) * d; ++i) ASSERT_EQ(y1[i], y2[i]) << "element " << i;
  bool last_changed = false;
  for (int64_t i = (t - 1) * d; i < t * d; ++i) last_changed |= y1[i] != y2[i];
  EXPECT_TRUE(last_changed);
}

TEST(LayerTest, TransformerLayersRefuseShapesTheyCannotTake) {
  auto setup = [](const std::string& yaml, const Shape& in) {
    auto l = makeLayer(parseModelSpec("input: [1]\nlayers:\n  - " + yaml + "\n").layers.at(0));
    l->setup(in);
  };
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        setup("attention: {heads: 3}", {4, 8});
      },
      {"3 heads do not divide the width 8"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        setup("transformer: {heads: 5}", {4, 8});
      },
      {"5 heads do not divide the width 8"});
  testing::expectThrowWith<InvalidArgument>([&] { setup("attention: {heads: 2}", {8}); },
                                            {"expected input [T, width]"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        setup("positional: {context: 4}", {5, 8});
      },
      {"a sequence of 5 is longer than the context 4"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        setup("attention: {heads: 0}", {4, 8});
      },
      {"'heads' must be positive"});
}

TEST(LayerTest, BackwardComputesInputGradientsOnlyWhenSomethingNeedsThem) {
  cpu::CpuBackend be;
  Model m(parseModelSpec(
      "input: [2, 3]\nlayers: [flatten, {linear: {out: 4}}, relu, {linear: {out: 2}}]\n"));
  m.build(be, 1);
  const Tensor x = toDevice(be, {5, 2, 3}, testing::randomVector(1, 30));
  for (bool need_dx : {false, true}) {
    m.zeroGrad();
    Stash stash;
    const Tensor y = m.forward(x, stash, {});
    const Tensor dx =
        m.backward(toDevice(be, y.shape(), testing::randomVector(2, 10)), stash, need_dx);
    EXPECT_EQ(dx.defined(), need_dx);
    if (need_dx) {
      EXPECT_EQ(dx.shape(), x.shape());
    }
    // The first linear layer's weight gradient is computed either way.
    EXPECT_NE(be.dot(m.param("1.weight").grad, m.param("1.weight").grad), 0.0);
  }
}

// The two halves a pipeline stage runs (input gradient, then weight gradients) give
// bitwise what one backward gives, for every layer kind: the example models, the test
// net and residual blocks with both kinds of projection.
TEST(LayerTest, SplitBackwardEqualsBackwardBitwise) {
  const std::string models = std::string(TANDEM_SOURCE_DIR) + "/examples/models/";
  const std::vector<ModelSpec> specs = {
      loadModelSpec(models + "mlp.yaml"),
      loadModelSpec(models + "cnn.yaml"),
      loadModelSpec(models + "resnet-mini.yaml"),
      parseModelSpec(testing::kTinyNet),
      parseModelSpec("input: [5]\nlayers: [{residual: {layers: [{linear: {out: 3}}, sigmoid]}}, "
                     "{linear: {out: 2}}]\n"),
      parseModelSpec("input: [3, 4, 4]\nlayers: [{conv2d: {out: 4, kernel: 3, padding: 1}}, "
                     "{gate: {layers: [globalavgpool, {linear: {out: 2}}, relu, "
                     "{linear: {out: 4}}, hardsigmoid]}}, flatten, {linear: {out: 2}}]\n"),
      parseModelSpec("input: [2, 5, 5]\nlayers: [{maxpool2d: {kernel: 2, ceil: true}}, "
                     "{concat: {layers: [{conv2d: {out: 2, kernel: 1}}, {chain: {layers: "
                     "[{conv2d: {out: 3, kernel: 3, padding: 1}}, relu]}}]}}, flatten, "
                     "{linear: {out: 2}}]\n"),
      parseModelSpec("input: [2, 4, 4]\nlayers: [{conv2d: {out: 3, kernel: 3}}, batchnorm, relu, "
                     "flatten, batchnorm, {linear: {out: 2}}]\n"),
      parseModelSpec(
          "input: [4, 8]\nlayers: [{positional: {context: 4}}, {transformer: {heads: 2}},"
          " layernorm, {linear: {out: 5}}]\n")};
  for (const ModelSpec& spec : specs) {
    cpu::CpuBackend be;
    Model whole(spec), split(spec);
    whole.build(be, 4);
    split.build(be, 4);
    const Shape xs = whole.inputShape().withBatch(3);
    const Tensor x = toDevice(be, xs, testing::randomVector(5, xs.numel()));
    const ForwardContext ctx{true, 9};
    Stash a, b;
    const Tensor ya = whole.forward(x, a, ctx), yb = split.forward(x, b, ctx);
    const Tensor dy = toDevice(be, ya.shape(), testing::randomVector(6, ya.shape().numel()));
    // Twice, so accumulation onto existing gradients is covered too.
    for (int round = 0; round < 2; ++round) {
      Stash sa = a, sb = b;
      const Tensor dxa = whole.backward(dy, sa, true);
      const Tensor dxb = split.backwardInput(dy, sb);
      split.backwardWeights(sb);
      ASSERT_EQ(toHost(dxa), toHost(dxb)) << whole.spec().name;
      for (const Param* p : whole.params()) {
        if (!p->grad.defined()) continue;  // (running statistics)
        ASSERT_EQ(toHost(p->grad), toHost(split.param(p->name).grad))
            << whole.spec().name << " " << p->name;
      }
    }
  }
}

// The first stage (no input gradient wanted) splits its backward as it runs it whole: the
// layers below the first with weights run no backward, and that one none for its input —
// the same gradients, bitwise, and the same GEMMs, one fewer than with the input gradient.
TEST(LayerTest, AFirstStagesSplitBackwardSkipsTheInputGradientAsTheWholeOneDoes) {
  const std::vector<std::string> specs = {
      "input: [2, 3, 3]\nlayers: [flatten, {linear: {out: 6}}, relu, {linear: {out: 3}}]\n",
      "input: [2, 4, 4]\nlayers: [{maxpool2d: {kernel: 2}}, flatten, {linear: {out: 5}}, "
      "sigmoid, {linear: {out: 2}}]\n",
      "input: [7]\nlayers: [{linear: {out: 4}}, relu, {linear: {out: 2}}]\n"};
  for (const std::string& text : specs) {
    const ModelSpec spec = parseModelSpec(text);
    cpu::CpuBackend inner;
    testing::ForwardingBackend be(inner);
    int gemms = 0;
    be.beforeOp([&](Op op, int64_t) { gemms += op == Op::kGemm ? 1 : 0; });
    Model whole(spec), split(spec);
    whole.build(be, 4);
    split.build(be, 4);
    const Shape xs = whole.inputShape().withBatch(3);
    const Tensor x = toDevice(be, xs, testing::randomVector(5, xs.numel()));
    Stash a, b;
    const Tensor y = whole.forward(x, a, {true, 9});
    split.forward(x, b, {true, 9});
    const Tensor dy = toDevice(be, y.shape(), testing::randomVector(6, y.shape().numel()));
    Stash with_dx = a;
    gemms = 0;
    whole.backward(dy, with_dx, true);
    const int with_input = gemms;
    whole.zeroGrad();
    gemms = 0;
    EXPECT_FALSE(whole.backward(dy, a, false).defined());
    const int whole_gemms = gemms;
    gemms = 0;
    EXPECT_FALSE(split.backwardInput(dy, b, 0, split.size(), false).defined());
    split.backwardWeights(b, 0, split.size(), {}, true);
    EXPECT_EQ(gemms, whole_gemms) << text;
    EXPECT_EQ(whole_gemms, with_input - 1) << text;
    for (const Param* p : whole.params())
      ASSERT_EQ(toHost(p->grad), toHost(split.param(p->name).grad)) << text << " " << p->name;
  }
}

TEST(LayerTest, CostFactsOfKnownLayers) {
  auto facts = [](const std::string& yaml, const Shape& in) {
    auto l = makeLayer(parseModelSpec("input: [1]\nlayers:\n  - " + yaml + "\n").layers.at(0));
    l->setup(in);
    return std::tuple{l->paramCount(), l->flops(), l->outputShape()};
  };
  EXPECT_EQ(facts("linear: {out: 10}", {784}),
            std::tuple(int64_t{7850}, int64_t{2 * 784 * 10 + 10}, Shape{10}));
  EXPECT_EQ(facts("conv2d: {out: 8, kernel: 3}", {3, 10, 10}),
            std::tuple(int64_t{8 * 27 + 8}, int64_t{64 * 8 * (2 * 27 + 1)}, Shape{8, 8, 8}));
  EXPECT_EQ(facts("maxpool2d: {kernel: 2}", {4, 9, 9}),
            std::tuple(int64_t{0}, int64_t{4 * 16 * 4}, Shape{4, 4, 4}));
  EXPECT_EQ(std::get<0>(facts("embedding: {vocab: 100, dim: 8}", {5})), 800);
  EXPECT_EQ(std::get<0>(facts("layernorm", {3, 16})), 32);
  EXPECT_EQ(facts("attention: {heads: 4}", {10, 16}),
            std::tuple(int64_t{4 * 16 * 16 + 4 * 16},
                       int64_t{2 * 10 * 16 * 64 + 4 * 10 * 16 + 4 * 10 * 10 * 16 + 5 * 4 * 10 * 10},
                       Shape{10, 16}));
  // A block: two norms (2 * 2D), attention (4D^2 + 4D), MLP D -> 32 -> D.
  EXPECT_EQ(std::get<0>(facts("transformer: {heads: 2, mlp: 32}", {10, 16})),
            4 * 16 + 4 * 16 * 16 + 4 * 16 + (16 * 32 + 32) + (32 * 16 + 16));
}

TEST(LayerTest, SameSeedGivesBitwiseSameWeights) {
  const ModelSpec spec = loadModelSpec(TANDEM_SOURCE_DIR "/examples/models/resnet-mini.yaml");
  cpu::CpuBackend be;
  Model a(spec), b(spec), c(spec);
  a.build(be, 42);
  b.build(be, 42);
  c.build(be, 43);
  bool any_differs = false;
  for (size_t i = 0; i < a.params().size(); ++i) {
    EXPECT_EQ(toHost(a.params()[i]->value), toHost(b.params()[i]->value)) << a.params()[i]->name;
    any_differs |= toHost(a.params()[i]->value) != toHost(c.params()[i]->value);
  }
  EXPECT_TRUE(any_differs);
}

}  // namespace
}  // namespace tandem
