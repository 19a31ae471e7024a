// Pooling over [C, H, W] samples: max and average windows, and global average pooling
// ([C, H, W] -> [C]).
#pragma once

#include "core/layers/layer.h"

namespace tandem {

class Pool2d final : public Layer {
 public:
  enum class Kind { kMax, kAvg };
  Pool2d(Kind kind, const LayerSpec& spec);
  std::string type() const override { return kind_ == Kind::kMax ? "maxpool2d" : "avgpool2d"; }
  void build(Backend& backend, Rng&) override { backend_ = &backend; }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override;
  int64_t stashBytes() const override;
  LayerSpec spec() const override;

 protected:
  Shape infer(const Shape& input) override;

 private:
  Kind kind_;
  Window2d g_;
};

class GlobalAvgPool final : public Layer {
 public:
  explicit GlobalAvgPool(const LayerSpec& spec);
  std::string type() const override { return "globalavgpool"; }
  void build(Backend& backend, Rng&) override { backend_ = &backend; }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override { return inputShape().numel(); }
  LayerSpec spec() const override { return {type(), {}, {}, {}}; }

 protected:
  Shape infer(const Shape& input) override;

 private:
  Window2d g_;
};

}  // namespace tandem
