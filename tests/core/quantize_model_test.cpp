// int8 weights in models (issue: models people bring, item 4): a quantized model computes
// what the f32 model of its dequantized weights computes, near the original's; it decodes
// with its cache what its forward gives; its file round-trips bitwise and holds about a
// quarter of the bytes; dequantizing gives the f32 spec back; training and bad specs are
// refused by name.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/generate.h"
#include "core/layers/registry.h"
#include "core/model.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "core/quantize_model.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::expectThrowWith;

// GPT-2 and Llama blocks, a plain linear layer inside a residual block, and the head.
constexpr const char* kMixed = R"(name: mixed
input: [12]
layers:
  - embedding: {vocab: 256, dim: 64}
  - positional: {context: 12}
  - transformer: {heads: 4, mlp: 128}
  - llama: {heads: 4, kv_heads: 2, mlp: 96, rope_theta: 10000}
  - residual: {layers: [{rmsnorm: {}}, {linear: {out: 64}}]}
  - rmsnorm
  - linear: {out: 256, bias: false}
)";

ModelFile fileOf(Model& m) { return parseModelFile(serializeModel(m, nullptr, {}), "test"); }

std::vector<float> logits(Model& m, const std::vector<int32_t>& ids) {
  Stash stash;
  const auto batch = static_cast<int64_t>(ids.size()) / 12;
  return toHost(m.forward(toDeviceI32(m.backend(), {batch, 12}, ids), stash, {false, 0}));
}

TEST(QuantizeModelTest, AnInt8ModelComputesItsDequantizedWeightsNearTheOriginal) {
  cpu::CpuBackend be(cpu::CpuOptions{2});
  Model f32(parseModelSpec(kMixed));
  f32.build(be, 5);
  const ModelFile original = fileOf(f32);
  for (int64_t group : {0, 32}) {
    SCOPED_TRACE("group " + std::to_string(group));
    const ModelFile q = quantizeModel(original, group, be);
    ASSERT_TRUE(hasInt8Weights(q.spec));
    auto int8 = loadModel(q, be);
    auto dequantized = loadModel(dequantizeModel(q), be);
    EXPECT_FALSE(hasInt8Weights(dequantizeModel(q).spec));
    // Every product quantized: attention (2), the GPT MLP (2), SwiGLU (3), the residual's
    // linear and the head, each with its scales; embeddings, norms and biases as they were.
    int i8 = 0;
    for (const Param* p : int8->params()) i8 += p->value.dtype() == DType::kI8;
    EXPECT_EQ(i8, 2 + 2 + 2 + 3 + 1 + 1);
    EXPECT_EQ(int8->params().size(), f32.params().size() + static_cast<size_t>(i8));
    const auto ids = testing::randomTokens(24, 7);
    const auto want = logits(*dequantized, ids), got = logits(*int8, ids), exact = logits(f32, ids);
    double worst = 0, drift = 0, scale = 0;
    for (size_t v = 0; v < want.size(); ++v) {
      worst = std::max(worst, std::abs(double{got[v]} - want[v]));
      drift = std::max(drift, std::abs(double{got[v]} - exact[v]));
      scale = std::max(scale, std::abs(double{exact[v]}));
    }
    EXPECT_LT(worst, 2e-4) << "int8 against its dequantized weights in f32";
    EXPECT_LT(drift, 0.05 * scale) << "int8 against the f32 model (largest logit " << scale << ")";
    EXPECT_GT(drift, 0) << "the weights were not quantized";
  }
}

