#include "core/layers/channels.h"

#include "core/error.h"
#include "core/layers/spec.h"

namespace tandem {

namespace {

// Values per channel of a sample of `input` (H W of [C, H, W], 1 of [D]).
int64_t perChannel(const std::string& layer, const Shape& input) {
  TANDEM_CHECK_MSG(input.rank() >= 1, InvalidArgument,
                   layer << ": expected a sample of one dimension or more, got " << input);
  return input.dropFirst().numel();
}

}  // namespace

ChannelSlice::ChannelSlice(const LayerSpec& spec) {
  SpecReader r(spec);
  begin_ = r.integer("begin");
  end_ = r.integer("end");
  r.finish();
  TANDEM_CHECK_MSG(
      begin_ >= 0 && end_ > begin_, InvalidArgument,
      "slice: channels [" << begin_ << ", " << end_ << ") must be a non-empty range from 0 on");
}

LayerSpec ChannelSlice::spec() const {
  return {type(), {{"begin", begin_}, {"end", end_}}, {}, {}};
}

Shape ChannelSlice::infer(const Shape& input) {
  rest_ = perChannel("slice", input);
  TANDEM_CHECK_MSG(end_ <= input[0], InvalidArgument,
                   "slice: channels [" << begin_ << ", " << end_ << ") of an input " << input
                                       << " of " << input[0]);
  std::vector<int64_t> dims = input.dims();
  dims[0] = end_ - begin_;
  return Shape(dims);
}

Tensor ChannelSlice::forward(const Tensor& x, Stash&, const ForwardContext&) {
  const int64_t n = x.shape()[0], c = inputShape()[0], count = end_ - begin_;
  Tensor rows = backend_->empty(Shape{c, n, rest_});  // channel-major
  backend_->transpose01(x.reshape(Shape{n, c, rest_}), rows);
  Tensor y = backend_->empty(outputShape().withBatch(n));
  backend_->transpose01(rows.slice(begin_, count), y.reshape(Shape{n, count, rest_}));
  return y;
}

Tensor ChannelSlice::backward(const Tensor& dy, Stash&, bool need_dx) {
  if (!need_dx) return {};
  const int64_t n = dy.shape()[0], c = inputShape()[0], count = end_ - begin_;
  Tensor rows = backend_->empty(Shape{c, n, rest_});
  backend_->fill(rows, 0.0f);
  backend_->transpose01(dy.reshape(Shape{n, count, rest_}), rows.slice(begin_, count));
  Tensor dx = backend_->empty(inputShape().withBatch(n));
  backend_->transpose01(rows, dx.reshape(Shape{n, c, rest_}));
  return dx;
}

std::vector<OpUse> ChannelSlice::ops(bool training) const {
  return f32Ops(training, {Op::kTranspose01}, {Op::kTranspose01, Op::kFill});
}

int64_t ChannelSlice::workspaceBytes(int64_t batch) const {
  return inputShape().numel() * 4 * batch;
}

ChannelShuffle::ChannelShuffle(const LayerSpec& spec) {
  SpecReader r(spec);
  groups_ = r.integer("groups");
  r.finish();
  TANDEM_CHECK_MSG(groups_ >= 1, InvalidArgument,
                   "channel_shuffle: 'groups' is " << groups_ << ", not 1 or more");
}

LayerSpec ChannelShuffle::spec() const { return {type(), {{"groups", groups_}}, {}, {}}; }

Shape ChannelShuffle::infer(const Shape& input) {
  rest_ = perChannel("channel_shuffle", input);
  TANDEM_CHECK_MSG(input[0] % groups_ == 0, InvalidArgument,
                   "channel_shuffle: " << groups_ << " groups do not divide the " << input[0]
                                       << " channels of " << input);
  return input;
}

Tensor ChannelShuffle::shuffle(const Tensor& x, int64_t groups) const {
  const int64_t n = x.shape()[0], c = inputShape()[0], k = c / groups;
  Tensor rows = backend_->empty(Shape{c, n, rest_});
  backend_->transpose01(x.reshape(Shape{n, c, rest_}), rows);
  Tensor swapped = backend_->empty(Shape{c, n, rest_});
  backend_->transpose01(rows.reshape(Shape{groups, k, n * rest_}),
                        swapped.reshape(Shape{k, groups, n * rest_}));
  Tensor y = backend_->empty(x.shape());
  backend_->transpose01(swapped, y.reshape(Shape{n, c, rest_}));
  return y;
}

Tensor ChannelShuffle::forward(const Tensor& x, Stash&, const ForwardContext&) {
  return shuffle(x, groups_);
}

// The inverse permutation: the shuffle with K groups.
Tensor ChannelShuffle::backward(const Tensor& dy, Stash&, bool need_dx) {
  if (!need_dx) return {};
  return shuffle(dy, inputShape()[0] / groups_);
}

std::vector<OpUse> ChannelShuffle::ops(bool training) const {
  return f32Ops(training, {Op::kTranspose01}, {Op::kTranspose01});
}

int64_t ChannelShuffle::workspaceBytes(int64_t batch) const {
  return 2 * inputShape().numel() * 4 * batch;
}

}  // namespace tandem
