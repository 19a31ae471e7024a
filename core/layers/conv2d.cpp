#include "core/layers/conv2d.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tandem {

Conv2d::Conv2d(const LayerSpec& spec) {
  SpecReader r(spec);
  out_channels_ = r.integer("out");
  in_channels_ = r.integer("in", 0);
  std::tie(g_.kernel_h, g_.kernel_w) = r.pair("kernel");
  std::tie(g_.stride_h, g_.stride_w) = r.pair("stride", 1);
  std::tie(g_.pad_h, g_.pad_w) = r.pair("padding", 0);
  bias_ = r.flag("bias", true);
  r.finish();
  TANDEM_CHECK_MSG(out_channels_ > 0, InvalidArgument,
                   "conv2d: 'out' must be positive, got " << out_channels_);
  TANDEM_CHECK_MSG(g_.kernel_h > 0 && g_.kernel_w > 0 && g_.stride_h > 0 && g_.stride_w > 0 &&
                       g_.pad_h >= 0 && g_.pad_w >= 0,
                   InvalidArgument, "conv2d: kernel and stride must be positive, padding >= 0");
}

Shape Conv2d::infer(const Shape& input) {
  TANDEM_CHECK_MSG(input.rank() == 3, InvalidArgument, "expected input [C, H, W], got " << input);
  TANDEM_CHECK_MSG(in_channels_ == 0 || in_channels_ == input[0], InvalidArgument,
                   "expected input [" << in_channels_ << ", H, W], got " << input);
  in_channels_ = input[0];
  g_.channels = input[0];
  g_.height = input[1];
  g_.width = input[2];
  TANDEM_CHECK_MSG(input[1] + 2 * g_.pad_h >= g_.kernel_h && input[2] + 2 * g_.pad_w >= g_.kernel_w,
                   InvalidArgument,
                   "kernel " << g_.kernel_h << "x" << g_.kernel_w << " does not fit input " << input
                             << " with padding " << g_.pad_h << "x" << g_.pad_w);
  return {out_channels_, g_.outHeight(), g_.outWidth()};
}

void Conv2d::build(Backend& backend, Rng& rng) {
  backend_ = &backend;
  const int64_t fan_in = in_channels_ * g_.kernel_h * g_.kernel_w;
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  weight_ = makeParam(backend, "weight", {out_channels_, in_channels_, g_.kernel_h, g_.kernel_w},
                      uniformInit(rng, out_channels_ * fan_in, bound));
  if (bias_)
    b_ = makeParam(backend, "bias", {out_channels_}, uniformInit(rng, out_channels_, bound));
}

std::vector<Param*> Conv2d::params() {
  if (bias_) return {&weight_, &b_};
  return {&weight_};
}

Tensor Conv2d::forward(const Tensor& x, Stash& stash, const ForwardContext&) {
  Tensor y = backend_->empty({x.shape()[0], out_channels_, g_.outHeight(), g_.outWidth()});
  backend_->conv2d(x, weight_.value, bias_ ? b_.value : Tensor(), g_, y);
  stash.saved = {x};
  return y;
}

Tensor Conv2d::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  const Tensor& x = stash.saved.at(0);
  backend_->conv2dBackwardWeight(x, dy, g_, weight_.grad, bias_ ? b_.grad : Tensor());
  if (!need_dx) return Tensor();
  Tensor dx = backend_->empty(x.shape());
  backend_->conv2dBackwardData(dy, weight_.value, g_, dx);
  return dx;
}

int64_t Conv2d::workspaceBytes(int64_t batch) const {
  // What a backend that composes convolution allocates (the column buffer and, for a chunk
  // of several samples, the channel-major output; for a batched weight gradient the
  // columns sample by sample and the partial gradients); the CPU's kernels take less: a
  // tile of at most 256 KiB per thread.
  const int64_t ohw = g_.outHeight() * g_.outWidth();
  const int64_t c = convColumnChunk(g_, out_channels_, batch);
  const int64_t k = in_channels_ * g_.kernel_h * g_.kernel_w;
  const int64_t col = k * c * ohw;
  const int64_t composed = col + (c > 1 ? out_channels_ * c * ohw : 0);
  const int64_t group = convWeightGradGroup(g_, out_channels_, c);
  const int64_t batched = group > 0 ? 2 * col + group * out_channels_ * k : 0;
  return std::max(composed, batched) * 4;
}

int64_t Conv2d::paramCount() const {
  return out_channels_ * in_channels_ * g_.kernel_h * g_.kernel_w + (bias_ ? out_channels_ : 0);
}

int64_t Conv2d::flops() const {
  const int64_t ohw = g_.outHeight() * g_.outWidth();
  return ohw * out_channels_ * (2 * in_channels_ * g_.kernel_h * g_.kernel_w + (bias_ ? 1 : 0));
}

LayerSpec Conv2d::spec() const {
  LayerSpec s;
  s.type = type();
  s.attrs["out"] = out_channels_;
  if (in_channels_) s.attrs["in"] = in_channels_;
  s.attrs["kernel"] = std::vector<int64_t>{g_.kernel_h, g_.kernel_w};
  s.attrs["stride"] = std::vector<int64_t>{g_.stride_h, g_.stride_w};
  s.attrs["padding"] = std::vector<int64_t>{g_.pad_h, g_.pad_w};
  if (!bias_) s.attrs["bias"] = std::string("false");
  return s;
}

std::vector<OpUse> Conv2d::ops(bool training) const {
  return f32Ops(training, {Op::kConv2d}, {Op::kConv2dBackwardData, Op::kConv2dBackwardWeight});
}

}  // namespace tandem
