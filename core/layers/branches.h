// Branches of a graph that meet again, each written as one layer so that the model stays
// a list of cut points:
//   chain:  its layers one after another (a branch of several layers);
//   concat: each of its layers (branches, often chains) reads the block's input, and their
//           outputs are joined along the first dimension of a sample (channels of
//           [C, H, W], features of [D]) — as SqueezeNet's fire modules and Inception's
//           blocks concatenate.
// The join is composed of Backend ops: each branch's output is transposed channel-major
// into its rows of one buffer, and the buffer back (transpose01), so every backend that
// runs the branches runs it.
#pragma once

#include "core/layers/layer.h"
#include "core/layers/sequence.h"
#include "core/layers/transformer.h"

namespace tandem {

class Chain final : public ComposedBlock {
 public:
  explicit Chain(const LayerSpec& spec);
  std::string type() const override { return "chain"; }
  LayerSpec spec() const override;

 protected:
  Shape infer(const Shape& input) override;

 private:
  std::vector<LayerSpec> layers_;
};

class Concat final : public Layer {
 public:
  explicit Concat(const LayerSpec& spec);
  std::string type() const override { return "concat"; }
  void build(Backend& backend, Rng& rng) override;
  std::vector<Param*> params() override { return branches_.params(); }
  bool trains() const override { return branches_.trains(); }
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
  LayerSpec spec() const override { return {type(), {}, branches_.specs(), {}}; }
  const Sequence& branches() const { return branches_; }

 protected:
  Shape infer(const Shape& input) override;

 private:
  // Each branch's share of dy ([N, C_k, ...]), from dy transposed channel-major.
  std::vector<Tensor> split(const Tensor& dy);
  // The input gradients of the branches summed (`parts`, one per branch).
  Tensor sum(const std::vector<Tensor>& parts);

  Sequence branches_;              // (a Sequence for the building and naming; never run as one)
  std::vector<int64_t> channels_;  // per branch
  int64_t rest_ = 1;               // values per channel: H W of [C, H, W], 1 of [D]
};

}  // namespace tandem
