// Conv2d over [C, H, W] samples: the backend's conv2d and its two gradients (the CPU's
// own kernels; OpenCL's composed from im2col, gemm and transpose01). With `groups: G` the
// channels are G independent convolutions (C/G inputs to OC/G outputs each; G = C is a
// depthwise one): the batch's channels regrouped group-major with transpose01, the
// backend's convolution run per group, and its output regrouped back. Ungrouped, it may be
// one rank's column part (output channels [begin, end)) or row part (input channels) of a
// tensor split (tensor_split.h).
#pragma once

#include <optional>

#include "core/layers/layer.h"
#include "core/layers/tensor_split.h"

namespace tandem {

class Conv2d final : public Layer, public TensorSplittable {
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
  const Window2d& window() const { return g_; }  // the input's (a row part's: its channels)
  bool tensorSplittable() const override { return groups_ == 1; }
  int64_t splitFeatures(TensorSplit split) const override {
    return split == TensorSplit::kColumn ? out_channels_ : in_channels_;
  }
  // A part's weights are the slice of what the whole layer draws from the same stream.
  void setTensorPart(const TensorPart& part) override;

 protected:
  Shape infer(const Shape& input) override;

 private:
  // Grouped: x [n, C, H, W] as [G, n, C/G, H, W], and back.
  // One group per channel, one output channel each (MobileNet's, EfficientNet's): the
  // backend's depthwise kernels, not a convolution per group.
  bool depthwise() const {
    return groups_ > 1 && groups_ == in_channels_ && groups_ == out_channels_;
  }
  Tensor byGroup(const Tensor& x) const;
  Tensor bySample(const Tensor& t, int64_t channels) const;

  int64_t out_channels_, in_channels_ = 0, groups_ = 1;
  Window2d g_;   // the input's window (a row part's: its channels)
  Window2d gg_;  // one group's: C/G channels
  bool bias_;
  Param weight_, b_;
  std::optional<TensorPart> part_;
  bool column() const { return part_ && part_->split == TensorSplit::kColumn; }
  bool row() const { return part_ && part_->split == TensorSplit::kRow; }
  int64_t outs() const { return column() ? part_->width() : out_channels_; }  // on this rank
  void buildPart(Backend& backend, Rng& rng);
};

}  // namespace tandem
