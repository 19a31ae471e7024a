// SwiGLU MLP (Llama's): y = down(silu(gate(x)) * up(x)) over the last dimension, with no
// biases — Hugging Face's LlamaMLP, gate_proj and up_proj [hidden, D], down_proj [D, hidden].
// Written in a spec as `swiglu: {hidden: 1376}`; `weights: int8` (and `group`) quantizes
// the three products (weight_matrix.h). Tensor-split (tensor_split.h) by hidden features: a
// rank holds its rows of gate and up (column-parallel) and its columns of down (row-
// parallel); its partial output is summed over the ranks (one all-reduce), as is
// backward's input gradient.
#pragma once

#include <optional>

#include "core/layers/layer.h"
#include "core/layers/tensor_split.h"
#include "core/layers/weight_matrix.h"

namespace tandem {

class SwiGlu final : public Layer, public TensorSplitBlock {
 public:
  explicit SwiGlu(const LayerSpec& spec);
  std::string type() const override { return "swiglu"; }
  void build(Backend& backend, Rng& rng) override;
  std::vector<Param*> params() override;
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor decode(const Tensor& x, DecodeState&) override { return forwardPerToken(x); }
  Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>&) override {
    return forwardPerToken(x);
  }
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  Tensor backwardInput(const Tensor& dy, Stash& stash) override;
  void backwardWeights(Stash& stash) override;
  int64_t paramCount() const override { return 3 * dim_ * local_; }
  int64_t paramBytes() const override;
  bool trains() const override { return !format_.int8; }
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override;
  int64_t stashBytes() const override;
  int64_t workspaceBytes(int64_t batch) const override;
  LayerSpec spec() const override;
  bool tensorSplits() const override { return !format_.int8; }
  void splitTensor(Group& group, const std::vector<double>& shares, uint64_t& next_tag) override;
  int tensorAllreduces() const override { return 1; }  // the output's (row-parallel) sum

 protected:
  Shape infer(const Shape& input) override;

 private:
  int64_t hidden_, dim_ = 0;
  int64_t local_ = 0;               // the hidden features on this rank (all unless split)
  std::optional<TensorPart> part_;  // a tensor part: hidden features [begin, end)
  WeightFormat format_;
  WeightMatrix gate_, up_, down_;
};

}  // namespace tandem
