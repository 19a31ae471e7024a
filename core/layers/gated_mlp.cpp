#include "core/layers/gated_mlp.h"

#include <cmath>

#include "core/error.h"

namespace tandem {

SwiGlu::SwiGlu(const LayerSpec& spec) {
  SpecReader r(spec);
  hidden_ = r.integer("hidden");
  format_ = WeightFormat::read(r);
  r.finish();
  TANDEM_CHECK_MSG(hidden_ > 0, InvalidArgument,
                   "swiglu: 'hidden' must be positive, got " << hidden_);
}

Shape SwiGlu::infer(const Shape& input) {
  TANDEM_CHECK_MSG(input.rank() >= 1 && input[input.rank() - 1] > 0, InvalidArgument,
                   "expected input [..., features], got " << input);
  dim_ = input[input.rank() - 1];
  if (format_.int8) {
    format_.groupFor(dim_, "swiglu");
    format_.groupFor(hidden_, "swiglu");
  }
  local_ = part_ ? part_->width() : hidden_;
  return input;
}

void SwiGlu::splitTensor(Group& group, const std::vector<double>& shares, uint64_t& next_tag) {
  TANDEM_CHECK_MSG(dim_ > 0, InvalidArgument, "swiglu: a tensor split comes after setup");
  TANDEM_CHECK_MSG(!format_.int8, InvalidArgument,
                   "swiglu: int8 weights cannot be tensor-split (they are for inference only)");
  part_ = blockPart(group, shares, hidden_, "swiglu", next_tag);
}

// PyTorch's nn.Linear initialisation for each of the three products.
void SwiGlu::build(Backend& backend, Rng& rng) {
  backend_ = &backend;
  const float in_bound = 1.0f / std::sqrt(static_cast<float>(dim_));
  const float hidden_bound = 1.0f / std::sqrt(static_cast<float>(hidden_));
  if (part_) {  // the whole layer's draws, sliced
    const int64_t b = part_->begin, e = part_->end;
    const std::vector<float> gate = uniformInit(rng, hidden_ * dim_, in_bound);
    const std::vector<float> up = uniformInit(rng, hidden_ * dim_, in_bound);
    const std::vector<float> down = uniformInit(rng, dim_ * hidden_, hidden_bound);
    gate_.buildPart(backend, "gate.weight", gate, rowsOf(hidden_, dim_, b, e));
    up_.buildPart(backend, "up.weight", up, rowsOf(hidden_, dim_, b, e));
    down_.buildPart(backend, "down.weight", down, columnsOf(dim_, hidden_, b, e));
    return;
  }
  gate_.build(backend, rng, "gate.weight", hidden_, dim_, in_bound, format_, "swiglu");
  up_.build(backend, rng, "up.weight", hidden_, dim_, in_bound, format_, "swiglu");
  down_.build(backend, rng, "down.weight", dim_, hidden_, hidden_bound, format_, "swiglu");
}

std::vector<Param*> SwiGlu::params() {
  std::vector<Param*> out;
  for (WeightMatrix* w : {&gate_, &up_, &down_})
    for (Param* p : w->params()) out.push_back(p);
  return out;
}

int64_t SwiGlu::paramBytes() const {
  return 2 * weightBytes(format_, local_, dim_) + weightBytes(format_, dim_, local_);
}

// Stash: x [rows, D], gate and up outputs [rows, hidden]; the SiLU and the product are
// recomputed in backward (two element-wise passes instead of 2 * hidden floats a row).
Tensor SwiGlu::forward(const Tensor& x, Stash& stash, const ForwardContext&) {
  Backend& be = *backend_;
  const int64_t rows = x.numel() / dim_;
  const Tensor x2 = x.reshape({rows, dim_});
  Tensor g = be.empty({rows, local_});
  Tensor u = be.empty({rows, local_});
  gate_.forward(be, x2, g);
  up_.forward(be, x2, u);
  Tensor h = be.empty({rows, local_});
  be.activation(Activation::kSiLU, g, h);
  be.mul(h, u, h);
  Tensor y = be.empty({rows, dim_});
  down_.forward(be, h, y);
  if (part_) allreducePart(be, y, *part_, 0);
  stash.saved = {x2, g, u};
  return y.reshape(x.shape());
}

Tensor SwiGlu::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  Tensor dx = backwardInput(dy, stash);  // the weights' gradients need dgate and dup anyway
  backwardWeights(stash);
  return need_dx ? dx : Tensor();
}

