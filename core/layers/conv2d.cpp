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
  groups_ = r.integer("groups", 1);
  r.finish();
  TANDEM_CHECK_MSG(out_channels_ > 0, InvalidArgument,
                   "conv2d: 'out' must be positive, got " << out_channels_);
  TANDEM_CHECK_MSG(
      groups_ > 0 && out_channels_ % groups_ == 0, InvalidArgument,
      "conv2d: 'groups' " << groups_ << " must be positive and divide 'out' " << out_channels_);
  TANDEM_CHECK_MSG(g_.kernel_h > 0 && g_.kernel_w > 0 && g_.stride_h > 0 && g_.stride_w > 0 &&
                       g_.pad_h >= 0 && g_.pad_w >= 0,
                   InvalidArgument, "conv2d: kernel and stride must be positive, padding >= 0");
}

Shape Conv2d::infer(const Shape& input) {
  TANDEM_CHECK_MSG(input.rank() == 3, InvalidArgument, "expected input [C, H, W], got " << input);
  const int64_t channels = row() ? part_->width() : in_channels_;  // a row part's: its slice
  TANDEM_CHECK_MSG(channels == 0 || channels == input[0], InvalidArgument,
                   "expected input [" << channels << ", H, W], got " << input);
  TANDEM_CHECK_MSG(
      input[0] % groups_ == 0, InvalidArgument,
      "conv2d: 'groups' " << groups_ << " must divide the input's " << input[0] << " channels");
  if (!row()) in_channels_ = input[0];
  g_.channels = input[0];
  g_.height = input[1];
  g_.width = input[2];
  gg_ = g_;
  gg_.channels = input[0] / groups_;
  TANDEM_CHECK_MSG(input[1] + 2 * g_.pad_h >= g_.kernel_h && input[2] + 2 * g_.pad_w >= g_.kernel_w,
                   InvalidArgument,
                   "kernel " << g_.kernel_h << "x" << g_.kernel_w << " does not fit input " << input
                             << " with padding " << g_.pad_h << "x" << g_.pad_w);
  return {outs(), g_.outHeight(), g_.outWidth()};
}

void Conv2d::setTensorPart(const TensorPart& part) {
  TANDEM_CHECK_MSG(in_channels_ > 0, InvalidArgument, "conv2d: a tensor part is set after setup");
  TANDEM_CHECK_MSG(
      groups_ == 1, InvalidArgument,
      "conv2d: a grouped convolution (groups " << groups_ << ") cannot be tensor-split");
  checkTensorPart(part, splitFeatures(part.split), "conv2d");
  part_ = part;
}

// The whole layer's draws (weight, then bias), sliced: a column part's output channels
// (rows of [OC, C * kh * kw]), a row part's input channels (a run of each row).
void Conv2d::buildPart(Backend& backend, Rng& rng) {
  const int64_t kk = g_.kernel_h * g_.kernel_w, fan_in = in_channels_ * kk;
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  const std::vector<float> w = uniformInit(rng, out_channels_ * fan_in, bound);
  const std::vector<float> b =
      bias_ ? uniformInit(rng, out_channels_, bound) : std::vector<float>{};
  const int64_t b0 = part_->begin, e0 = part_->end, oc = out_channels_;
  weight_ = makePartParam(
      backend, "weight", {outs(), g_.channels, g_.kernel_h, g_.kernel_w}, w,
      column() ? rowsOf(oc, fan_in, b0, e0) : columnsOf(oc, fan_in, b0 * kk, e0 * kk));
  // A column part's biases for its channels; a row part's whole (replicated).
  if (!bias_) return;
  b_ = column() ? makePartParam(backend, "bias", {e0 - b0}, b, rowsOf(oc, 1, b0, e0))
                : makeParam(backend, "bias", {oc}, b);
}

