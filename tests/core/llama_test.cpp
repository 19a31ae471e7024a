// Llama's pieces (issue: models people bring): rotary frequencies as transformers computes
// them; attention with grouped key/value heads, rotary embedding and no biases against a
// reference written from Hugging Face's LlamaAttention in double; a model of llama blocks
// decodes (prefill, pieces, one token of many sequences) what its forward computes and
// generates with its cache what it generates without; bad specs named.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/generate.h"
#include "core/layers/attention.h"
#include "core/layers/registry.h"
#include "core/layers/rope.h"
#include "core/model.h"
#include "core/model_spec.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

std::unique_ptr<Layer> layerOf(const std::string& yaml) {
  return makeLayer(parseModelSpec("input: [1]\nlayers: [" + yaml + "]\n").layers.at(0));
}

TEST(RopeTest, FrequenciesAreTransformersDefaultLinearAndLlama3) {
  RopeSpec rope;
  rope.theta = 10000;
  const auto plain = ropeInverseFrequencies(rope, 8);
  ASSERT_EQ(plain.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(plain[i], std::pow(10000.0, -2.0 * i / 8), 1e-7);
  rope.scaling = "linear";
  rope.factor = 4;
  const auto linear = ropeInverseFrequencies(rope, 8);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(linear[i], plain[i] / 4);
  // llama3 with original context 64: wavelengths 2 pi / f; above 64 (low_freq_factor 1)
  // divided by 8, below 16 (high_freq_factor 4) kept, between blended.
  rope.scaling = "llama3";
  rope.factor = 8;
  rope.original_context = 64;
  rope.theta = 10000;
  const auto freq = ropeInverseFrequencies(rope, 16);
  const auto base = [](int i) { return std::pow(10000.0, -2.0 * i / 16); };
  int low = 0, high = 0, mid = 0;
  for (int i = 0; i < 8; ++i) {
    const double f = base(i), wavelen = 2 * M_PI / f;
    double want = f;
    if (wavelen > 64) {
      want = f / 8;
      ++low;
    } else if (wavelen >= 16) {
      const double smooth = (64 / wavelen - 1) / (4 - 1);
      want = (1 - smooth) * f / 8 + smooth * f;
      ++mid;
    } else {
      ++high;
    }
    EXPECT_NEAR(freq[i], want, 1e-6 * want) << "pair " << i;
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
  EXPECT_GT(high, 0);
}

// Hugging Face's LlamaAttention in double on the host, from the layer's own weights:
// q, k, v = x Wq^T, x Wk^T, x Wv^T (the fused rows Q, then K, then V), each head rotated by
// rotate_half at its position with the layer's frequencies, query head h attending with key
// and value head h / (H / K) under the causal mask, then the output projection.
std::vector<double> referenceAttention(Attention& a, const std::vector<float>& x, int64_t batch,
                                       int64_t t, int64_t d) {
  const int64_t h = a.heads(), kv = a.kvHeads(), hs = d / h, all = h + 2 * kv;
  const auto w_qkv = toHost(a.params()[0]->value);
  const auto w_out = toHost(a.params()[1]->value);
  const auto inv = ropeInverseFrequencies(a.rope(), hs);
  std::vector<double> y(static_cast<size_t>(batch * t * d));
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<double> qkv(static_cast<size_t>(t * all * hs));
    for (int64_t i = 0; i < t; ++i)
      for (int64_t o = 0; o < all * hs; ++o) {
        double acc = 0;
        for (int64_t k = 0; k < d; ++k) acc += w_qkv[o * d + k] * double(x[(b * t + i) * d + k]);
        qkv[i * all * hs + o] = acc;
      }
    for (int64_t i = 0; i < t; ++i)  // rotate queries and keys (heads [0, h + kv))
      for (int64_t head = 0; head < h + kv; ++head)
        for (int64_t e = 0; e < hs / 2; ++e) {
          const double angle = static_cast<float>(i) * inv[e];
          double* v = &qkv[i * all * hs + head * hs];
          const double x0 = v[e], x1 = v[e + hs / 2];
          v[e] = x0 * std::cos(angle) - x1 * std::sin(angle);
          v[e + hs / 2] = x1 * std::cos(angle) + x0 * std::sin(angle);
        }
    std::vector<double> merged(static_cast<size_t>(t * d));
    for (int64_t head = 0; head < h; ++head) {
      const int64_t g = head / (h / kv);
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> p(static_cast<size_t>(i + 1));
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < hs; ++e)
            dot += qkv[i * all * hs + head * hs + e] * qkv[j * all * hs + (h + g) * hs + e];
          p[j] = dot / std::sqrt(double(hs));
          mx = std::max(mx, p[j]);
        }
        for (double& v : p) sum += (v = std::exp(v - mx));
        for (int64_t e = 0; e < hs; ++e) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j)
            acc += p[j] / sum * qkv[j * all * hs + (h + kv + g) * hs + e];
          merged[i * d + head * hs + e] = acc;
        }
      }
    }
    for (int64_t i = 0; i < t; ++i)
      for (int64_t o = 0; o < d; ++o) {
        double acc = 0;
        for (int64_t k = 0; k < d; ++k) acc += w_out[o * d + k] * merged[i * d + k];
        y[(b * t + i) * d + o] = acc;
      }
  }
  return y;
}

