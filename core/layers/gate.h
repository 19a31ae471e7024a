// Gate: y = x * body(x). Squeeze-and-excitation (MobileNetV3, EfficientNet) is one: the
// body maps a [C, H, W] sample to [C] (global pooling, a bottleneck, a sigmoid) and each
// value scales its channel of the input; a body that keeps the input's shape gates it
// element by element. Composed of Backend ops (a rank-1 gemm spreads the channel values,
// another sums their gradient over H and W), so every backend that runs the body runs it.
#pragma once

#include "core/layers/layer.h"
#include "core/layers/sequence.h"

namespace tandem {

class Gate final : public Layer {
 public:
  explicit Gate(const LayerSpec& spec);
  std::string type() const override { return "gate"; }
  void build(Backend& backend, Rng& rng) override;
  std::vector<Param*> params() override { return body_.params(); }
  bool trains() const override { return body_.trains(); }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  Tensor backwardInput(const Tensor& dy, Stash& stash) override;
  void backwardWeights(Stash& stash) override;
  int64_t paramCount() const override;
  int64_t paramBytes() const override;
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override;
  int64_t stashBytes() const override;
  int64_t workspaceBytes(int64_t batch) const override;
  LayerSpec spec() const override;
  const Sequence& body() const { return body_; }
  // Whether the body gives one value per channel (spread over H and W).
  bool perChannel() const { return per_channel_; }

 protected:
  Shape infer(const Shape& input) override;

 private:
  // The gradient reaching the body's output: dy * x, summed over H and W per channel.
  Tensor gateGrad(const Tensor& dy, const Stash& stash);
  // dy * gate, the gradient through the product's other factor.
  Tensor directGrad(const Tensor& dy, const Stash& stash);

  Sequence body_;
  bool per_channel_ = false;
  Tensor ones_;  // [1, H W] ones (per_channel_): the rank-1 factor of both gemms
};

}  // namespace tandem
