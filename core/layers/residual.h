// Residual block: y = body(x) + shortcut(x). The shortcut is the identity when the body
// keeps the shape, otherwise a projection made at setup: a 1x1 convolution (with the
// stride that maps H to H' and W to W', projectionStride) for [C, H, W] samples, a linear layer for
// [D] samples; with `proj_bias: true` it has a bias (a batch norm folded into it, as ResNet's
// downsample exports in eval mode); with `proj_norm: true` a batch norm follows it (`proj_eps`,
// `proj_momentum`: ResNet's downsample as it trains), the projection then a `chain`.
#pragma once

#include <memory>

#include "core/layers/layer.h"
#include "core/layers/sequence.h"
#include "core/layers/tensor_split.h"

namespace tandem {

// The stride of a 1x1 projection (no padding) from `in` to `out` pixels along one
// dimension: the smallest s with (in - 1) / s + 1 == out (7 -> 4: 2); 0 if none.
int64_t projectionStride(int64_t in, int64_t out);

// Tensor-split (tensor_split.h) by its body's pairs and blocks; the shortcut runs whole.
class Residual final : public Layer, public TensorSplitBlock {
 public:
  explicit Residual(const LayerSpec& spec);
  std::string type() const override { return "residual"; }
  void build(Backend& backend, Rng& rng) override;
  std::vector<Param*> params() override;
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  Tensor decode(const Tensor& x, DecodeState& state) override;
  Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>& states) override;
  Tensor backwardInput(const Tensor& dy, Stash& stash) override;
  void backwardWeights(Stash& stash) override;
  int64_t paramCount() const override;
  int64_t paramBytes() const override;
  bool trains() const override;
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override;
  int64_t stashBytes() const override;
  int64_t workspaceBytes(int64_t batch) const override;
  LayerSpec spec() const override;
  const Sequence& body() const { return body_; }
  bool hasProjection() const { return projection_ != nullptr; }
  bool projectionHasBias() const { return proj_bias_; }
  bool projectionHasNorm() const { return proj_norm_; }
  bool tensorSplits() const override;
  void splitTensor(Group& group, const std::vector<double>& shares, uint64_t& next_tag) override;
  int tensorAllreduces() const override;

 protected:
  Shape infer(const Shape& input) override;

 private:
  Sequence body_;
  std::unique_ptr<Layer> projection_;  // null for the identity shortcut
  bool proj_bias_ = false;
  bool proj_norm_ = false;
  float proj_eps_ = 1e-5f, proj_momentum_ = 0.1f;
};

}  // namespace tandem
