#include "core/layers/pooling.h"

#include "core/error.h"

namespace tandem {

Pool2d::Pool2d(Kind kind, const LayerSpec& spec) : kind_(kind) {
  SpecReader r(spec);
  std::tie(g_.kernel_h, g_.kernel_w) = r.pair("kernel");
  // PyTorch's convention: the stride defaults to the kernel size.
  std::tie(g_.stride_h, g_.stride_w) =
      r.has("stride") ? r.pair("stride") : std::pair{g_.kernel_h, g_.kernel_w};
  std::tie(g_.pad_h, g_.pad_w) = r.pair("padding", 0);
  g_.ceil = r.flag("ceil", false);
  r.finish();
  TANDEM_CHECK_MSG(!g_.ceil || kind == Kind::kMax, InvalidArgument,
                   type() << ": 'ceil' is for maxpool2d only");
  TANDEM_CHECK_MSG(g_.kernel_h > 0 && g_.kernel_w > 0 && g_.stride_h > 0 && g_.stride_w > 0,
                   InvalidArgument, type() << ": kernel and stride must be positive");
  TANDEM_CHECK_MSG(
      g_.pad_h >= 0 && 2 * g_.pad_h <= g_.kernel_h && g_.pad_w >= 0 && 2 * g_.pad_w <= g_.kernel_w,
      InvalidArgument, type() << ": padding must be in [0, kernel / 2]");
}

Shape Pool2d::infer(const Shape& input) {
  TANDEM_CHECK_MSG(input.rank() == 3, InvalidArgument, "expected input [C, H, W], got " << input);
  g_.channels = input[0];
  g_.height = input[1];
  g_.width = input[2];
  TANDEM_CHECK_MSG(
      input[1] + 2 * g_.pad_h >= g_.kernel_h && input[2] + 2 * g_.pad_w >= g_.kernel_w,
      InvalidArgument,
      "window " << g_.kernel_h << "x" << g_.kernel_w << " does not fit input " << input);
  return {input[0], g_.outHeight(), g_.outWidth()};
}

Tensor Pool2d::forward(const Tensor& x, Stash& stash, const ForwardContext&) {
  const Shape ys = outputShape().withBatch(x.shape()[0]);
  Tensor y = backend_->empty(ys);
  if (kind_ == Kind::kMax) {
    Tensor arg = backend_->empty(ys, DType::kI32);
    backend_->maxPool(x, g_, y, arg);
    stash.saved = {arg};
  } else {
    backend_->avgPool(x, g_, y);
  }
  return y;
}

Tensor Pool2d::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  if (!need_dx) return {};
  Tensor dx = backend_->empty(inputShape().withBatch(dy.shape()[0]));
  if (kind_ == Kind::kMax) {
    backend_->maxPoolBackward(dy, stash.saved.at(0), g_, dx);
  } else {
    backend_->avgPoolBackward(dy, g_, dx);
  }
  return dx;
}

int64_t Pool2d::flops() const { return outputShape().numel() * g_.kernel_h * g_.kernel_w; }

int64_t Pool2d::stashBytes() const { return kind_ == Kind::kMax ? outputShape().numel() * 4 : 0; }

LayerSpec Pool2d::spec() const {
  LayerSpec s;
  s.type = type();
  s.attrs["kernel"] = std::vector<int64_t>{g_.kernel_h, g_.kernel_w};
  s.attrs["stride"] = std::vector<int64_t>{g_.stride_h, g_.stride_w};
  s.attrs["padding"] = std::vector<int64_t>{g_.pad_h, g_.pad_w};
  if (g_.ceil) s.attrs["ceil"] = std::string("true");
  return s;
}

GlobalAvgPool::GlobalAvgPool(const LayerSpec& spec) { SpecReader(spec).finish(); }

Shape GlobalAvgPool::infer(const Shape& input) {
  TANDEM_CHECK_MSG(input.rank() == 3, InvalidArgument, "expected input [C, H, W], got " << input);
  g_ = Window2d{input[0], input[1], input[2], input[1], input[2], 1, 1, 0, 0};
  return {input[0]};
}

Tensor GlobalAvgPool::forward(const Tensor& x, Stash&, const ForwardContext&) {
  const int64_t n = x.shape()[0];
  Tensor y = backend_->empty({n, g_.channels, 1, 1});
  backend_->avgPool(x, g_, y);
  return y.reshape({n, g_.channels});
}

Tensor GlobalAvgPool::backward(const Tensor& dy, Stash&, bool need_dx) {
  if (!need_dx) return {};
  const int64_t n = dy.shape()[0];
  Tensor dx = backend_->empty(inputShape().withBatch(n));
  backend_->avgPoolBackward(dy.reshape({n, g_.channels, 1, 1}), g_, dx);
  return dx;
}

std::vector<OpUse> Pool2d::ops(bool training) const {
  if (kind_ == Kind::kMax) return f32Ops(training, {Op::kMaxPool}, {Op::kMaxPoolBackward});
  return f32Ops(training, {Op::kAvgPool}, {Op::kAvgPoolBackward});
}

std::vector<OpUse> GlobalAvgPool::ops(bool training) const {
  return f32Ops(training, {Op::kAvgPool}, {Op::kAvgPoolBackward});
}

}  // namespace tandem