// With a = silu(g), h = a u: dh = dy Wd, du = dh a, dg = silu'(g) dh u, dx = dg Wg + du Wu.
// Leaves x, h, dy, dg and du in the stash for backwardWeights.
Tensor SwiGlu::backwardInput(const Tensor& dy, Stash& stash) {
  TANDEM_CHECK_MSG(stash.saved.size() == 3, InvalidArgument, "swiglu: backward without forward");
  Backend& be = *backend_;
  const Tensor x2 = stash.saved[0], g = stash.saved[1], u = stash.saved[2];
  const int64_t rows = x2.shape()[0];
  const Tensor dy2 = dy.reshape({rows, dim_});
  Tensor a = be.empty({rows, local_});
  be.activation(Activation::kSiLU, g, a);
  Tensor dh = be.empty({rows, local_});
  be.gemm(false, false, 1.0f, dy2, down_.trainable().value, 0.0f, dh);
  Tensor du = be.empty({rows, local_});
  be.mul(dh, a, du);
  be.mul(dh, u, dh);  // now d(a)
  Tensor dg = be.empty({rows, local_});
  be.activationBackward(Activation::kSiLU, g, a, dh, dg);
  be.mul(a, u, a);  // now h, for down's gradient
  Tensor dx = be.empty({rows, dim_});
  be.gemm(false, false, 1.0f, dg, gate_.trainable().value, 0.0f, dx);
  be.gemm(false, false, 1.0f, du, up_.trainable().value, 1.0f, dx);
  if (part_) allreducePart(be, dx, *part_, 1);
  stash.saved = {x2, a, dy2, dg, du};
  return dx.reshape(dy.shape());
}

void SwiGlu::backwardWeights(Stash& stash) {
  TANDEM_CHECK_MSG(stash.saved.size() == 5, InvalidArgument,
                   "swiglu: backwardWeights without backwardInput");
  Backend& be = *backend_;
  const Tensor &x2 = stash.saved[0], &h = stash.saved[1], &dy2 = stash.saved[2];
  be.gemm(true, false, 1.0f, dy2, h, 1.0f, down_.trainable().grad);
  be.gemm(true, false, 1.0f, stash.saved[3], x2, 1.0f, gate_.trainable().grad);
  be.gemm(true, false, 1.0f, stash.saved[4], x2, 1.0f, up_.trainable().grad);
  stash.clear();
}

int64_t SwiGlu::flops() const {
  const int64_t rows = inputShape().numel() / dim_;
  return rows * (3 * 2 * dim_ * local_ + 10 * local_);  // SiLU counted as ~9, the product 1
}

int64_t SwiGlu::stashBytes() const {
  const int64_t rows = inputShape().numel() / dim_;
  return rows * (dim_ + 2 * local_) * 4;
}

// Backward's a (then h), dh, du and dg: four [rows, hidden] beside the gradients in and out.
int64_t SwiGlu::workspaceBytes(int64_t batch) const {
  const int64_t rows = inputShape().numel() / dim_;
  return batch * rows * 4 * local_ * 4;
}

LayerSpec SwiGlu::spec() const {
  LayerSpec s;
  s.type = type();
  s.attrs["hidden"] = hidden_;
  format_.write(s);
  return s;
}

std::vector<OpUse> SwiGlu::ops(bool training) const {
  return unionOps(
      {{weightOp(format_)},
       f32Ops(training, {Op::kActivation, Op::kMul}, {Op::kGemm, Op::kActivationBackward})});
}

}  // namespace tandem