TEST(LlamaTest, AttentionIsHuggingFacesGroupedRotaryAttention) {
  const int64_t batch = 2, t = 7, d = 16;
  for (const char* spec :
       {"{attention: {heads: 4, kv_heads: 2, qkv_bias: false, out_bias: false, rope_theta: 10000}}",
        "{attention: {heads: 4, kv_heads: 1, qkv_bias: false, out_bias: false, rope_theta: 500000, "
        "rope_scaling: llama3, rope_factor: 8, rope_original_context: 4}}",
        "{attention: {heads: 2, qkv_bias: false, out_bias: false, rope_theta: 100, rope_scaling: "
        "linear, rope_factor: 2}}"}) {
    SCOPED_TRACE(spec);
    cpu::CpuBackend be(cpu::CpuOptions{2});
    auto layer = layerOf(spec);
    layer->setup({t, d});
    Rng rng(5);
    layer->build(be, rng);
    auto& a = dynamic_cast<Attention&>(*layer);
    ASSERT_EQ(a.params().size(), 2u);  // no biases
    const auto x = testing::randomVector(22, batch * t * d, -2, 2);
    Stash stash;
    const auto y = toHost(layer->forward(toDevice(be, {batch, t, d}, x), stash, {}));
    const auto want = referenceAttention(a, x, batch, t, d);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(y[i], want[i], 2e-5) << "element " << i;
    const int64_t hs = d / a.heads();
    EXPECT_EQ(layer->paramCount(), (a.heads() + 2 * a.kvHeads()) * hs * d + d * d);
  }
}

constexpr const char* kLlama = R"(name: two-llama-blocks
input: [12]
layers:
  - embedding: {vocab: 256, dim: 16}
  - llama: {heads: 4, kv_heads: 2, mlp: 24, rope_theta: 10000}
  - llama: {heads: 2, kv_heads: 1, mlp: 20, eps: 1e-5, rope_theta: 500000, rope_scaling: llama3, rope_factor: 8, rope_original_context: 4}
  - rmsnorm
  - linear: {out: 256, bias: false}
)";

std::vector<int32_t> tokens(int64_t n, uint64_t seed) { return testing::randomTokens(n, seed); }

