#include "core/layers/attention.h"

#include <cmath>

#include "core/error.h"

namespace tandem {
namespace {

// Block `index` of `rows` x `cols` in t viewed as a stack of such blocks.
Tensor block(const Tensor& t, int64_t index, int64_t rows, int64_t cols) {
  return t.reshape({t.numel() / cols, cols}).slice(index * rows, rows);
}

// [B, A, C, R] -> [B, C, A, R], sample by sample (transpose01 on each sample's block).
void swapInner(Backend& be, const Tensor& src, const Tensor& dst, int64_t batch, int64_t a,
               int64_t c, int64_t r) {
  const int64_t n = a * c * r;
  const Tensor s = src.reshape({batch, n}), d = dst.reshape({batch, n});
  for (int64_t b = 0; b < batch; ++b)
    be.transpose01(s.slice(b, 1).reshape({a, c, r}), d.slice(b, 1).reshape({c, a, r}));
}

}  // namespace

Attention::Attention(const LayerSpec& spec) {
  SpecReader r(spec);
  heads_ = r.integer("heads");
  causal_ = r.flag("causal", true);
  r.finish();
  TANDEM_CHECK_MSG(heads_ > 0, InvalidArgument,
                   "attention: 'heads' must be positive, got " << heads_);
}

Shape Attention::infer(const Shape& input) {
  TANDEM_CHECK_MSG(input.rank() == 2 && input[0] > 0 && input[1] > 0, InvalidArgument,
                   "expected input [T, width], got " << input);
  TANDEM_CHECK_MSG(input[1] % heads_ == 0, InvalidArgument,
                   "attention: " << heads_ << " heads do not divide the width " << input[1]);
  len_ = input[0];
  dim_ = input[1];
  head_size_ = dim_ / heads_;
  return input;
}

void Attention::build(Backend& backend, Rng& rng) {
  backend_ = &backend;
  const float bound = 1.0f / std::sqrt(static_cast<float>(dim_));
  w_qkv_ =
      makeParam(backend, "qkv.weight", {3 * dim_, dim_}, uniformInit(rng, 3 * dim_ * dim_, bound));
  b_qkv_ = makeParam(backend, "qkv.bias", {3 * dim_}, uniformInit(rng, 3 * dim_, bound));
  w_out_ = makeParam(backend, "out.weight", {dim_, dim_}, uniformInit(rng, dim_ * dim_, bound));
  b_out_ = makeParam(backend, "out.bias", {dim_}, uniformInit(rng, dim_, bound));
}

// Q, K and V of every sample and head as [3, B*H, T, hs] (so each is one batch of B*H
// blocks) from qkv [B*T, 3D]: per sample [T, 3H, hs] -> [3H, T, hs], then [B, 3, H*T*hs]
// -> [3, B, H*T*hs].
Tensor Attention::splitHeads(const Tensor& qkv, int64_t batch, int64_t t) const {
  Backend& be = *backend_;
  const int64_t h = heads_, hs = head_size_;
  Tensor per_sample = be.empty({batch, 3 * h, t, hs});
  swapInner(be, qkv, per_sample, batch, t, 3 * h, hs);
  Tensor heads = be.empty({3, batch * h, t, hs});
  be.transpose01(per_sample.reshape({batch, 3, h * t * hs}), heads.reshape({3, batch, h * t * hs}));
  return heads;
}

// Stash: x [B*T, D], heads [3, B*H, T, hs], probabilities [B*H, T, T], merged head
// outputs [B*T, D].
Tensor Attention::forward(const Tensor& x, Stash& stash, const ForwardContext&) {
  Backend& be = *backend_;
  const int64_t batch = x.shape()[0], t = len_, h = heads_, hs = head_size_;
  const int64_t rows = batch * t;
  const Tensor x2 = x.reshape({rows, dim_});
  Tensor qkv = be.empty({rows, 3 * dim_});
  be.gemm(false, true, 1.0f, x2, w_qkv_.value, 0.0f, qkv);
  be.addBias(qkv, b_qkv_.value);
  const Tensor heads = splitHeads(qkv, batch, t);
  const Tensor q = heads.slice(0, 1).reshape({batch * h, t, hs});
  const Tensor k = heads.slice(1, 1).reshape({batch * h, t, hs});
  const Tensor v = heads.slice(2, 1).reshape({batch * h, t, hs});

  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  Tensor probs = be.empty({batch * h, t, t});
  be.gemmBatched(false, true, scale, q, k, 0.0f, probs);
  be.softmax(probs, causal_, probs);
  Tensor context = be.empty({batch * h, t, hs});
  be.gemmBatched(false, false, 1.0f, probs, v, 0.0f, context);
  Tensor merged = be.empty({rows, dim_});
  swapInner(be, context, merged, batch, h, t, hs);

  Tensor y = be.empty({rows, dim_});
  be.gemm(false, true, 1.0f, merged, w_out_.value, 0.0f, y);
  be.addBias(y, b_out_.value);
  stash.saved = {x2, heads, probs, merged};
  return y.reshape(x.shape());
}

// state.cache: keys and values [B, H, T, hs] for the whole context; positions
// [0, state.position) hold those of the tokens seen so far.
Tensor Attention::decode(const Tensor& x, DecodeState& state) {
  Backend& be = *backend_;
  TANDEM_CHECK_MSG(x.shape().rank() == 3 && x.shape()[2] == dim_, InvalidArgument,
                   "attention: decoding expects [B, tokens, " << dim_ << "], got " << x.shape());
  const int64_t batch = x.shape()[0], fresh = x.shape()[1], h = heads_, hs = head_size_;
  TANDEM_CHECK_MSG(causal_, Unsupported,
                   "attention without the causal mask cannot decode token by token: each "
                   "token's output would change with the tokens after it");
  const int64_t past = state.position, seen = past + fresh, c = len_;
  TANDEM_CHECK_MSG(seen <= c, InvalidArgument,
                   "attention: " << seen << " tokens do not fit the context of " << c);
  if (state.cache.empty()) state.cache = {be.empty({batch, h, c, hs}), be.empty({batch, h, c, hs})};
  const Tensor& keys = state.cache[0];
  const Tensor& values = state.cache[1];
  TANDEM_CHECK_MSG(keys.shape()[0] == batch, InvalidArgument,
                   "attention: a cache of " << keys.shape()[0] << " sequences given " << batch);

  const int64_t rows = batch * fresh;
  Tensor qkv = be.empty({rows, 3 * dim_});
  be.gemm(false, true, 1.0f, x.reshape({rows, dim_}), w_qkv_.value, 0.0f, qkv);
  be.addBias(qkv, b_qkv_.value);
  Tensor heads = be.empty({batch, 3 * h, fresh, hs});
  swapInner(be, qkv, heads, batch, fresh, 3 * h, hs);
  // The new keys and values go into the cache, after those of the tokens seen before.
  const Tensor key_rows = keys.reshape({batch * h * c, hs});
  const Tensor value_rows = values.reshape({batch * h * c, hs});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < h; ++j) {
      const int64_t at = (b * h + j) * c + past;
      be.copy(block(heads, (b * 3 + 1) * h + j, fresh, hs), key_rows.slice(at, fresh));
      be.copy(block(heads, (b * 3 + 2) * h + j, fresh, hs), value_rows.slice(at, fresh));
    }

  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  Tensor probs = be.empty({batch, h, fresh, seen});
  Tensor context = be.empty({batch, h, fresh, hs});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < h; ++j)
      be.gemm(false, true, scale, block(heads, (b * 3 + 0) * h + j, fresh, hs),
              key_rows.slice((b * h + j) * c, seen), 0.0f, block(probs, b * h + j, fresh, seen));
  be.softmax(probs, causal_, probs);  // the new tokens see the past and each other causally
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < h; ++j)
      be.gemm(false, false, 1.0f, block(probs, b * h + j, fresh, seen),
              value_rows.slice((b * h + j) * c, seen), 0.0f, block(context, b * h + j, fresh, hs));
  Tensor merged = be.empty({rows, dim_});
  swapInner(be, context, merged, batch, h, fresh, hs);
  Tensor y = be.empty({rows, dim_});
  be.gemm(false, true, 1.0f, merged, w_out_.value, 0.0f, y);
  be.addBias(y, b_out_.value);
  state.position = seen;
  return y.reshape(x.shape());
}