void Conv2d::build(Backend& backend, Rng& rng) {
  backend_ = &backend;
  if (part_) return buildPart(backend, rng);
  const int64_t fan_in = gg_.channels * g_.kernel_h * g_.kernel_w;  // (PyTorch's, per group)
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  weight_ = makeParam(backend, "weight", {out_channels_, gg_.channels, g_.kernel_h, g_.kernel_w},
                      uniformInit(rng, out_channels_ * fan_in, bound));
  if (bias_)
    b_ = makeParam(backend, "bias", {out_channels_}, uniformInit(rng, out_channels_, bound));
}

std::vector<Param*> Conv2d::params() {
  if (bias_) return {&weight_, &b_};
  return {&weight_};
}

Tensor Conv2d::byGroup(const Tensor& x) const {
  const Shape& s = x.shape();
  const int64_t per = s.numel() / (s[0] * groups_);  // one sample's group
  Tensor t = backend_->empty({groups_, s[0], s[1] / groups_, s[2], s[3]});
  backend_->transpose01(x.reshape({s[0], groups_, per}), t.reshape({groups_, s[0], per}));
  return t;
}

Tensor Conv2d::bySample(const Tensor& t, int64_t channels) const {
  const Shape& s = t.shape();  // [G, n, C/G, H, W]
  const int64_t per = s.numel() / (s[0] * s[1]);
  Tensor x = backend_->empty({s[1], channels, s[3], s[4]});
  backend_->transpose01(t.reshape({s[0], s[1], per}), x.reshape({s[1], s[0], per}));
  return x;
}

Tensor Conv2d::forward(const Tensor& x, Stash& stash, const ForwardContext&) {
  const int64_t n = x.shape()[0], oh = g_.outHeight(), ow = g_.outWidth();
  if (groups_ == 1) {
    Tensor y = backend_->empty({n, outs(), oh, ow});
    // A row part's partial sums meet in the all-reduce: rank 0's carries the bias.
    const bool add_bias = bias_ && (!row() || part_->group->rank() == 0);
    backend_->conv2d(x, weight_.value, add_bias ? b_.value : Tensor(), g_, y);
    if (row()) allreducePart(*backend_, y, *part_, 0);
    stash.saved = {x};
    return y;
  }
  if (depthwise()) {
    Tensor y = backend_->empty({n, out_channels_, oh, ow});
    backend_->depthwiseConv2d(x, weight_.value, g_, y);
    if (bias_) backend_->addBias(y, b_.value);
    stash.saved = {x};
    return y;
  }
  const int64_t og = out_channels_ / groups_;
  Tensor xt = byGroup(x);
  Tensor yt = backend_->empty({groups_, n, og, oh, ow});
  for (int64_t k = 0; k < groups_; ++k)
    backend_->conv2d(xt.slice(k, 1).reshape({n, gg_.channels, g_.height, g_.width}),
                     weight_.value.slice(k * og, og), bias_ ? b_.value.slice(k * og, og) : Tensor(),
                     gg_, yt.slice(k, 1).reshape({n, og, oh, ow}));
  stash.saved = {xt};  // (the weight gradient reads the groups)
  return bySample(yt, out_channels_);
}

