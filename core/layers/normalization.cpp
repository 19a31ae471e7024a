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

BatchNorm::BatchNorm(const LayerSpec& spec) {
  SpecReader r(spec);
  eps_ = static_cast<float>(r.number("eps", 1e-5));
  momentum_ = static_cast<float>(r.number("momentum", 0.1));
  r.finish();
  TANDEM_CHECK_MSG(eps_ > 0.0f, InvalidArgument, "batchnorm: 'eps' must be positive");
  TANDEM_CHECK_MSG(momentum_ >= 0.0f && momentum_ <= 1.0f, InvalidArgument,
                   "batchnorm: 'momentum' must be in [0, 1], got " << momentum_);
}

Shape BatchNorm::infer(const Shape& input) {
  TANDEM_CHECK_MSG(input.rank() >= 1 && input.numel() > 0, InvalidArgument,
                   "expected input [channels, ...], got " << input);
  channels_ = input[0];
  return input;
}

void BatchNorm::build(Backend& backend, Rng&) {
  backend_ = &backend;
  const auto c = static_cast<size_t>(channels_);
  gamma_ = makeParam(backend, "weight", {channels_}, std::vector<float>(c, 1.0f));
  beta_ = makeParam(backend, "bias", {channels_}, std::vector<float>(c, 0.0f));
  // Running statistics: no gradient, so the optimizer, the gradient buckets and zeroGrad
  // leave them alone.
  mean_ =
      Param{"running_mean", toDevice(backend, {channels_}, std::vector<float>(c, 0.0f)), {}, {}};
  var_ = Param{"running_var", toDevice(backend, {channels_}, std::vector<float>(c, 1.0f)), {}, {}};
}

Tensor BatchNorm::forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) {
  Tensor y = backend_->empty(x.shape());
  if (!ctx.training) {
    backend_->batchNorm(x, gamma_.value, beta_.value, eps_, false, mean_.value, var_.value, y);
    stash.clear();
    return y;
  }
  const int64_t values = x.numel() / channels_;  // per channel, over the batch
  TANDEM_CHECK_MSG(
      values > 1, InvalidArgument,
      "batchnorm: training needs more than one value per channel, got input " << x.shape());
  Tensor mean = backend_->empty({channels_});
  Tensor var = backend_->empty({channels_});
  backend_->batchNorm(x, gamma_.value, beta_.value, eps_, true, mean, var, y);
  if (!ctx.recompute) {
    const float unbiased = static_cast<float>(values) / static_cast<float>(values - 1);
    backend_->axpby(momentum_, mean, 1.0f - momentum_, mean_.value);
    backend_->axpby(momentum_ * unbiased, var, 1.0f - momentum_, var_.value);
  }
  stash.saved = {x, mean, var};
  return y;
}

Tensor BatchNorm::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  TANDEM_CHECK_MSG(stash.saved.size() == 3, InvalidArgument,
                   "batchnorm: backward of a forward that did not train");
  const Tensor& x = stash.saved[0];
  Tensor dx = backend_->empty(x.shape());  // the kernel computes dx with the sums anyway
  backend_->batchNormBackward(dy, x, gamma_.value, stash.saved[1], stash.saved[2], eps_, dx,
                              gamma_.grad, beta_.grad);
  return need_dx ? dx : Tensor();
}

LayerSpec BatchNorm::spec() const {
  LayerSpec s;
  s.type = type();
  s.attrs["eps"] = static_cast<double>(eps_);
  s.attrs["momentum"] = static_cast<double>(momentum_);
  return s;
}

std::vector<OpUse> BatchNorm::ops(bool training) const {
  return f32Ops(training, {Op::kBatchNorm, Op::kAxpby}, {Op::kBatchNormBackward});
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
