// Linear: y = x W^T + b over the last dimension (W is [out, in], PyTorch's layout; f32, or
// int8 for inference: weight_matrix.h). It may be one rank's column or row part of a
// tensor split (tensor_split.h), holding W's rows or columns [begin, end) only.
#pragma once

#include <optional>

#include "core/layers/layer.h"
#include "core/layers/tensor_split.h"
#include "core/layers/weight_matrix.h"

namespace tandem {

class Linear final : public Layer, public TensorSplittable {
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

  // A tensor part's weights are the slice of the ones the whole layer draws from the same
  // stream. InvalidArgument for int8 weights or a slice outside the split features.
  bool tensorSplittable() const override { return !format_.int8; }
  int64_t splitFeatures(TensorSplit split) const override {
    return split == TensorSplit::kColumn ? out_ : in_;
  }
  void setTensorPart(const TensorPart& part) override;

 protected:
  Shape infer(const Shape& input) override;

 private:
  int64_t in_ = 0;  // 0 until setup unless the spec names it
  int64_t out_;
  bool bias_;
  WeightFormat format_;
  WeightMatrix weight_;
  Param b_;
  std::optional<TensorPart> part_;
  bool column() const { return part_ && part_->split == TensorSplit::kColumn; }
  bool row() const { return part_ && part_->split == TensorSplit::kRow; }
  // The weight's [rows, cols] on this rank, and the bias's length.
  int64_t weightRows() const { return column() ? part_->width() : out_; }
  int64_t weightCols() const { return row() ? part_->width() : in_; }
  void buildPart(Backend& backend, Rng& rng, float bound);
};

}  // namespace tandem