Tensor Conv2d::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  const Tensor& x = stash.saved.at(0);
  if (groups_ == 1) {
    backend_->conv2dBackwardWeight(x, dy, g_, weight_.grad, bias_ ? b_.grad : Tensor());
    if (!need_dx) return Tensor();
    Tensor dx = backend_->empty(x.shape());
    backend_->conv2dBackwardData(dy, weight_.value, g_, dx);
    if (column()) allreducePart(*backend_, dx, *part_, 1);  // every output channel's share
    return dx;
  }
  if (depthwise()) {
    backend_->depthwiseConv2dBackwardWeight(x, dy, g_, weight_.grad);
    if (bias_) backend_->biasGrad(dy, b_.grad);
    if (!need_dx) return Tensor();
    Tensor dx = backend_->empty(x.shape());
    backend_->depthwiseConv2dBackwardData(dy, weight_.value, g_, dx);
    return dx;
  }
  const int64_t n = dy.shape()[0], og = out_channels_ / groups_;
  const Shape in{n, gg_.channels, g_.height, g_.width}, out{n, og, dy.shape()[2], dy.shape()[3]};
  Tensor dyt = byGroup(dy);
  for (int64_t k = 0; k < groups_; ++k)
    backend_->conv2dBackwardWeight(x.slice(k, 1).reshape(in), dyt.slice(k, 1).reshape(out), gg_,
                                   weight_.grad.slice(k * og, og),
                                   bias_ ? b_.grad.slice(k * og, og) : Tensor());
  if (!need_dx) return Tensor();
  Tensor dxt = backend_->empty(x.shape());  // [G, n, C/G, H, W]
  for (int64_t k = 0; k < groups_; ++k)
    backend_->conv2dBackwardData(dyt.slice(k, 1).reshape(out), weight_.value.slice(k * og, og), gg_,
                                 dxt.slice(k, 1).reshape(in));
  return bySample(dxt, in_channels_);
}

int64_t Conv2d::workspaceBytes(int64_t batch) const {
  // What a backend that composes convolution allocates (the column buffer and, for a chunk
  // of several samples, the channel-major output; for a batched weight gradient the
  // columns sample by sample and the partial gradients); the CPU's kernels take no more:
  // a tile of at most 256 KiB per thread, or, where they group samples, the same chunk's
  // columns and outputs (beside at most 2 MiB of packed panels per thread, outside the
  // tensors).
  // Depthwise: the kernels read and write the tensors in place. Grouped: one group's
  // convolution at a time, beside the regrouped input, output and gradients (the input's
  // stays in the stash).
  if (depthwise()) return 0;
  const int64_t ohw = g_.outHeight() * g_.outWidth(), og = outs() / groups_;
  const int64_t c = convColumnChunk(gg_, og, batch);
  const int64_t k = gg_.channels * g_.kernel_h * g_.kernel_w;
  const int64_t col = k * c * ohw;
  const int64_t composed = col + (c > 1 ? og * c * ohw : 0);
  const int64_t group = convWeightGradGroup(gg_, og, c);
  const int64_t batched = group > 0 ? 2 * col + group * og * k : 0;
  const int64_t regrouped =
      groups_ > 1 ? batch * (out_channels_ * ohw + in_channels_ * g_.height * g_.width) : 0;
  return (std::max(composed, batched) + regrouped) * 4;
}

int64_t Conv2d::paramCount() const {
  return outs() * gg_.channels * g_.kernel_h * g_.kernel_w + (bias_ ? outs() : 0);
}

int64_t Conv2d::flops() const {
  const int64_t ohw = g_.outHeight() * g_.outWidth();
  return ohw * outs() * (2 * gg_.channels * g_.kernel_h * g_.kernel_w + (bias_ ? 1 : 0));
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
  if (groups_ != 1) s.attrs["groups"] = groups_;
  return s;
}

std::vector<OpUse> Conv2d::ops(bool training) const {
  if (depthwise())
    return bias_ ? f32Ops(training, {Op::kDepthwiseConv2d, Op::kAddBias},
                          {Op::kDepthwiseConv2dBackwardData, Op::kDepthwiseConv2dBackwardWeight,
                           Op::kBiasGrad})
                 : f32Ops(training, {Op::kDepthwiseConv2d},
                          {Op::kDepthwiseConv2dBackwardData, Op::kDepthwiseConv2dBackwardWeight});
  if (groups_ > 1)  // each group's convolution, the channels regrouped before and after
    return f32Ops(training, {Op::kConv2d, Op::kTranspose01},
                  {Op::kConv2dBackwardData, Op::kConv2dBackwardWeight, Op::kTranspose01});
  return f32Ops(training, {Op::kConv2d}, {Op::kConv2dBackwardData, Op::kConv2dBackwardWeight});
}

}  // namespace tandem
