#include "core/layers/gate.h"

#include "core/error.h"

namespace tandem {

Gate::Gate(const LayerSpec& spec) : body_(spec.children) {
  SpecReader r(spec);
  r.finish();
  TANDEM_CHECK_MSG(body_.size() > 0, InvalidArgument, "gate: 'layers' must not be empty");
}

Shape Gate::infer(const Shape& input) {
  const Shape g = body_.setup(input);
  per_channel_ = input.rank() == 3 && g == Shape{input[0]};
  if (g != input && !per_channel_)
    throw InvalidArgument("gate: the body maps " + input.str() + " to " + g.str() +
                          "; it must keep the input's shape or, for a [C, H, W] input, give [C]");
  return input;
}

void Gate::build(Backend& backend, Rng& rng) {
  backend_ = &backend;
  body_.build(backend, rng, "body.");
  if (per_channel_) {
    const int64_t area = inputShape()[1] * inputShape()[2];
    ones_ = toDevice(backend, Shape{1, area}, std::vector<float>(static_cast<size_t>(area), 1.0f));
  }
}

// stash.saved: the input and the gate as big as it (the body's output, or its channel
// values spread over H and W); stash.children[0]: the body's.
Tensor Gate::forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) {
  stash.children.resize(1);
  const Tensor g = body_.forward(x, stash.children[0], ctx, 0, body_.size());
  Tensor gate = g;
  if (per_channel_) {
    gate = backend_->empty(x.shape());
    const int64_t rows = g.shape().numel();
    backend_->gemm(false, false, 1.0f, g.reshape(Shape{rows, 1}), ones_, 0.0f,
                   gate.reshape(Shape{rows, ones_.shape()[1]}));
  }
  Tensor y = backend_->empty(x.shape());
  backend_->mul(x, gate, y);
  stash.saved = {x, gate};
  return y;
}

Tensor Gate::gateGrad(const Tensor& dy, const Stash& stash) {
  const Tensor& x = stash.saved.at(0);
  Tensor t = backend_->empty(x.shape());
  backend_->mul(dy, x, t);
  if (!per_channel_) return t;
  const int64_t n = x.shape()[0], c = inputShape()[0], area = ones_.shape()[1];
  Tensor dg = backend_->empty(Shape{n, c});
  backend_->gemm(false, true, 1.0f, t.reshape(Shape{n * c, area}), ones_, 0.0f,
                 dg.reshape(Shape{n * c, 1}));
  return dg;
}

Tensor Gate::directGrad(const Tensor& dy, const Stash& stash) {
  Tensor dx = backend_->empty(dy.shape());
  backend_->mul(dy, stash.saved.at(1), dx);
  return dx;
}

Tensor Gate::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  const Tensor dg = gateGrad(dy, stash);
  const Tensor db = body_.backward(dg, stash.children.at(0), need_dx, 0, body_.size());
  if (!need_dx) return {};
  Tensor dx = directGrad(dy, stash);
  backend_->axpby(1.0f, db, 1.0f, dx);
  return dx;
}

Tensor Gate::backwardInput(const Tensor& dy, Stash& stash) {
  const Tensor dg = gateGrad(dy, stash);
  const Tensor db = body_.backwardInput(dg, stash.children.at(0), 0, body_.size());
  Tensor dx = directGrad(dy, stash);
  backend_->axpby(1.0f, db, 1.0f, dx);
  stash.saved.clear();
  return dx;
}

void Gate::backwardWeights(Stash& stash) {
  body_.backwardWeights(stash.children.at(0), 0, body_.size());
}

int64_t Gate::paramCount() const { return body_.paramCount(); }

int64_t Gate::paramBytes() const { return body_.paramBytes(); }

// The product, and the spreading gemm's multiply-adds.
int64_t Gate::flops() const {
  return outputShape().numel() * (per_channel_ ? 3 : 1) + body_.flops();
}

// The input and the gate (the body's own output when it is as big as the input).
int64_t Gate::stashBytes() const {
  return inputShape().numel() * (per_channel_ ? 8 : 4) + body_.stashBytes();
}

// Backward's dy * x beside the body's largest scratch (they do not overlap in time, but
// the body's runs while dy * x is alive).
int64_t Gate::workspaceBytes(int64_t batch) const {
  return body_.workspaceBytes(batch) + inputShape().numel() * 4 * batch;
}

LayerSpec Gate::spec() const {
  LayerSpec s;
  s.type = type();
  s.children = body_.specs();
  return s;
}

std::vector<OpUse> Gate::ops(bool training) const {
  std::vector<OpUse> own = per_channel_ ? f32Ops(training, {Op::kGemm, Op::kMul}, {Op::kAxpby})
                                        : f32Ops(training, {Op::kMul}, {Op::kAxpby});
  return unionOps({own, body_.ops(training)});
}

}  // namespace tandem
