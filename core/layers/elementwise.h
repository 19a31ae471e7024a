// Layers that act element by element: activations (ReLU, GELU, Tanh, Sigmoid, SiLU,
// ReLU6, hard sigmoid and hard swish), Dropout, Flatten (a reshape to [features]) and
// Identity.
#pragma once

#include "core/layers/layer.h"

namespace tandem {

class ActivationLayer final : public Layer {
 public:
  ActivationLayer(Activation kind, const LayerSpec& spec);
  std::string type() const override;
  void build(Backend& backend, Rng&) override { backend_ = &backend; }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor decode(const Tensor& x, DecodeState&) override { return forwardPerToken(x); }
  Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>&) override {
    return forwardPerToken(x);
  }
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override;
  int64_t stashBytes() const override { return inputShape().numel() * 4; }
  LayerSpec spec() const override { return {type(), {}, {}, {}}; }

 protected:
  Shape infer(const Shape& input) override { return input; }

 private:
  Activation kind_;
};

// Zeroes each element with probability p while training and scales the rest by
// 1/(1-p); the identity in evaluation. The mask comes from the forward context's seed.
class Dropout final : public Layer {
 public:
  explicit Dropout(const LayerSpec& spec);
  std::string type() const override { return "dropout"; }
  void build(Backend& backend, Rng&) override { backend_ = &backend; }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor decode(const Tensor& x, DecodeState&) override { return forwardPerToken(x); }
  Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>&) override {
    return forwardPerToken(x);
  }
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override { return inputShape().numel(); }
  int64_t stashBytes() const override { return inputShape().numel() * 4; }
  LayerSpec spec() const override;

 protected:
  Shape infer(const Shape& input) override { return input; }

 private:
  float p_;
};

class Flatten final : public Layer {
 public:
  explicit Flatten(const LayerSpec& spec);
  std::string type() const override { return "flatten"; }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override { return 0; }
  LayerSpec spec() const override { return {type(), {}, {}, {}}; }

 protected:
  Shape infer(const Shape& input) override { return {input.numel()}; }
};

// Its input, unchanged: the branch of a `concat` that passes the block's input on (a
// DenseNet layer appends its features to its input: concat [identity, layers]).
class Identity final : public Layer {
 public:
  explicit Identity(const LayerSpec& spec);
  std::string type() const override { return "identity"; }
  Tensor forward(const Tensor& x, Stash&, const ForwardContext&) override { return x; }
  Tensor decode(const Tensor& x, DecodeState&) override { return x; }
  Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>&) override { return x; }
  Tensor backward(const Tensor& dy, Stash&, bool need_dx) override {
    return need_dx ? dy : Tensor();
  }
  std::vector<OpUse> ops(bool) const override { return {}; }
  int64_t flops() const override { return 0; }
  LayerSpec spec() const override { return {type(), {}, {}, {}}; }

 protected:
  Shape infer(const Shape& input) override { return input; }
};

}  // namespace tandem
