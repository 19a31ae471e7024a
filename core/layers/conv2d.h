// Conv2d over [C, H, W] samples: the backend's conv2d and its two gradients (the CPU's
// own kernels; OpenCL's composed from im2col, gemm and transpose01).
#pragma once

#include "core/layers/layer.h"

namespace tandem {

class Conv2d final : public Layer {
 public:
  explicit Conv2d(const LayerSpec& spec);
  std::string type() const override { return "conv2d"; }
  void build(Backend& backend, Rng& rng) override;
  std::vector<Param*> params() override;
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  int64_t paramCount() const override;
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override;
  int64_t stashBytes() const override { return inputShape().numel() * 4; }
  int64_t workspaceBytes(int64_t batch) const override;
  LayerSpec spec() const override;
  const Window2d& window() const { return g_; }

 protected:
  Shape infer(const Shape& input) override;

 private:
  int64_t out_channels_, in_channels_ = 0;
  Window2d g_;
  bool bias_;
  Param weight_, b_;
};

}  // namespace tandem
