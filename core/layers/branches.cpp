#include "core/layers/branches.h"

#include "core/error.h"

namespace tandem {

Chain::Chain(const LayerSpec& spec) : layers_(spec.children) {
  SpecReader(spec).finish();
  TANDEM_CHECK_MSG(!layers_.empty(), InvalidArgument, "chain: 'layers' must not be empty");
}

Shape Chain::infer(const Shape& input) { return setSequence(input, layers_); }

LayerSpec Chain::spec() const { return {type(), {}, body().specs(), {}}; }

Concat::Concat(const LayerSpec& spec) : branches_(spec.children) {
  SpecReader(spec).finish();
  TANDEM_CHECK_MSG(branches_.size() >= 2, InvalidArgument,
                   "concat: 'layers' must list two or more branches");
}

Shape Concat::infer(const Shape& input) {
  channels_.clear();
  Shape first;
  for (size_t k = 0; k < branches_.size(); ++k) {
    Shape out;
    try {
      out = branches_.layer(k).setup(input);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("concat: branch " + std::to_string(k) + " (" +
                            branches_.layer(k).type() + "): " + e.what());
    }
    TANDEM_CHECK_MSG(out.rank() >= 1, InvalidArgument,
                     "concat: branch " << k << " gives a scalar sample");
    if (k == 0) first = out;
    TANDEM_CHECK_MSG(out.dropFirst() == first.dropFirst(), InvalidArgument,
                     "concat: branch " << k << " gives " << out << ", branch 0 " << first
                                       << ": they must agree past the first dimension");
    channels_.push_back(out[0]);
  }
  rest_ = first.dropFirst().numel();
  int64_t total = 0;
  for (int64_t c : channels_) total += c;
  std::vector<int64_t> dims = first.dims();
  dims[0] = total;
  return Shape(dims);
}

void Concat::build(Backend& backend, Rng& rng) {
  backend_ = &backend;
  branches_.build(backend, rng);
}

// stash.children: one per branch.
Tensor Concat::forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) {
  const int64_t n = x.shape()[0], total = outputShape()[0];
  stash.children.assign(branches_.size(), Stash{});
  Tensor rows = backend_->empty(Shape{total, n, rest_});  // channel-major
  int64_t at = 0;
  for (size_t k = 0; k < branches_.size(); ++k) {
    ForwardContext c = ctx;
    c.seed = combineSeeds(ctx.seed, k);
    const Tensor y = branches_.layer(k).forward(x, stash.children[k], c);
    backend_->transpose01(y.reshape(Shape{n, channels_[k], rest_}), rows.slice(at, channels_[k]));
    at += channels_[k];
  }
  Tensor out = backend_->empty(outputShape().withBatch(n));
  backend_->transpose01(rows, out.reshape(Shape{n, total, rest_}));
  return out;
}

std::vector<Tensor> Concat::split(const Tensor& dy) {
  const int64_t n = dy.shape()[0], total = outputShape()[0];
  Tensor rows = backend_->empty(Shape{total, n, rest_});
  backend_->transpose01(dy.reshape(Shape{n, total, rest_}), rows);
  std::vector<Tensor> parts;
  int64_t at = 0;
  for (size_t k = 0; k < branches_.size(); ++k) {
    Tensor part = backend_->empty(branches_.layer(k).outputShape().withBatch(n));
    backend_->transpose01(rows.slice(at, channels_[k]),
                          part.reshape(Shape{n, channels_[k], rest_}));
    at += channels_[k];
    parts.push_back(part);
  }
  return parts;
}

Tensor Concat::sum(const std::vector<Tensor>& parts) {
  Tensor dx = backend_->empty(parts[0].shape());
  backend_->copy(parts[0], dx);  // (a branch's dx may be a view of what it was given)
  for (size_t k = 1; k < parts.size(); ++k) backend_->axpby(1.0f, parts[k], 1.0f, dx);
  return dx;
}

Tensor Concat::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  const std::vector<Tensor> dys = split(dy);
  std::vector<Tensor> dxs;
  for (size_t k = 0; k < branches_.size(); ++k)
    dxs.push_back(branches_.layer(k).backward(dys[k], stash.children.at(k), need_dx));
  return need_dx ? sum(dxs) : Tensor{};
}

Tensor Concat::backwardInput(const Tensor& dy, Stash& stash) {
  const std::vector<Tensor> dys = split(dy);
  std::vector<Tensor> dxs;
  for (size_t k = 0; k < branches_.size(); ++k)
    dxs.push_back(branches_.layer(k).backwardInput(dys[k], stash.children.at(k)));
  return sum(dxs);
}

void Concat::backwardWeights(Stash& stash) {
  for (size_t k = 0; k < branches_.size(); ++k)
    branches_.layer(k).backwardWeights(stash.children.at(k));
}

int64_t Concat::paramCount() const { return branches_.paramCount(); }

int64_t Concat::paramBytes() const { return branches_.paramBytes(); }

int64_t Concat::flops() const { return branches_.flops(); }

int64_t Concat::stashBytes() const { return branches_.stashBytes(); }

// The channel-major buffer beside the largest scratch of a branch.
int64_t Concat::workspaceBytes(int64_t batch) const {
  return branches_.workspaceBytes(batch) + outputShape().numel() * 4 * batch;
}

std::vector<OpUse> Concat::ops(bool training) const {
  return unionOps(
      {f32Ops(training, {Op::kTranspose01}, {Op::kCopy, Op::kAxpby}), branches_.ops(training)});
}

}  // namespace tandem
