// Transformer block (GPT-2's pre-norm form) over per-sample [T, D]:
//   x = x + attention(layernorm(x));  y = x + linear(gelu(linear(layernorm(x))))
// written in a spec as one layer, `transformer: {heads: 4, mlp: 512}` (mlp defaults to
// 4 * D), and built as the two residual blocks it stands for. Being one layer, a block
// is one cut point for the partitioner, with the cost facts of everything inside.
#pragma once

#include "core/layers/layer.h"
#include "core/layers/sequence.h"

namespace tandem {

class TransformerBlock final : public Layer {
 public:
  explicit TransformerBlock(const LayerSpec& spec);
  std::string type() const override { return "transformer"; }
  void build(Backend& backend, Rng& rng) override;
  std::vector<Param*> params() override { return body_.params(); }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  Tensor decode(const Tensor& x, DecodeState& state) override;
  Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>& states) override;
  Tensor backwardInput(const Tensor& dy, Stash& stash) override;
  void backwardWeights(Stash& stash) override;
  int64_t paramCount() const override;
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override;
  int64_t stashBytes() const override;
  LayerSpec spec() const override;
  // The two residual blocks, built at setup (their widths come from the input).
  const Sequence& body() const { return body_; }

 protected:
  Shape infer(const Shape& input) override;

 private:
  int64_t heads_, mlp_;  // mlp 0: 4 * D
  Sequence body_;
};

}  // namespace tandem
