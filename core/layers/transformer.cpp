#include "core/layers/transformer.h"

#include "core/error.h"

namespace tandem {

TransformerBlock::TransformerBlock(const LayerSpec& spec) {
  SpecReader r(spec);
  heads_ = r.integer("heads");
  mlp_ = r.integer("mlp", 0);
  r.finish();
  TANDEM_CHECK_MSG(heads_ > 0, InvalidArgument,
                   "transformer: 'heads' must be positive, got " << heads_);
  TANDEM_CHECK_MSG(mlp_ >= 0, InvalidArgument, "transformer: 'mlp' must be positive, got " << mlp_);
}

Shape TransformerBlock::infer(const Shape& input) {
  TANDEM_CHECK_MSG(input.rank() == 2 && input[1] > 0, InvalidArgument,
                   "expected input [T, width], got " << input);
  const int64_t width = input[1];
  LayerSpec attention{"attention", {{"heads", heads_}}, {}, {}};
  LayerSpec mlp_in{"linear", {{"out", mlp_ ? mlp_ : 4 * width}}, {}, {}};
  LayerSpec mlp_out{"linear", {{"out", width}}, {}, {}};
  const LayerSpec norm{"layernorm", {}, {}, {}};
  body_ = Sequence({LayerSpec{"residual", {}, {norm, attention}, {}},
                    LayerSpec{"residual", {}, {norm, mlp_in, {"gelu", {}, {}, {}}, mlp_out}, {}}});
  return body_.setup(input);
}

void TransformerBlock::build(Backend& backend, Rng& rng) {
  backend_ = &backend;
  body_.build(backend, rng);
}

Tensor TransformerBlock::forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) {
  return body_.forward(x, stash, ctx, 0, body_.size());
}

Tensor TransformerBlock::decode(const Tensor& x, DecodeState& state) {
  return body_.decode(x, state, 0, body_.size());
}

Tensor TransformerBlock::decodeEach(const Tensor& x, const std::vector<DecodeState*>& states) {
  return body_.decodeEach(x, states, 0, body_.size());
}

Tensor TransformerBlock::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  return body_.backward(dy, stash, need_dx, 0, body_.size());
}

Tensor TransformerBlock::backwardInput(const Tensor& dy, Stash& stash) {
  return body_.backwardInput(dy, stash, 0, body_.size());
}

void TransformerBlock::backwardWeights(Stash& stash) {
  body_.backwardWeights(stash, 0, body_.size());
}

int64_t TransformerBlock::paramCount() const {
  int64_t n = 0;
  for (size_t i = 0; i < body_.size(); ++i) n += body_.layer(i).paramCount();
  return n;
}

int64_t TransformerBlock::flops() const {
  int64_t n = 0;
  for (size_t i = 0; i < body_.size(); ++i) n += body_.layer(i).flops();
  return n;
}

int64_t TransformerBlock::stashBytes() const {
  int64_t n = 0;
  for (size_t i = 0; i < body_.size(); ++i) n += body_.layer(i).stashBytes();
  return n;
}

LayerSpec TransformerBlock::spec() const {
  LayerSpec s;
  s.type = type();
  s.attrs["heads"] = heads_;
  if (mlp_) s.attrs["mlp"] = mlp_;
  return s;
}

std::vector<OpUse> TransformerBlock::ops(bool training) const { return body_.ops(training); }

}  // namespace tandem