TEST(LlamaTest, DecodingGivesForwardsRowsInPiecesAndAcrossSequences) {
  cpu::CpuBackend be(cpu::CpuOptions{2});
  Model m(parseModelSpec(kLlama));
  m.build(be, 3);
  const auto ids = tokens(24, 1);
  Stash stash;
  const auto want =
      toHost(m.forward(toDeviceI32(be, {2, 12}, ids), stash, ForwardContext{false, 0}));
  // The same sequences fed in pieces: 5 tokens, then 1, then 6.
  DecodeState pieces;
  for (auto [from, n] : {std::pair<int64_t, int64_t>{0, 5}, {5, 1}, {6, 6}}) {
    std::vector<int32_t> part;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = from; t < from + n; ++t) part.push_back(ids[b * 12 + t]);
    const auto rows = toHost(m.decode(toDeviceI32(be, {2, n}, part), pieces));
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t v = 0; v < 256; ++v)
          ASSERT_NEAR(rows[(b * n + t) * 256 + v], want[(b * 12 + from + t) * 256 + v], 1e-5)
              << "sample " << b << " token " << from + t;
  }
  // One token of each of three sequences at different positions, as one batch.
  const std::vector<std::vector<int32_t>> prompts = {tokens(3, 1), tokens(7, 2), tokens(1, 3)};
  std::vector<DecodeState> alone(3), batched(3);
  std::vector<DecodeState*> states;
  for (size_t b = 0; b < 3; ++b) {
    const auto n = static_cast<int64_t>(prompts[b].size());
    m.decode(toDeviceI32(be, {1, n}, prompts[b]), alone[b]);
    m.decode(toDeviceI32(be, {1, n}, prompts[b]), batched[b]);
    states.push_back(&batched[b]);
  }
  const auto rows = toHost(m.decodeEach(toDeviceI32(be, {3, 1}, {65, 66, 67}), states));
  for (size_t b = 0; b < 3; ++b) {
    const auto one =
        toHost(m.decode(toDeviceI32(be, {1, 1}, {65 + static_cast<int32_t>(b)}), alone[b]));
    testing::expectCloseLogits(std::vector<float>(rows.begin() + static_cast<long>(b * 256),
                                                  rows.begin() + static_cast<long>((b + 1) * 256)),
                               one, "sequence " + std::to_string(b));
  }
}

TEST(LlamaTest, TheCacheGivesTheTokensOfRecomputingThePrefix) {
  cpu::CpuBackend be(cpu::CpuOptions{2});
  Model m(parseModelSpec(kLlama));
  m.build(be, 4);
  const SamplingOptions o{0.0f, 0, 9};
  const Generation cached = generate(m, tokens(3, 2), 9, o, true);
  const Generation plain = generate(m, tokens(3, 2), 9, o, false);
  ASSERT_EQ(cached.tokens.size(), 9u);
  EXPECT_EQ(cached.tokens, plain.tokens);
  for (size_t i = 0; i < cached.logits.size(); ++i)
    testing::expectCloseLogits(cached.logits[i], plain.logits[i], "token " + std::to_string(i));
}

TEST(LlamaTest, BadSpecsAreNamed) {
  testing::expectThrowWith<InvalidArgument>([] { layerOf("{attention: {heads: 4, kv_heads: 3}}"); },
                                            {"3 key/value heads do not divide 4 query heads"});
  testing::expectThrowWith<InvalidArgument>(
      [] { layerOf("{attention: {heads: 2, rope_scaling: linear}}"); },
      {"'rope_scaling' without 'rope_theta'"});
  testing::expectThrowWith<InvalidArgument>(
      [] { layerOf("{attention: {heads: 2, rope_theta: 10, rope_scaling: yarn}}"); },
      {"rope_scaling", "must be one of none, linear, llama3"});
  testing::expectThrowWith<InvalidArgument>(
      [] {
        auto l = layerOf("{attention: {heads: 2, rope_theta: 10}}");
        l->setup({4, 6});  // heads of 3
      },
      {"rotary embedding needs an even head size, got 3"});
  testing::expectThrowWith<InvalidArgument>([] { layerOf("{llama: {heads: 2}}"); },
                                            {"'mlp' is required"});
  testing::expectThrowWith<InvalidArgument>(
      [] { layerOf("{llama: {heads: 2, mlp: 8, out_bias: true}}"); }, {"'out_bias'", "fixed"});
  testing::expectThrowWith<InvalidArgument>(
      [] { layerOf("{llama: {heads: 2, mlp: 8, window: 4}}"); }, {"unknown field 'window'"});
}

}  // namespace
}  // namespace tandem
