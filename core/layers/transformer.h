// Transformer blocks over per-sample [T, D], each written in a spec as one layer and built
// as the residual blocks it stands for. Being one layer, a block is one cut point for the
// partitioner, with the cost facts of everything inside.
//   transformer (GPT-2's pre-norm form), `transformer: {heads: 4, mlp: 512}` (mlp
//   defaults to 4 * D):
//     x = x + attention(layernorm(x));  y = x + linear(gelu(linear(layernorm(x))))
//   llama (Llama, Mistral, Qwen2, SmolLM), `llama: {heads: 8, kv_heads: 2, mlp: 1376,
//   eps: 1e-5, rope_theta: 500000}` (and attention's rope_scaling fields, rope.h;
//   qkv_bias: true for Qwen2):
//     x = x + attention(rmsnorm(x));    y = x + swiglu(rmsnorm(x))
//   with grouped-query attention, rotary embedding and no biases.
#pragma once

#include <optional>

#include "core/layers/layer.h"
#include "core/layers/sequence.h"
#include "core/layers/tensor_split.h"
#include "core/layers/weight_matrix.h"

namespace tandem {

// What both blocks share: a body built at setup, every call forwarded to it. Tensor-split
// (tensor_split.h) over the body's attention and MLP (two all-reduces forward, two in
// backward), the norms replicated; the split is made again whenever setup remakes the body.
class ComposedBlock : public Layer, public TensorSplitBlock {
 public:
  void build(Backend& backend, Rng& rng) override;
  std::vector<Param*> params() override { return body_.params(); }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  Tensor decode(const Tensor& x, DecodeState& state) override;
  Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>& states) override;
  Tensor backwardInput(const Tensor& dy, Stash& stash) override;
  void backwardWeights(Stash& stash) override;
  int64_t paramCount() const override;
  int64_t paramBytes() const override;
  bool trains() const override { return body_.trains(); }
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override;
  int64_t stashBytes() const override;
  int64_t workspaceBytes(int64_t batch) const override;
  // The two residual blocks, built at setup (their widths come from the input).
  const Sequence& body() const { return body_; }
  bool tensorSplits() const override;
  void splitTensor(Group& group, const std::vector<double>& shares, uint64_t& next_tag) override;
  int tensorAllreduces() const override;

 protected:
  // Checks [T, width] input and sets the body up on it.
  Shape setBody(const Shape& input, std::vector<LayerSpec> blocks);
  // Sets the body up on any input.
  Shape setSequence(const Shape& input, std::vector<LayerSpec> layers);

 private:
  struct Split {
    Group* group;
    std::vector<double> shares;
    uint64_t first_tag;
  };
  // Splits the body as `split` says; returns the next free tag.
  uint64_t applySplit(const Split& split);

  Sequence body_;
  std::optional<Split> split_;
};

class TransformerBlock final : public ComposedBlock {
 public:
  explicit TransformerBlock(const LayerSpec& spec);
  std::string type() const override { return "transformer"; }
  LayerSpec spec() const override;

 protected:
  Shape infer(const Shape& input) override;

 private:
  int64_t heads_, mlp_;  // mlp 0: 4 * D
  WeightFormat format_;  // the attention's and the MLP's products
};

class LlamaBlock final : public ComposedBlock {
 public:
  explicit LlamaBlock(const LayerSpec& spec);
  std::string type() const override { return "llama"; }
  LayerSpec spec() const override { return spec_; }

 protected:
  Shape infer(const Shape& input) override;

 private:
  LayerSpec spec_;       // as given, defaults filled in
  LayerSpec attention_;  // the attention layer's spec
  int64_t mlp_;
  double eps_;
};

}  // namespace tandem
