#include "core/layers/transformer.h"

#include <algorithm>

#include "core/error.h"
#include "core/layers/attention.h"

namespace tandem {

Shape ComposedBlock::setBody(const Shape& input, std::vector<LayerSpec> blocks) {
  TANDEM_CHECK_MSG(input.rank() == 2 && input[1] > 0, InvalidArgument,
                   "expected input [T, width], got " << input);
  return setSequence(input, std::move(blocks));
}

Shape ComposedBlock::setSequence(const Shape& input, std::vector<LayerSpec> layers) {
  body_ = Sequence(std::move(layers));
  const Shape out = body_.setup(input);
  if (!split_) return out;
  applySplit(*split_);
  return body_.setup(input);
}

bool ComposedBlock::tensorSplits() const {
  return body_.size() > 0 && splitsAny(findTensorSplit(body_, 0, body_.size()));
}

uint64_t ComposedBlock::applySplit(const Split& split) {
  return applyTensorSplit(body_, findTensorSplit(body_, 0, body_.size()), *split.group,
                          split.shares, split.first_tag);
}

int ComposedBlock::tensorAllreduces() const {
  return tandem::tensorAllreduces(body_, findTensorSplit(body_, 0, body_.size()));
}

void ComposedBlock::splitTensor(Group& group, const std::vector<double>& shares,
                                uint64_t& next_tag) {
  split_ = Split{&group, shares, next_tag};
  next_tag = applySplit(*split_);
}

void ComposedBlock::build(Backend& backend, Rng& rng) {
  backend_ = &backend;
  body_.build(backend, rng);
}

Tensor ComposedBlock::forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) {
  return body_.forward(x, stash, ctx, 0, body_.size());
}

Tensor ComposedBlock::decode(const Tensor& x, DecodeState& state) {
  return body_.decode(x, state, 0, body_.size());
}

Tensor ComposedBlock::decodeEach(const Tensor& x, const std::vector<DecodeState*>& states) {
  return body_.decodeEach(x, states, 0, body_.size());
}

Tensor ComposedBlock::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  return body_.backward(dy, stash, need_dx, 0, body_.size());
}

Tensor ComposedBlock::backwardInput(const Tensor& dy, Stash& stash) {
  return body_.backwardInput(dy, stash, 0, body_.size());
}

void ComposedBlock::backwardWeights(Stash& stash) { body_.backwardWeights(stash, 0, body_.size()); }

int64_t ComposedBlock::paramCount() const { return body_.paramCount(); }

int64_t ComposedBlock::paramBytes() const { return body_.paramBytes(); }

int64_t ComposedBlock::flops() const { return body_.flops(); }

int64_t ComposedBlock::stashBytes() const { return body_.stashBytes(); }

int64_t ComposedBlock::workspaceBytes(int64_t batch) const { return body_.workspaceBytes(batch); }

std::vector<OpUse> ComposedBlock::ops(bool training) const { return body_.ops(training); }

TransformerBlock::TransformerBlock(const LayerSpec& spec) {
  SpecReader r(spec);
  heads_ = r.integer("heads");
  mlp_ = r.integer("mlp", 0);
  format_ = WeightFormat::read(r);
  r.finish();
  TANDEM_CHECK_MSG(heads_ > 0, InvalidArgument,
                   "transformer: 'heads' must be positive, got " << heads_);
  TANDEM_CHECK_MSG(mlp_ >= 0, InvalidArgument, "transformer: 'mlp' must be positive, got " << mlp_);
}

Shape TransformerBlock::infer(const Shape& input) {
  const int64_t width = input.rank() == 2 ? input[1] : 0;
  LayerSpec attention{"attention", {{"heads", heads_}}, {}, {}};
  LayerSpec mlp_in{"linear", {{"out", mlp_ ? mlp_ : 4 * width}}, {}, {}};
  LayerSpec mlp_out{"linear", {{"out", width}}, {}, {}};
  for (LayerSpec* product : {&attention, &mlp_in, &mlp_out}) format_.write(*product);
  const LayerSpec norm{"layernorm", {}, {}, {}};
  return setBody(input,
                 {LayerSpec{"residual", {}, {norm, attention}, {}},
                  LayerSpec{"residual", {}, {norm, mlp_in, {"gelu", {}, {}, {}}, mlp_out}, {}}});
}

LayerSpec TransformerBlock::spec() const {
  LayerSpec s;
  s.type = type();
  s.attrs["heads"] = heads_;
  if (mlp_) s.attrs["mlp"] = mlp_;
  format_.write(s);
  return s;
}

// The block's own fields are mlp and eps; the rest are the attention layer's, checked by
// making it (so a wrong field is named as the attention's).
LlamaBlock::LlamaBlock(const LayerSpec& spec) : spec_(spec) {
  spec_.children.clear();
  spec_.where.clear();
  LayerSpec rest = spec;
  rest.attrs.erase("mlp");
  rest.attrs.erase("eps");
  {
    SpecReader r(spec);
    mlp_ = r.integer("mlp");
    eps_ = r.number("eps", 1e-6);
  }
  TANDEM_CHECK_MSG(mlp_ > 0, InvalidArgument, "llama: 'mlp' must be positive, got " << mlp_);
  TANDEM_CHECK_MSG(eps_ > 0, InvalidArgument, "llama: 'eps' must be positive, got " << eps_);
  attention_ = LayerSpec{"attention", rest.attrs, {}, {}};
  if (!attention_.attrs.count("qkv_bias")) attention_.attrs["qkv_bias"] = std::string("false");
  attention_.attrs["out_bias"] = std::string("false");
  TANDEM_CHECK_MSG(!rest.attrs.count("out_bias") && !rest.attrs.count("causal"), InvalidArgument,
                   "llama: 'out_bias' and 'causal' are fixed (no output bias, causal)");
  Attention check(attention_);  // refuses unknown or bad fields now, not at setup
  spec_.attrs["eps"] = eps_;
}

Shape LlamaBlock::infer(const Shape& input) {
  const LayerSpec norm{"rmsnorm", {{"eps", eps_}}, {}, {}};
  LayerSpec mlp{"swiglu", {{"hidden", mlp_}}, {}, {}};
  for (const char* key : {"weights", "group"})  // the MLP's products are quantized alike
    if (auto it = attention_.attrs.find(key); it != attention_.attrs.end())
      mlp.attrs[key] = it->second;
  return setBody(input, {LayerSpec{"residual", {}, {norm, attention_}, {}},
                         LayerSpec{"residual", {}, {norm, mlp}, {}}});
}

}  // namespace tandem