// The B new tokens' queries, keys and values in one product over their rows (and the
// output projection in another), each sequence's attention over its own cache between:
// the same products per row as decode() of each sequence alone.
Tensor Attention::decodeEach(const Tensor& x, const std::vector<DecodeState*>& states) {
  Backend& be = *backend_;
  const auto batch = static_cast<int64_t>(states.size());
  TANDEM_CHECK_MSG(
      x.shape().rank() == 3 && x.shape()[0] == batch && x.shape()[1] == 1 && x.shape()[2] == dim_,
      InvalidArgument,
      "attention: decoding one token of " << batch << " sequences expects [" << batch << ", 1, "
                                          << dim_ << "], got " << x.shape());
  TANDEM_CHECK_MSG(causal_, Unsupported,
                   "attention without the causal mask cannot decode token by token: each "
                   "token's output would change with the tokens after it");
  const int64_t h = heads_, hs = head_size_, c = len_;
  Tensor qkv = be.empty({batch, 3 * dim_});
  be.gemm(false, true, 1.0f, x.reshape({batch, dim_}), w_qkv_.value, 0.0f, qkv);
  be.addBias(qkv, b_qkv_.value);
  Tensor heads = be.empty({batch, 3 * h, 1, hs});
  swapInner(be, qkv, heads, batch, 1, 3 * h, hs);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  Tensor context = be.empty({batch, h, 1, hs});
  for (int64_t b = 0; b < batch; ++b) {
    DecodeState& state = *states[static_cast<size_t>(b)];
    const int64_t past = state.position, seen = past + 1;
    TANDEM_CHECK_MSG(seen <= c, InvalidArgument,
                     "attention: " << seen << " tokens do not fit the context of " << c);
    if (state.cache.empty()) state.cache = {be.empty({1, h, c, hs}), be.empty({1, h, c, hs})};
    TANDEM_CHECK_MSG(
        state.cache[0].shape()[0] == 1, InvalidArgument,
        "attention: a cache of " << state.cache[0].shape()[0] << " sequences given one");
    const Tensor key_rows = state.cache[0].reshape({h * c, hs});
    const Tensor value_rows = state.cache[1].reshape({h * c, hs});
    for (int64_t j = 0; j < h; ++j) {
      be.copy(block(heads, (b * 3 + 1) * h + j, 1, hs), key_rows.slice(j * c + past, 1));
      be.copy(block(heads, (b * 3 + 2) * h + j, 1, hs), value_rows.slice(j * c + past, 1));
    }
    Tensor probs = be.empty({1, h, 1, seen});
    for (int64_t j = 0; j < h; ++j)
      be.gemm(false, true, scale, block(heads, (b * 3 + 0) * h + j, 1, hs),
              key_rows.slice(j * c, seen), 0.0f, block(probs, j, 1, seen));
    be.softmax(probs, causal_, probs);
    for (int64_t j = 0; j < h; ++j)
      be.gemm(false, false, 1.0f, block(probs, j, 1, seen), value_rows.slice(j * c, seen), 0.0f,
              block(context, b * h + j, 1, hs));
    state.position = seen;
  }
  Tensor merged = be.empty({batch, dim_});
  swapInner(be, context, merged, batch, h, 1, hs);
  Tensor y = be.empty({batch, dim_});
  be.gemm(false, true, 1.0f, merged, w_out_.value, 0.0f, y);
  be.addBias(y, b_out_.value);
  return y.reshape(x.shape());
}

