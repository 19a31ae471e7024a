#include "core/layers/residual.h"

#include <algorithm>

#include "core/error.h"
#include "core/layers/branches.h"
#include "core/layers/conv2d.h"
#include "core/layers/linear.h"

namespace tandem {

int64_t projectionStride(int64_t in, int64_t out) {
  if (in < 1 || out < 1 || out > in) return 0;
  // (in - 1) / t == out - 1 holds for t in ((in - 1) / out, (in - 1) / (out - 1)].
  const int64_t t = (in - 1) / out + 1;
  return (in - 1) / t + 1 == out ? t : 0;
}

Residual::Residual(const LayerSpec& spec) : body_(spec.children) {
  SpecReader r(spec);
  proj_bias_ = r.flag("proj_bias", false);
  proj_norm_ = r.flag("proj_norm", false);
  proj_eps_ = static_cast<float>(r.number("proj_eps", 1e-5));
  proj_momentum_ = static_cast<float>(r.number("proj_momentum", 0.1));
  r.finish();
  TANDEM_CHECK_MSG(proj_norm_ || (!r.has("proj_eps") && !r.has("proj_momentum")), InvalidArgument,
                   "residual: 'proj_eps' and 'proj_momentum' are the projection's batch norm's "
                   "('proj_norm: true')");
  TANDEM_CHECK_MSG(body_.size() > 0, InvalidArgument, "residual: 'layers' must not be empty");
}

Shape Residual::infer(const Shape& input) {
  const Shape out = body_.setup(input);
  projection_.reset();
  if (out == input) return out;
  const int64_t stride =
      input.rank() == 3 && out.rank() == 3 ? projectionStride(input[1], out[1]) : 0;
  if (stride > 0 && projectionStride(input[2], out[2]) == stride) {
    LayerSpec p{"conv2d", {}, {}, {}};
    p.attrs["out"] = out[0];
    p.attrs["kernel"] = int64_t{1};
    p.attrs["stride"] = stride;
    p.attrs["bias"] = std::string(proj_bias_ ? "true" : "false");
    projection_ = std::make_unique<Conv2d>(p);
  } else if (input.rank() == 1 && out.rank() == 1) {
    LayerSpec p{"linear", {}, {}, {}};
    p.attrs["out"] = out[0];
    p.attrs["bias"] = std::string(proj_bias_ ? "true" : "false");
    projection_ = std::make_unique<Linear>(p);
  } else {
    throw InvalidArgument("body maps " + input.str() + " to " + out.str() +
                          ", which no 1x1 convolution or linear projection can match");
  }
  if (proj_norm_) {  // the projection, then a batch norm (ResNet's downsample as it trains)
    LayerSpec chain{"chain", {}, {projection_->spec()}, {}};
    chain.children.push_back(
        {"batchnorm", {{"eps", double{proj_eps_}}, {"momentum", double{proj_momentum_}}}, {}, {}});
    projection_ = std::make_unique<Chain>(chain);
  }
  const Shape projected = projection_->setup(input);
  TANDEM_CHECK_MSG(projected == out, InvalidArgument,
                   "projection gives " << projected << " but the body gives " << out);
  return out;
}

bool Residual::tensorSplits() const {
  return body_.size() > 0 && splitsAny(findTensorSplit(body_, 0, body_.size()));
}

int Residual::tensorAllreduces() const {
  return tandem::tensorAllreduces(body_, findTensorSplit(body_, 0, body_.size()));
}

void Residual::splitTensor(Group& group, const std::vector<double>& shares, uint64_t& next_tag) {
  next_tag =
      applyTensorSplit(body_, findTensorSplit(body_, 0, body_.size()), group, shares, next_tag);
}

void Residual::build(Backend& backend, Rng& rng) {
  backend_ = &backend;
  body_.build(backend, rng, "body.");
  if (projection_) {
    projection_->build(backend, rng);
    for (Param* p : projection_->params()) p->name = "proj." + p->name;
  }
}

std::vector<Param*> Residual::params() {
  std::vector<Param*> out = body_.params();
  if (projection_)
    for (Param* p : projection_->params()) out.push_back(p);
  return out;
}

Tensor Residual::forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) {
  stash.children.resize(2);
  Tensor y = body_.forward(x, stash.children[0], ctx, 0, body_.size());
  Tensor out = backend_->empty(y.shape());
  backend_->copy(y, out);  // never add into a tensor a body layer may have stashed
  if (projection_) {
    const Tensor p = projection_->forward(x, stash.children[1], ctx);
    backend_->axpby(1.0f, p, 1.0f, out);
  } else {
    backend_->axpby(1.0f, x, 1.0f, out);
  }
  return out;
}

