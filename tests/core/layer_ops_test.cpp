// What each layer says it runs (Layer::ops) is what it runs: every layer type, forward
// and backward, on a backend that records its ops (tests/forwarding_backend.h).
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <sstream>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "core/layers/registry.h"
#include "core/model_spec.h"
#include "tests/forwarding_backend.h"

namespace tandem {
namespace {

std::string names(const std::set<OpUse>& uses) {
  std::ostringstream os;
  for (const OpUse& u : uses) os << (os.tellp() > 0 ? ", " : "") << opUseName(u);
  return os.str();
}

struct Case {
  std::string yaml;
  Shape input;  // with the batch
};

class LayerOpsTest : public ::testing::TestWithParam<Case> {};

TEST_P(LayerOpsTest, ALayerRunsExactlyTheOpsItDeclares) {
  const Case& c = GetParam();
  cpu::CpuBackend cpu(cpu::CpuOptions{1});
  testing::ForwardingBackend be(cpu);
  be.record(false);
  auto layer = makeLayer(parseModelSpec("input: [1]\nlayers:\n  - " + c.yaml + "\n").layers.at(0));
  layer->setup(c.input.dropFirst());
  Rng rng(3);
  layer->build(be, rng);
  const Tensor x =
      layer->inputDType() == DType::kI32
          ? be.zeros(c.input, DType::kI32)
          : toDevice(be, c.input, std::vector<float>(static_cast<size_t>(c.input.numel()), 0.5f));
  const Tensor dy = toDevice(
      be, layer->outputShape().withBatch(c.input[0]),
      std::vector<float>(static_cast<size_t>(layer->outputShape().numel() * c.input[0]), 0.25f));
  // Inference.
  be.record(true);
  {
    Stash stash;
    layer->forward(x, stash, ForwardContext{false, 5});
  }
  std::set<OpUse> declared;
  for (const OpUse& u : layer->ops(false)) declared.insert(u);
  EXPECT_EQ(names(be.used()), names(declared)) << c.yaml << ", inference";
  // Training: forward, then the whole backward with the input's gradient.
  be.clear();
  {
    Stash stash;
    layer->forward(x, stash, ForwardContext{true, 5});
    layer->backward(dy, stash, true);
  }
  declared.clear();
  for (const OpUse& u : layer->ops(true)) declared.insert(u);
  EXPECT_EQ(names(be.used()), names(declared)) << c.yaml << ", training";
  // The split backward and one without the input's gradient run no op beyond those.
  be.clear();
  {
    Stash stash;
    layer->forward(x, stash, ForwardContext{true, 5});
    layer->backwardInput(dy, stash);
    layer->backwardWeights(stash);
    Stash again;
    layer->forward(x, again, ForwardContext{true, 5});
    layer->backward(dy, again, false);
  }
  for (const OpUse& u : be.used())
    EXPECT_TRUE(declared.count(u)) << c.yaml << ": " << opUseName(u) << " not declared";
}

INSTANTIATE_TEST_SUITE_P(
    EveryLayerType, LayerOpsTest,
    ::testing::Values(
        Case{"linear: {out: 7}", {3, 13}}, Case{"linear: {out: 5, bias: false}", {2, 3, 4}},
        Case{"conv2d: {out: 3, kernel: 3, stride: 2, padding: 1}", {2, 2, 7, 5}},
        Case{"conv2d: {out: 3, kernel: 3, bias: false}", {2, 2, 7, 5}},
        Case{"conv2d: {out: 4, kernel: 3, padding: 1, groups: 4}", {2, 4, 5, 6}},
        Case{"conv2d: {out: 4, kernel: 3, stride: 2, groups: 4, bias: false}", {2, 4, 7, 6}},
        Case{"conv2d: {out: 4, kernel: 1, groups: 2}", {2, 4, 3, 3}},
        Case{"maxpool2d: {kernel: 3, stride: 2, padding: 1}", {2, 2, 7, 7}},
        Case{"avgpool2d: {kernel: 2}", {2, 3, 7, 6}}, Case{"globalavgpool", {2, 3, 5, 7}},
        Case{"relu", {3, 13}}, Case{"gelu", {3, 13}}, Case{"tanh", {3, 13}},
        Case{"sigmoid", {3, 13}}, Case{"flatten", {2, 3, 2, 2}}, Case{"dropout: {p: 0.3}", {4, 31}},
        Case{"silu", {3, 13}}, Case{"layernorm", {3, 13}}, Case{"rmsnorm", {2, 3, 8}},
        Case{"swiglu: {hidden: 6}", {2, 3, 4}}, Case{"embedding: {vocab: 11, dim: 4}", {2, 3}},
        Case{"residual: {layers: [{linear: {out: 6}}, tanh, {linear: {out: 6}}]}", {3, 6}},
        Case{"residual: {layers: [{conv2d: {out: 4, kernel: 3, stride: 2, padding: 1}}, tanh]}",
             {2, 2, 6, 6}},
        Case{"gate: {layers: [globalavgpool, {linear: {out: 2}}, relu, {linear: {out: 3}}, "
             "hardsigmoid]}",
             {2, 3, 4, 5}},
        Case{"gate: {layers: [{linear: {out: 6}}, sigmoid]}", {3, 6}},
        Case{"concat: {layers: [{conv2d: {out: 2, kernel: 1}}, {chain: {layers: [{conv2d: "
             "{out: 1, kernel: 3, padding: 1}}, relu]}}]}",
             {2, 3, 4, 5}},
        Case{"chain: {layers: [{linear: {out: 4}}, tanh]}", {3, 6}},
        Case{"slice: {begin: 1, end: 3}", {2, 4, 3, 2}},
        Case{"channel_shuffle: {groups: 2}", {2, 4, 3, 2}},
        Case{"maxpool2d: {kernel: 3, stride: 2, ceil: true}", {2, 2, 8, 8}},
        Case{"attention: {heads: 2}", {2, 5, 8}},
        Case{"attention: {heads: 1, causal: false}", {2, 4, 6}},
        Case{"positional: {context: 6}", {2, 4, 3}},
        Case{"attention: {heads: 4, kv_heads: 2, rope_theta: 100}", {2, 5, 8}},
        Case{"attention: {heads: 2, qkv_bias: false, out_bias: false}", {2, 5, 8}},
        Case{"transformer: {heads: 2, mlp: 12}", {2, 4, 8}},
        Case{"llama: {heads: 2, kv_heads: 1, mlp: 12, rope_theta: 10000}", {2, 4, 8}}));

}  // namespace
}  // namespace tandem