Tensor Attention::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  // Weight gradients need dqkv, which is most of the way to dx: always go through it.
  Tensor dx = backwardInput(dy, stash);
  backwardWeights(stash);
  return need_dx ? dx : Tensor();
}

// Leaves dy [B*T, D] and dqkv [B*T, 3D] in the stash for backwardWeights.
Tensor Attention::backwardInput(const Tensor& dy, Stash& stash) {
  TANDEM_CHECK_MSG(stash.saved.size() == 4, InvalidArgument, "attention: backward without forward");
  Backend& be = *backend_;
  const Tensor& heads = stash.saved[1];
  const Tensor& probs = stash.saved[2];
  const int64_t bh = probs.shape()[0], h = heads_, batch = bh / h, t = len_, hs = head_size_;
  const int64_t rows = batch * t;
  const Tensor dy2 = dy.reshape({rows, dim_});
  auto part = [&](const Tensor& all, int64_t i) { return all.slice(i, 1).reshape({bh, t, hs}); };

  Tensor dmerged = be.empty({rows, dim_});
  be.gemm(false, false, 1.0f, dy2, w_out_.value, 0.0f, dmerged);
  Tensor dcontext = be.empty({bh, t, hs});
  swapInner(be, dmerged, dcontext, batch, t, h, hs);

  Tensor dheads = be.empty({3, bh, t, hs});
  Tensor dscores = be.empty({bh, t, t});
  be.gemmBatched(false, true, 1.0f, dcontext, part(heads, 2), 0.0f, dscores);
  be.gemmBatched(true, false, 1.0f, probs, dcontext, 0.0f, part(dheads, 2));
  be.softmaxBackward(probs, dscores, dscores);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  be.gemmBatched(false, false, scale, dscores, part(heads, 1), 0.0f, part(dheads, 0));
  be.gemmBatched(true, false, scale, dscores, part(heads, 0), 0.0f, part(dheads, 1));
  // Back to [B, 3H, T, hs], then per sample to [T, 3H, hs]: dqkv [B*T, 3D].
  Tensor per_sample = be.empty({batch, 3 * h, t, hs});
  be.transpose01(dheads.reshape({3, batch, h * t * hs}),
                 per_sample.reshape({batch, 3, h * t * hs}));
  Tensor dqkv = be.empty({rows, 3 * dim_});
  swapInner(be, per_sample, dqkv, batch, 3 * h, t, hs);
  Tensor dx = be.empty({rows, dim_});
  be.gemm(false, false, 1.0f, dqkv, w_qkv_.value, 0.0f, dx);
  stash.saved = {stash.saved[0], stash.saved[3], dy2, dqkv};
  return dx.reshape(dy.shape());
}