TEST(QuantizeModelTest, TheFileRoundTripsBitwiseAtAQuarterOfTheBytes) {
  cpu::CpuBackend be;
  Model f32(parseModelSpec(kMixed));
  f32.build(be, 6);
  const ModelFile q = quantizeModel(fileOf(f32), 32, be);
  auto m = loadModel(q, be);
  const std::vector<uint8_t> bytes = serializeModel(*m, nullptr, {});
  auto again = loadModel(parseModelFile(bytes, "again"), be);
  EXPECT_EQ(serializeModel(*again, nullptr, {}), bytes);
  EXPECT_EQ(m->spec().layers.at(3).attrs.at("weights"), AttrValue(std::string("int8")));
  EXPECT_EQ(m->spec().layers.at(3).attrs.at("group"), AttrValue(int64_t{32}));
  // The products' weights dominate: a quarter of f32, plus a scale per 32 inputs, plus
  // the f32 embedding, norms and biases.
  const double ratio = static_cast<double>(m->paramBytes()) / static_cast<double>(f32.paramBytes());
  EXPECT_LT(ratio, 0.45);
  EXPECT_GT(ratio, 0.25);
  EXPECT_EQ(f32.paramBytes(), f32.paramCount() * 4);
  // A file whose weight is i8 where the model wants f32 (or the reverse) is refused.
  ModelFile wrong = q;
  wrong.spec = f32.spec();
  expectThrowWith<FormatError>([&] { loadModel(wrong, be); },
                               {"parameter '2.0.body.1.qkv.weight' is [192, 64] i8 in the file",
                                "[192, 64] f32 in the model"});
}

TEST(QuantizeModelTest, AnInt8ModelDecodesWhatItsForwardGives) {
  cpu::CpuBackend be(cpu::CpuOptions{2});
  Model f32(parseModelSpec(kMixed));
  f32.build(be, 8);
  auto m = loadModel(quantizeModel(fileOf(f32), 0, be), be);
  const SamplingOptions o{0.0f, 0, 9};
  const std::vector<int32_t> prompt = testing::randomTokens(3, 2);
  const Generation cached = generate(*m, prompt, 9, o, true);
  const Generation plain = generate(*m, prompt, 9, o, false);
  EXPECT_EQ(cached.tokens, plain.tokens);
  for (size_t i = 0; i < cached.logits.size(); ++i)
    testing::expectCloseLogits(cached.logits[i], plain.logits[i], "token " + std::to_string(i));
}

TEST(QuantizeModelTest, TrainingAndBadSpecsAreRefusedByName) {
  cpu::CpuBackend be;
  Model m(parseModelSpec("name: q\ninput: [8]\nlayers: [{linear: {out: 4, weights: int8}}]\n"));
  m.build(be, 1);
  EXPECT_EQ(m.layer(0).ops(false),
            (std::vector<OpUse>{{Op::kGemmQ8, DType::kI8}, {Op::kAddBias, DType::kF32}}));
  Stash stash;
  const Tensor x = toDevice(be, {2, 8}, testing::randomVector(1, 16));
  const Tensor y = m.forward(x, stash, {true, 0});
  expectThrowWith<Unsupported>([&] { m.backward(be.zeros(y.shape()), stash, true); },
                               {"linear holds int8 weights", "inference only", "tandem quantize"});
  expectThrowWith<InvalidArgument>(
      [] { Model(parseModelSpec("input: [8]\nlayers: [{linear: {out: 4, weights: int4}}]\n")); },
      {"weights", "must be one of f32, int8"});
  expectThrowWith<InvalidArgument>(
      [] {
        Model(
            parseModelSpec("input: [12]\nlayers: [{linear: {out: 4, weights: int8, group: 5}}]\n"));
      },
      {"linear", "group of 5 does not divide its 12 inputs"});
  expectThrowWith<InvalidArgument>(
      [] { Model(parseModelSpec("input: [8]\nlayers: [{linear: {out: 4, group: 4}}]\n")); },
      {"'group' applies to int8 weights only"});
  Model plain(parseModelSpec("name: p\ninput: [8]\nlayers: [{relu: {}}]\n"));
  plain.build(be, 1);
  expectThrowWith<InvalidArgument>([&] { quantizeModel(fileOf(plain), 0, be); },
                                   {"model 'p' has no layer that takes int8 weights"});
  expectThrowWith<InvalidArgument>([&] { quantizeModel(fileOf(m), 0, be); },
                                   {"model 'q' holds int8 weights already"});
}

}  // namespace
}  // namespace tandem