Tensor Residual::decode(const Tensor& x, DecodeState& state) {
  if (state.children.size() != 2) state.children.assign(2, DecodeState{});
  Tensor y = body_.decode(x, state.children[0], 0, body_.size());
  Tensor out = backend_->empty(y.shape());
  backend_->copy(y, out);
  backend_->axpby(1.0f, projection_ ? projection_->decode(x, state.children[1]) : x, 1.0f, out);
  return out;
}

Tensor Residual::decodeEach(const Tensor& x, const std::vector<DecodeState*>& states) {
  std::vector<DecodeState*> body(states.size()), shortcut(states.size());
  for (size_t b = 0; b < states.size(); ++b) {
    if (states[b]->children.size() != 2) states[b]->children.assign(2, DecodeState{});
    body[b] = &states[b]->children[0];
    shortcut[b] = &states[b]->children[1];
  }
  Tensor y = body_.decodeEach(x, body, 0, body_.size());
  Tensor out = backend_->empty(y.shape());
  backend_->copy(y, out);
  backend_->axpby(1.0f, projection_ ? projection_->decodeEach(x, shortcut) : x, 1.0f, out);
  return out;
}

Tensor Residual::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  Tensor dx = body_.backward(dy, stash.children.at(0), need_dx, 0, body_.size());
  if (projection_) {
    Tensor dp = projection_->backward(dy, stash.children.at(1), need_dx);
    if (need_dx) backend_->axpby(1.0f, dp, 1.0f, dx);
  } else if (need_dx) {
    backend_->axpby(1.0f, dy, 1.0f, dx);
  }
  return dx;
}

Tensor Residual::backwardInput(const Tensor& dy, Stash& stash) {
  Tensor dx = body_.backwardInput(dy, stash.children.at(0), 0, body_.size());
  const Tensor& skip = projection_ ? projection_->backwardInput(dy, stash.children.at(1)) : dy;
  backend_->axpby(1.0f, skip, 1.0f, dx);
  return dx;
}

void Residual::backwardWeights(Stash& stash) {
  body_.backwardWeights(stash.children.at(0), 0, body_.size());
  if (projection_) projection_->backwardWeights(stash.children.at(1));
}

int64_t Residual::paramCount() const {
  return (projection_ ? projection_->paramCount() : 0) + body_.paramCount();
}

bool Residual::trains() const { return body_.trains(); }

int64_t Residual::paramBytes() const {
  return (projection_ ? projection_->paramBytes() : 0) + body_.paramBytes();
}

int64_t Residual::flops() const {
  return outputShape().numel() + (projection_ ? projection_->flops() : 0) + body_.flops();
}

int64_t Residual::stashBytes() const {
  return (projection_ ? projection_->stashBytes() : 0) + body_.stashBytes();
}

// The largest scratch of any layer inside: they run one at a time.
int64_t Residual::workspaceBytes(int64_t batch) const {
  return std::max(projection_ ? projection_->workspaceBytes(batch) : 0,
                  body_.workspaceBytes(batch));
}

LayerSpec Residual::spec() const {
  LayerSpec s;
  s.type = type();
  s.children = body_.specs();
  if (proj_bias_) s.attrs["proj_bias"] = std::string("true");
  if (proj_norm_) {
    s.attrs["proj_norm"] = std::string("true");
    s.attrs["proj_eps"] = double{proj_eps_};
    s.attrs["proj_momentum"] = double{proj_momentum_};
  }
  return s;
}

// The shortcut is copied and added; the projection's and the body's ops beside.
std::vector<OpUse> Residual::ops(bool training) const {
  std::vector<std::vector<OpUse>> lists = {f32Ops(training, {Op::kCopy, Op::kAxpby}, {}),
                                           body_.ops(training)};
  if (projection_) lists.push_back(projection_->ops(training));
  return unionOps(lists);
}

}  // namespace tandem