void Attention::backwardWeights(Stash& stash) {
  TANDEM_CHECK_MSG(stash.saved.size() == 4, InvalidArgument,
                   "attention: backwardWeights without backwardInput");
  Backend& be = *backend_;
  const Tensor& x2 = stash.saved[0];
  const Tensor& merged = stash.saved[1];
  const Tensor& dy2 = stash.saved[2];
  const Tensor& dqkv = stash.saved[3];
  be.gemm(true, false, 1.0f, dy2, merged, 1.0f, w_out_.grad);
  be.biasGrad(dy2, b_out_.grad);
  be.gemm(true, false, 1.0f, dqkv, x2, 1.0f, w_qkv_.grad);
  be.biasGrad(dqkv, b_qkv_.grad);
  stash.clear();
}

int64_t Attention::flops() const {
  const int64_t projections = 2 * len_ * dim_ * 4 * dim_ + 4 * len_ * dim_;
  const int64_t products = 2 * 2 * len_ * len_ * dim_;  // Q K^T and P V over all heads
  return projections + products + 5 * heads_ * len_ * len_;
}

int64_t Attention::stashBytes() const {
  return (5 * len_ * dim_ + heads_ * len_ * len_) * 4;  // x, Q/K/V, merged; probabilities
}

LayerSpec Attention::spec() const {
  LayerSpec s;
  s.type = type();
  s.attrs["heads"] = heads_;
  if (!causal_) s.attrs["causal"] = std::string("false");
  return s;
}

PositionalEmbedding::PositionalEmbedding(const LayerSpec& spec) {
  SpecReader r(spec);
  context_ = r.integer("context");
  r.finish();
  TANDEM_CHECK_MSG(context_ > 0, InvalidArgument,
                   "positional: 'context' must be positive, got " << context_);
}

Shape PositionalEmbedding::infer(const Shape& input) {
  TANDEM_CHECK_MSG(input.rank() == 2 && input[1] > 0, InvalidArgument,
                   "expected input [T, width], got " << input);
  TANDEM_CHECK_MSG(
      input[0] <= context_, InvalidArgument,
      "positional: a sequence of " << input[0] << " is longer than the context " << context_);
  dim_ = input[1];
  return input;
}

