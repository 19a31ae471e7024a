#include "core/layers/elementwise.h"

#include "core/error.h"

namespace tandem {

ActivationLayer::ActivationLayer(Activation kind, const LayerSpec& spec) : kind_(kind) {
  SpecReader(spec).finish();
}

std::string ActivationLayer::type() const {
  switch (kind_) {
    case Activation::kReLU:
      return "relu";
    case Activation::kGELU:
      return "gelu";
    case Activation::kTanh:
      return "tanh";
    case Activation::kSigmoid:
      return "sigmoid";
    case Activation::kSiLU:
      return "silu";
    case Activation::kReLU6:
      return "relu6";
    case Activation::kHardSigmoid:
      return "hardsigmoid";
    case Activation::kHardSwish:
      return "hardswish";
  }
  return "activation";
}

Tensor ActivationLayer::forward(const Tensor& x, Stash& stash, const ForwardContext&) {
  Tensor y = backend_->empty(x.shape());
  backend_->activation(kind_, x, y);
  // GELU, SiLU and the hard ones differentiate from x; ReLU, ReLU6, tanh and sigmoid from
  // y. (ReLU keeps y, since y > 0 exactly where x > 0: then x, often a big convolution
  // output, can be freed.)
  stash.saved = {activationGradFromInput(kind_) ? x : y};
  return y;
}

Tensor ActivationLayer::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  if (!need_dx) return {};
  Tensor dx = backend_->empty(dy.shape());
  const Tensor& saved = stash.saved.at(0);
  backend_->activationBackward(kind_, saved, saved, dy, dx);
  return dx;
}

int64_t ActivationLayer::flops() const {
  const int64_t n = inputShape().numel();
  switch (kind_) {
    case Activation::kReLU:
    case Activation::kReLU6:
      return n;
    case Activation::kHardSigmoid:
    case Activation::kHardSwish:
      return 4 * n;
    default:
      return 8 * n;  // transcendental ones counted as ~8
  }
}

Dropout::Dropout(const LayerSpec& spec) {
  SpecReader r(spec);
  p_ = static_cast<float>(r.number("p", 0.5));
  r.finish();
  TANDEM_CHECK_MSG(p_ >= 0.0f && p_ < 1.0f, InvalidArgument,
                   "dropout: 'p' must be in [0, 1), got " << p_);
}

Tensor Dropout::forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) {
  if (!ctx.training || p_ == 0.0f) {
    stash.saved.clear();
    return x;
  }
  Tensor mask = backend_->empty(x.shape());
  Tensor y = backend_->empty(x.shape());
  backend_->dropout(x, p_, ctx.seed, mask, y);
  stash.saved = {mask};
  return y;
}

Tensor Dropout::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  if (!need_dx) return {};
  if (stash.saved.empty()) return dy;  // forward was the identity
  Tensor dx = backend_->empty(dy.shape());
  backend_->mul(dy, stash.saved[0], dx);
  return dx;
}

LayerSpec Dropout::spec() const {
  LayerSpec s;
  s.type = type();
  s.attrs["p"] = static_cast<double>(p_);
  return s;
}

Flatten::Flatten(const LayerSpec& spec) { SpecReader(spec).finish(); }

Identity::Identity(const LayerSpec& spec) { SpecReader(spec).finish(); }

Tensor Flatten::forward(const Tensor& x, Stash&, const ForwardContext&) {
  return x.reshape(outputShape().withBatch(x.shape()[0]));
}

Tensor Flatten::backward(const Tensor& dy, Stash&, bool need_dx) {
  if (!need_dx) return {};
  return dy.reshape(inputShape().withBatch(dy.shape()[0]));
}

std::vector<OpUse> ActivationLayer::ops(bool training) const {
  return f32Ops(training, {Op::kActivation}, {Op::kActivationBackward});
}

// Inference passes its input through.
std::vector<OpUse> Dropout::ops(bool training) const {
  return training ? f32Ops(true, {Op::kDropout}, {Op::kMul}) : std::vector<OpUse>{};
}

// A view of its input: no op.
std::vector<OpUse> Flatten::ops(bool training) const {
  (void)training;
  return {};
}

}  // namespace tandem
