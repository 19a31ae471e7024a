#include "core/layers/conv2d.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tandem {

namespace {
// Column-buffer budget in elements (4 MiB of f32): big enough for full-speed GEMMs,
// small enough to stay in cache-friendly territory and off the memory peak.
constexpr int64_t kColumnBudget = int64_t{1} << 20;
}  // namespace

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

int64_t Conv2d::chunk(int64_t n) const {
  // Both the column buffer and the channel-major output buffer stay within the budget.
  const int64_t ohw = g_.outHeight() * g_.outWidth();
  const int64_t per_sample =
      std::max(in_channels_ * g_.kernel_h * g_.kernel_w, out_channels_) * ohw;
  return std::clamp<int64_t>(kColumnBudget / std::max<int64_t>(per_sample, 1), 1,
                             std::max<int64_t>(n, 1));
}

Tensor Conv2d::forward(const Tensor& x, Stash& stash, const ForwardContext&) {
  const int64_t n = x.shape()[0];
  const int64_t k = in_channels_ * g_.kernel_h * g_.kernel_w;
  const int64_t ohw = g_.outHeight() * g_.outWidth();
  const int64_t oc = out_channels_;
  const Tensor w2 = weight_.value.reshape({oc, k});
  Tensor y = backend_->empty({n, oc, g_.outHeight(), g_.outWidth()});
  const int64_t c = chunk(n);
  Tensor col = backend_->empty({k, c * ohw});
  Tensor tmp = c > 1 ? backend_->empty({oc, c * ohw}) : Tensor();
  for (int64_t n0 = 0; n0 < n; n0 += c) {
    const int64_t cn = std::min(c, n - n0);
    const Tensor colv = col.head({k, cn * ohw});
    backend_->im2col(x.slice(n0, cn), g_, colv);
    if (cn == 1) {
      backend_->gemm(false, false, 1.0f, w2, colv, 0.0f, y.slice(n0, 1).reshape({oc, ohw}));
    } else {
      const Tensor t = tmp.head({oc, cn * ohw});
      backend_->gemm(false, false, 1.0f, w2, colv, 0.0f, t);
      backend_->transpose01(t.reshape({oc, cn, ohw}), y.slice(n0, cn).reshape({cn, oc, ohw}));
    }
  }
  if (bias_) backend_->addBias(y, b_.value);
  stash.saved = {x};
  return y;
}

Tensor Conv2d::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  const Tensor& x = stash.saved.at(0);
  const int64_t n = x.shape()[0];
  const int64_t k = in_channels_ * g_.kernel_h * g_.kernel_w;
  const int64_t ohw = g_.outHeight() * g_.outWidth();
  const int64_t oc = out_channels_;
  const Tensor w2 = weight_.value.reshape({oc, k});
  const Tensor dw2 = weight_.grad.reshape({oc, k});
  if (bias_) backend_->biasGrad(dy, b_.grad);
  Tensor dx = need_dx ? backend_->empty(x.shape()) : Tensor();
  const int64_t c = chunk(n);
  Tensor col = backend_->empty({k, c * ohw});
  Tensor tmp = c > 1 ? backend_->empty({oc, c * ohw}) : Tensor();
  for (int64_t n0 = 0; n0 < n; n0 += c) {
    const int64_t cn = std::min(c, n - n0);
    Tensor dyt;  // [oc, cn * ohw], channel-major
    if (cn == 1) {
      dyt = dy.slice(n0, 1).reshape({oc, ohw});
    } else {
      dyt = tmp.head({oc, cn * ohw});
      backend_->transpose01(dy.slice(n0, cn).reshape({cn, oc, ohw}), dyt.reshape({oc, cn, ohw}));
    }
    const Tensor colv = col.head({k, cn * ohw});
    backend_->im2col(x.slice(n0, cn), g_, colv);
    backend_->gemm(false, true, 1.0f, dyt, colv, 1.0f, dw2);
    if (need_dx) {  // the column buffer is free again: reuse it for d(col)
      backend_->gemm(true, false, 1.0f, w2, dyt, 0.0f, colv);
      backend_->col2im(colv, g_, dx.slice(n0, cn));
    }
  }
  return dx;
}

int64_t Conv2d::workspaceBytes(int64_t batch) const {
  // The column buffer, and the channel-major output of a chunk of more than one sample.
  const int64_t ohw = g_.outHeight() * g_.outWidth();
  const int64_t c = chunk(batch);
  const int64_t col = in_channels_ * g_.kernel_h * g_.kernel_w * c * ohw;
  return (col + (c > 1 ? out_channels_ * c * ohw : 0)) * 4;
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
  const std::initializer_list<Op> forward = {Op::kIm2col, Op::kGemm, Op::kTranspose01};
  std::vector<OpUse> out = f32Ops(training, forward, {Op::kCol2im});
  if (bias_) out = unionOps({out, f32Ops(training, {Op::kAddBias}, {Op::kBiasGrad})});
  return out;
}

}  // namespace tandem
