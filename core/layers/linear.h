// Linear: y = x W^T + b over the last dimension (W is [out, in], PyTorch's layout; f32, or
// int8 for inference: weight_matrix.h).
#pragma once

#include "core/layers/layer.h"
#include "core/layers/weight_matrix.h"

namespace tandem {

class Linear final : public Layer {
 public:
  explicit Linear(const LayerSpec& spec);
  std::string type() const override { return "linear"; }
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
  int64_t paramCount() const override;
  int64_t paramBytes() const override;
  bool trains() const override { return !format_.int8; }
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override;
  int64_t stashBytes() const override { return inputShape().numel() * 4; }
  LayerSpec spec() const override;

 protected:
  Shape infer(const Shape& input) override;

 private:
  int64_t in_ = 0;  // 0 until setup unless the spec names it
  int64_t out_;
  bool bias_;
  WeightFormat format_;
  WeightMatrix weight_;
  Param b_;
};

}  // namespace tandem
