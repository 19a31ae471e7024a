#include "core/layers/linear.h"

#include <cmath>

#include "core/error.h"

namespace tandem {

Linear::Linear(const LayerSpec& spec) {
  SpecReader r(spec);
  out_ = r.integer("out");
  in_ = r.integer("in", 0);
  bias_ = r.flag("bias", true);
  format_ = WeightFormat::read(r);
  r.finish();
  TANDEM_CHECK_MSG(out_ > 0, InvalidArgument, "linear: 'out' must be positive, got " << out_);
  TANDEM_CHECK_MSG(in_ >= 0, InvalidArgument, "linear: 'in' must be positive, got " << in_);
}

Shape Linear::infer(const Shape& input) {
  TANDEM_CHECK_MSG(input.rank() >= 1, InvalidArgument,
                   "expected input [..., features], got " << input);
  const int64_t features = input[input.rank() - 1];
  if (row()) {
    TANDEM_CHECK_MSG(features == part_->width(), InvalidArgument,
                     "expected input [" << part_->width() << "] (inputs [" << part_->begin << ", "
                                        << part_->end << ") of " << in_
                                        << ": a row-split part), got " << input);
  } else {
    TANDEM_CHECK_MSG(in_ == 0 || in_ == features, InvalidArgument,
                     "expected input [" << in_ << "], got " << input);
    in_ = features;
  }
  if (format_.int8) format_.groupFor(in_, "linear");
  Shape out = input;
  out[out.rank() - 1] = weightRows();
  return out;
}

void Linear::setTensorPart(const TensorPart& part) {
  TANDEM_CHECK_MSG(in_ > 0, InvalidArgument, "linear: a tensor part is set after setup");
  TANDEM_CHECK_MSG(!format_.int8, InvalidArgument,
                   "linear: int8 weights cannot be tensor-split (they are for inference only)");
  checkTensorPart(part, splitFeatures(part.split), "linear");
  part_ = part;
}

void Linear::build(Backend& backend, Rng& rng) {
  backend_ = &backend;
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
  if (part_) return buildPart(backend, rng, bound);
  weight_.build(backend, rng, "weight", out_, in_, bound, format_, "linear");
  if (bias_) b_ = makeParam(backend, "bias", {out_}, uniformInit(rng, out_, bound));
}

// The whole layer's draws (WeightMatrix::build, then the bias), sliced.
void Linear::buildPart(Backend& backend, Rng& rng, float bound) {
  const std::vector<float> w = uniformInit(rng, out_ * in_, bound);
  const std::vector<float> b = bias_ ? uniformInit(rng, out_, bound) : std::vector<float>{};
  const int64_t b0 = part_->begin, e0 = part_->end;
  weight_.buildPart(backend, "weight", w,
                    column() ? rowsOf(out_, in_, b0, e0) : columnsOf(out_, in_, b0, e0));
  // A column part's biases for its outputs; a row part's whole (replicated).
  if (!bias_) return;
  b_ = column() ? makePartParam(backend, "bias", {e0 - b0}, b, rowsOf(out_, 1, b0, e0))
                : makeParam(backend, "bias", {out_}, b);
}

std::vector<Param*> Linear::params() {
  std::vector<Param*> out = weight_.params();
  if (bias_) out.push_back(&b_);
  return out;
}

Tensor Linear::forward(const Tensor& x, Stash& stash, const ForwardContext&) {
  const int64_t cols = weightCols(), outs = weightRows();
  const int64_t rows = x.numel() / cols;
  const Tensor x2 = x.reshape({rows, cols});
  Tensor y = backend_->empty({rows, outs});
  weight_.forward(*backend_, x2, y);
  if (row())
    allreducePart(*backend_, y, *part_,
                  0);  // the partial products summed before the bias, added once
  if (bias_) backend_->addBias(y, b_.value);
  stash.saved = {x2};
  Shape ys = x.shape();
  ys[ys.rank() - 1] = outs;
  return y.reshape(ys);
}

Tensor Linear::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  if (!need_dx) {
    stash.saved.push_back(dy.reshape({stash.saved.at(0).shape()[0], weightRows()}));
    backwardWeights(stash);
    return {};
  }
  Tensor dx = backwardInput(dy, stash);
  backwardWeights(stash);
  return dx;
}

Tensor Linear::backwardInput(const Tensor& dy, Stash& stash) {
  const int64_t rows = stash.saved.at(0).shape()[0], cols = weightCols();
  const Tensor dy2 = dy.reshape({rows, weightRows()});
  Tensor dx = backend_->empty({rows, cols});
  backend_->gemm(false, false, 1.0f, dy2, weight_.trainable().value, 0.0f, dx);
  if (column()) allreducePart(*backend_, dx, *part_, 1);  // every rank's outputs reach every input
  stash.saved.push_back(dy2);                             // for backwardWeights
  Shape xs = dy.shape();
  xs[xs.rank() - 1] = cols;
  return dx.reshape(xs);
}

void Linear::backwardWeights(Stash& stash) {
  TANDEM_CHECK_MSG(stash.saved.size() == 2, InvalidArgument,
                   "linear: backwardWeights without backwardInput");
  const Tensor& x2 = stash.saved[0];
  const Tensor& dy2 = stash.saved[1];
  backend_->gemm(true, false, 1.0f, dy2, x2, 1.0f, weight_.trainable().grad);
  if (bias_) backend_->biasGrad(dy2, b_.grad);
  stash.saved.pop_back();
}

int64_t Linear::paramCount() const {
  return weightRows() * weightCols() + (bias_ ? (column() ? weightRows() : out_) : 0);
}

int64_t Linear::paramBytes() const {
  return weightBytes(format_, weightRows(), weightCols()) +
         (bias_ ? (column() ? weightRows() : out_) * 4 : 0);
}

int64_t Linear::flops() const {
  const int64_t rows = inputShape().numel() / weightCols();
  return rows * (2 * weightCols() * weightRows() + (bias_ ? weightRows() : 0));
}

LayerSpec Linear::spec() const {
  LayerSpec s;
  s.type = type();
  s.attrs["out"] = out_;
  if (in_) s.attrs["in"] = in_;
  if (!bias_) s.attrs["bias"] = std::string("false");
  format_.write(s);
  return s;
}

std::vector<OpUse> Linear::ops(bool training) const {
  // Backward takes f32 gemms with the weight (int8 weights refuse it: weight_matrix.h).
  const std::vector<OpUse> rest = bias_
                                      ? f32Ops(training, {Op::kAddBias}, {Op::kGemm, Op::kBiasGrad})
                                      : f32Ops(training, {}, {Op::kGemm});
  return unionOps({{weightOp(format_)}, rest});
}

}  // namespace tandem
