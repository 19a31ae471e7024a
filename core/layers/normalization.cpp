#include "core/layers/normalization.h"

#include "core/error.h"

namespace tandem {

LayerNorm::LayerNorm(const LayerSpec& spec) {
  SpecReader r(spec);
  eps_ = static_cast<float>(r.number("eps", 1e-5));
  r.finish();
  TANDEM_CHECK_MSG(eps_ > 0.0f, InvalidArgument, "layernorm: 'eps' must be positive");
}

Shape LayerNorm::infer(const Shape& input) {
  TANDEM_CHECK_MSG(input.rank() >= 1 && input[input.rank() - 1] > 0, InvalidArgument,
                   "expected input [..., features], got " << input);
  dim_ = input[input.rank() - 1];
  return input;
}

void LayerNorm::build(Backend& backend, Rng&) {
  backend_ = &backend;
  gamma_ = makeParam(backend, "gamma", {dim_}, std::vector<float>(static_cast<size_t>(dim_), 1.0f));
  beta_ = makeParam(backend, "beta", {dim_}, std::vector<float>(static_cast<size_t>(dim_), 0.0f));
}

int64_t LayerNorm::stashBytes() const {
  return (inputShape().numel() + 2 * (inputShape().numel() / dim_)) * 4;
}

Tensor LayerNorm::forward(const Tensor& x, Stash& stash, const ForwardContext&) {
  const int64_t rows = x.numel() / dim_;
  Tensor y = backend_->empty(x.shape());
  Tensor mean = backend_->empty({rows});
  Tensor rstd = backend_->empty({rows});
  backend_->layerNorm(x, gamma_.value, beta_.value, eps_, y, mean, rstd);
  stash.saved = {x, mean, rstd};
  return y;
}

Tensor LayerNorm::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  const Tensor& x = stash.saved.at(0);
  Tensor dx = backend_->empty(x.shape());  // the kernel computes dx with the sums anyway
  backend_->layerNormBackward(dy, x, gamma_.value, stash.saved.at(1), stash.saved.at(2), dx,
                              gamma_.grad, beta_.grad);
  return need_dx ? dx : Tensor();
}

LayerSpec LayerNorm::spec() const {
  LayerSpec s;
  s.type = type();
  s.attrs["eps"] = static_cast<double>(eps_);
  return s;
}

RmsNorm::RmsNorm(const LayerSpec& spec) {
  SpecReader r(spec);
  eps_ = static_cast<float>(r.number("eps", 1e-6));
  r.finish();
  TANDEM_CHECK_MSG(eps_ > 0.0f, InvalidArgument, "rmsnorm: 'eps' must be positive");
}

Shape RmsNorm::infer(const Shape& input) {
  TANDEM_CHECK_MSG(input.rank() >= 1 && input[input.rank() - 1] > 0, InvalidArgument,
                   "expected input [..., features], got " << input);
  dim_ = input[input.rank() - 1];
  return input;
}

void RmsNorm::build(Backend& backend, Rng&) {
  backend_ = &backend;
  gamma_ = makeParam(backend, "gamma", {dim_}, std::vector<float>(static_cast<size_t>(dim_), 1.0f));
}

int64_t RmsNorm::stashBytes() const {
  return (inputShape().numel() + inputShape().numel() / dim_) * 4;
}

Tensor RmsNorm::forward(const Tensor& x, Stash& stash, const ForwardContext&) {
  Tensor y = backend_->empty(x.shape());
  Tensor rstd = backend_->empty({x.numel() / dim_});
  backend_->rmsNorm(x, gamma_.value, eps_, y, rstd);
  stash.saved = {x, rstd};
  return y;
}

Tensor RmsNorm::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  const Tensor& x = stash.saved.at(0);
  Tensor dx = backend_->empty(x.shape());  // computed with gamma's gradient in any case
  backend_->rmsNormBackward(dy, x, gamma_.value, stash.saved.at(1), dx, gamma_.grad);
  return need_dx ? dx : Tensor();
}

LayerSpec RmsNorm::spec() const {
  LayerSpec s;
  s.type = type();
  s.attrs["eps"] = static_cast<double>(eps_);
  return s;
}

Embedding::Embedding(const LayerSpec& spec) {
  SpecReader r(spec);
  vocab_ = r.integer("vocab");
  dim_ = r.integer("dim");
  r.finish();
  TANDEM_CHECK_MSG(vocab_ > 0 && dim_ > 0, InvalidArgument,
                   "embedding: 'vocab' and 'dim' must be positive");
}

Shape Embedding::infer(const Shape& input) {
  TANDEM_CHECK_MSG(input.rank() == 1, InvalidArgument, "expected input [T] of ids, got " << input);
  return {input[0], dim_};
}

void Embedding::build(Backend& backend, Rng& rng) {
  backend_ = &backend;
  std::vector<float> init(static_cast<size_t>(vocab_ * dim_));
  for (float& v : init) v = rng.normal();  // PyTorch's N(0, 1)
  table_ = makeParam(backend, "table", {vocab_, dim_}, init);
}

Tensor Embedding::forward(const Tensor& x, Stash& stash, const ForwardContext&) {
  TANDEM_CHECK_MSG(x.dtype() == DType::kI32, InvalidArgument,
                   "embedding expects i32 ids, got " << dtypeName(x.dtype()));
  std::vector<int64_t> dims = x.shape().dims();  // [N, T], or [N, Tnew] when decoding
  dims.push_back(dim_);
  Tensor y = backend_->empty(Shape(dims));
  backend_->embedding(x, table_.value, y);
  stash.saved = {x};
  return y;
}

Tensor Embedding::backward(const Tensor& dy, Stash& stash, bool) {
  backend_->embeddingBackward(stash.saved.at(0), dy, table_.grad);
  return {};
}

LayerSpec Embedding::spec() const {
  LayerSpec s;
  s.type = type();
  s.attrs["vocab"] = vocab_;
  s.attrs["dim"] = dim_;
  return s;
}

std::vector<OpUse> LayerNorm::ops(bool training) const {
  return f32Ops(training, {Op::kLayerNorm}, {Op::kLayerNormBackward});
}

std::vector<OpUse> RmsNorm::ops(bool training) const {
  return f32Ops(training, {Op::kRmsNorm}, {Op::kRmsNormBackward});
}

std::vector<OpUse> Embedding::ops(bool training) const {
  std::vector<OpUse> out = {{Op::kEmbedding, DType::kI32}};
  if (training) out.push_back({Op::kEmbeddingBackward, DType::kI32});
  return out;
}

}  // namespace tandem
