// Layers that rearrange the first dimension of a sample (the channels of [C, H, W], the
// features of [D]) without arithmetic, as ShuffleNet's units do:
//   slice:           the channels [begin, end) (a half of torch's chunk(2, dim=1));
//   channel_shuffle: with `groups` G and K = C / G, output channel k * G + g is input
//                    channel g * K + k (torch's view [G, K] -> transpose -> view).
// Both are composed of Backend ops (transpose01, copy, fill: the sample's channels moved
// channel-major and back), so every backend runs them, in as many calls whatever the
// batch.
#pragma once

#include "core/layers/layer.h"

namespace tandem {

class ChannelSlice final : public Layer {
 public:
  explicit ChannelSlice(const LayerSpec& spec);
  std::string type() const override { return "slice"; }
  void build(Backend& backend, Rng&) override { backend_ = &backend; }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override { return 0; }
  int64_t workspaceBytes(int64_t batch) const override;
  LayerSpec spec() const override;

 protected:
  Shape infer(const Shape& input) override;

 private:
  int64_t begin_ = 0, end_ = 0;
  int64_t rest_ = 1;  // values per channel
};

class ChannelShuffle final : public Layer {
 public:
  explicit ChannelShuffle(const LayerSpec& spec);
  std::string type() const override { return "channel_shuffle"; }
  void build(Backend& backend, Rng&) override { backend_ = &backend; }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override { return 0; }
  int64_t workspaceBytes(int64_t batch) const override;
  LayerSpec spec() const override;

 protected:
  Shape infer(const Shape& input) override;

 private:
  // x [N, G * K, R] -> y [N, K * G, R]: its channels as [G, K] transposed.
  Tensor shuffle(const Tensor& x, int64_t groups) const;

  int64_t groups_ = 1;
  int64_t rest_ = 1;
};

}  // namespace tandem