void PositionalEmbedding::build(Backend& backend, Rng& rng) {
  backend_ = &backend;
  std::vector<float> init(static_cast<size_t>(context_ * dim_));
  for (float& v : init) v = 0.02f * rng.normal();  // GPT-2's N(0, 0.02^2)
  table_ = makeParam(backend, "table", {context_, dim_}, init);
}

// addBias with y viewed as [B, T*D, 1] adds the table's first T rows to every sample.
Tensor PositionalEmbedding::forward(const Tensor& x, Stash&, const ForwardContext&) {
  const int64_t batch = x.shape()[0], n = x.numel() / batch;
  Tensor y = backend_->empty(x.shape());
  backend_->copy(x, y);
  backend_->addBias(y.reshape({batch, n}), table_.value.reshape({context_ * dim_}).head({n}));
  return y;
}

// The new tokens' rows of the table: positions [state.position, state.position + Tnew).
Tensor PositionalEmbedding::decode(const Tensor& x, DecodeState& state) {
  TANDEM_CHECK_MSG(x.shape().rank() == 3 && x.shape()[2] == dim_, InvalidArgument,
                   "positional: decoding expects [B, tokens, " << dim_ << "], got " << x.shape());
  const int64_t batch = x.shape()[0], fresh = x.shape()[1];
  TANDEM_CHECK_MSG(
      state.position + fresh <= context_, InvalidArgument,
      "positional: " << state.position + fresh << " tokens do not fit the context of " << context_);
  Tensor y = backend_->empty(x.shape());
  backend_->copy(x, y);
  backend_->addBias(
      y.reshape({batch, fresh * dim_}),
      table_.value.reshape({context_ * dim_}).slice(state.position * dim_, fresh * dim_));
  state.position += fresh;
  return y;
}

// Each sequence's row of the table at its own position.
Tensor PositionalEmbedding::decodeEach(const Tensor& x, const std::vector<DecodeState*>& states) {
  const auto batch = static_cast<int64_t>(states.size());
  TANDEM_CHECK_MSG(
      x.shape().rank() == 3 && x.shape()[0] == batch && x.shape()[1] == 1 && x.shape()[2] == dim_,
      InvalidArgument,
      "positional: decoding one token of " << batch << " sequences expects [" << batch << ", 1, "
                                           << dim_ << "], got " << x.shape());
  Tensor y = backend_->empty(x.shape());
  backend_->copy(x, y);
  for (int64_t b = 0; b < batch; ++b) {
    DecodeState& state = *states[static_cast<size_t>(b)];
    TANDEM_CHECK_MSG(
        state.position + 1 <= context_, InvalidArgument,
        "positional: " << state.position + 1 << " tokens do not fit the context of " << context_);
    backend_->addBias(y.slice(b, 1).reshape({1, dim_}),
                      table_.value.reshape({context_ * dim_}).slice(state.position * dim_, dim_));
    state.position += 1;
  }
  return y;
}

Tensor PositionalEmbedding::backward(const Tensor& dy, Stash&, bool need_dx) {
  const int64_t batch = dy.shape()[0], n = dy.numel() / batch;
  backend_->biasGrad(dy.reshape({batch, n}), table_.grad.reshape({context_ * dim_}).head({n}));
  return need_dx ? dy : Tensor();
}

LayerSpec PositionalEmbedding::spec() const {
  LayerSpec s;
  s.type = type();
  s.attrs["context"] = context_;
  return s;
}

std::vector<OpUse> Attention::ops(bool training) const {
  return f32Ops(training,
                {Op::kGemm, Op::kGemmBatched, Op::kAddBias, Op::kTranspose01, Op::kSoftmax},
                {Op::kBiasGrad, Op::kSoftmaxBackward});
}

std::vector<OpUse> PositionalEmbedding::ops(bool training) const {
  return f32Ops(training, {Op::kCopy, Op::kAddBias}, {Op::kBiasGrad});
}

}  // namespace tandem
