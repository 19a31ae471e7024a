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
  kv_heads_ = r.integer("kv_heads", 0);
  causal_ = r.flag("causal", true);
  qkv_bias_ = r.flag("qkv_bias", true);
  out_bias_ = r.flag("out_bias", true);
  rope_ = readRope(r);
  format_ = WeightFormat::read(r);
  r.finish();
  TANDEM_CHECK_MSG(heads_ > 0, InvalidArgument,
                   "attention: 'heads' must be positive, got " << heads_);
  TANDEM_CHECK_MSG(kv_heads_ >= 0, InvalidArgument,
                   "attention: 'kv_heads' must be positive, got " << kv_heads_);
  if (kv_heads_ == 0) kv_heads_ = heads_;
  TANDEM_CHECK_MSG(
      heads_ % kv_heads_ == 0, InvalidArgument,
      "attention: " << kv_heads_ << " key/value heads do not divide " << heads_ << " query heads");
}

Shape Attention::infer(const Shape& input) {
  TANDEM_CHECK_MSG(input.rank() == 2 && input[0] > 0 && input[1] > 0, InvalidArgument,
                   "expected input [T, width], got " << input);
  TANDEM_CHECK_MSG(input[1] % heads_ == 0, InvalidArgument,
                   "attention: " << heads_ << " heads do not divide the width " << input[1]);
  len_ = input[0];
  dim_ = input[1];
  head_size_ = dim_ / heads_;
  TANDEM_CHECK_MSG(!rope_.enabled() || head_size_ % 2 == 0, InvalidArgument,
                   "attention: rotary embedding needs an even head size, got " << head_size_);
  if (format_.int8) format_.groupFor(dim_, "attention");
  k_ = part_ ? part_->width() : kv_heads_;
  h_ = k_ * group();
  return input;
}

void Attention::splitTensor(Group& group, const std::vector<double>& shares, uint64_t& next_tag) {
  TANDEM_CHECK_MSG(dim_ > 0, InvalidArgument, "attention: a tensor split comes after setup");
  TANDEM_CHECK_MSG(!format_.int8, InvalidArgument,
                   "attention: int8 weights cannot be tensor-split (they are for inference only)");
  part_ = blockPart(
      group, shares, kv_heads_,
      "attention (its " + std::to_string(kv_heads_) + " key/value head groups as features)",
      next_tag);
}

void Attention::build(Backend& backend, Rng& rng) {
  backend_ = &backend;
  const float bound = 1.0f / std::sqrt(static_cast<float>(dim_));
  if (rope_.enabled()) {
    const std::vector<float> inv = ropeInverseFrequencies(rope_, head_size_);
    inv_freq_ = backend.empty({static_cast<int64_t>(inv.size())});
    backend.upload(inv_freq_, inv.data());
  }
  if (part_) return buildPart(backend, rng, bound);
  const int64_t qkv = totalHeads() * head_size_;
  w_qkv_.build(backend, rng, "qkv.weight", qkv, dim_, bound, format_, "attention");
  if (qkv_bias_) b_qkv_ = makeParam(backend, "qkv.bias", {qkv}, uniformInit(rng, qkv, bound));
  w_out_.build(backend, rng, "out.weight", dim_, dim_, bound, format_, "attention");
  if (out_bias_) b_out_ = makeParam(backend, "out.bias", {dim_}, uniformInit(rng, dim_, bound));
}

// The whole layer's draws (build's, in its order), sliced: the rows of Wqkv (and bqkv) that
// make this rank's query heads, then its key heads, then its value heads; the columns of Wo
// its heads feed; the output bias whole.
void Attention::buildPart(Backend& backend, Rng& rng, float bound) {
  const int64_t s = head_size_, g = group(), qkv = (heads_ + 2 * kv_heads_) * s;
  const int64_t b = part_->begin, e = part_->end;
  const std::vector<float> w_qkv = uniformInit(rng, qkv * dim_, bound);
  const std::vector<float> b_qkv = qkv_bias_ ? uniformInit(rng, qkv, bound) : std::vector<float>{};
  const std::vector<float> w_out = uniformInit(rng, dim_ * dim_, bound);
  const std::vector<float> b_out = out_bias_ ? uniformInit(rng, dim_, bound) : std::vector<float>{};
  const std::vector<std::pair<int64_t, int64_t>> rows{
      {b * g * s, e * g * s},
      {(heads_ + b) * s, (heads_ + e) * s},
      {(heads_ + kv_heads_ + b) * s, (heads_ + kv_heads_ + e) * s}};
  w_qkv_.buildPart(backend, "qkv.weight", w_qkv, ParamSlice{qkv, dim_, rows, 0, dim_});
  if (qkv_bias_)
    b_qkv_ = makePartParam(backend, "qkv.bias", {totalHeads() * s}, b_qkv,
                           ParamSlice{qkv, 1, rows, 0, 1});
  w_out_.buildPart(backend, "out.weight", w_out, columnsOf(dim_, dim_, b * g * s, e * g * s));
  if (out_bias_) b_out_ = makeParam(backend, "out.bias", {dim_}, b_out);
}

std::vector<Param*> Attention::params() {
  std::vector<Param*> out = w_qkv_.params();
  if (qkv_bias_) out.push_back(&b_qkv_);
  for (Param* p : w_out_.params()) out.push_back(p);
  if (out_bias_) out.push_back(&b_out_);
  return out;
}

Tensor Attention::project(const Tensor& x2, const std::vector<int32_t>& positions) {
  Backend& be = *backend_;
  const int64_t rows = x2.shape()[0];
  Tensor qkv = be.empty({rows, totalHeads() * head_size_});
  w_qkv_.forward(be, x2, qkv);
  if (qkv_bias_) be.addBias(qkv, b_qkv_.value);
  if (rope_.enabled()) {
    Tensor pos = be.empty({rows}, DType::kI32);
    be.upload(pos, positions.data());
    be.rope(qkv, pos, inv_freq_, h_ + k_, false, qkv);
  }
  return qkv;
}

Tensor Attention::output(const Tensor& merged) {
  Tensor y = backend_->empty({merged.shape()[0], dim_});
  w_out_.forward(*backend_, merged, y);
  if (part_) allreducePart(*backend_, y, *part_, 0);  // the heads' partial outputs, then the bias
  if (out_bias_) backend_->addBias(y, b_out_.value);
  return y;
}

// Queries, keys and values of every sample and head, [B*H | B*K | B*K] blocks of [T, S]
// from qkv [B*T, (H + 2K) S]: per sample [T, H + 2K, S] -> [H + 2K, T, S], then the
// samples' queries, keys and values gathered (one transpose01 of [B, 3, H*T*S] when K = H).
Tensor Attention::splitHeads(const Tensor& qkv, int64_t batch, int64_t t) const {
  Backend& be = *backend_;
  const int64_t h = h_, k = k_, all = totalHeads(), hs = head_size_;
  Tensor per_sample = be.empty({batch, all, t, hs});
  swapInner(be, qkv, per_sample, batch, t, all, hs);
  Tensor heads = be.empty({batch * all, t, hs});
  if (k == h) {
    be.transpose01(per_sample.reshape({batch, 3, h * t * hs}),
                   heads.reshape({3, batch, h * t * hs}));
    return heads;
  }
  const Tensor from = per_sample.reshape({batch * all, t * hs});
  const Tensor to = heads.reshape({batch * all, t * hs});
  for (int64_t b = 0; b < batch; ++b) {
    be.copy(from.slice(b * all, h), to.slice(b * h, h));
    be.copy(from.slice(b * all + h, k), to.slice(batch * h + b * k, k));
    be.copy(from.slice(b * all + h + k, k), to.slice(batch * (h + k) + b * k, k));
  }
  return heads;
}

// splitHeads' inverse: dqkv [B*T, (H + 2K) S] from the heads' gradients.
Tensor Attention::mergeHeads(const Tensor& heads, int64_t batch, int64_t t) const {
  Backend& be = *backend_;
  const int64_t h = h_, k = k_, all = totalHeads(), hs = head_size_;
  Tensor per_sample = be.empty({batch, all, t, hs});
  if (k == h) {
    be.transpose01(heads.reshape({3, batch, h * t * hs}),
                   per_sample.reshape({batch, 3, h * t * hs}));
  } else {
    const Tensor from = heads.reshape({batch * all, t * hs});
    const Tensor to = per_sample.reshape({batch * all, t * hs});
    for (int64_t b = 0; b < batch; ++b) {
      be.copy(from.slice(b * h, h), to.slice(b * all, h));
      be.copy(from.slice(batch * h + b * k, k), to.slice(b * all + h, k));
      be.copy(from.slice(batch * (h + k) + b * k, k), to.slice(b * all + h + k, k));
    }
  }
  Tensor qkv = be.empty({batch * t, all * hs});
  swapInner(be, per_sample, qkv, batch, all, t, hs);
  return qkv;
}

namespace {

// The [B*H | B*K | B*K] blocks of heads (or their gradients) as batched-gemm operands: the
// queries as B*K groups of (H/K) T rows, the keys and values as B*K blocks of T rows.
struct HeadViews {
  Tensor q, k, v;
};
HeadViews headViews(const Tensor& heads, int64_t batch, int64_t h, int64_t kv, int64_t t,
                    int64_t hs) {
  const Tensor all = heads.reshape({heads.numel() / (t * hs), t * hs});
  const int64_t bk = batch * kv, rows = (h / kv) * t;
  return {all.slice(0, batch * h).reshape({bk, rows, hs}),
          all.slice(batch * h, bk).reshape({bk, t, hs}),
          all.slice(batch * h + bk, bk).reshape({bk, t, hs})};
}

// Each of `batch` sequences' positions start..start+t-1, one per row of [B*T, ...].
std::vector<int32_t> rowPositions(int64_t batch, int64_t t, int64_t start) {
  std::vector<int32_t> out(static_cast<size_t>(batch * t));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<int32_t>(start + static_cast<int64_t>(i) % t);
  return out;
}

// Rows [first, first + count) of t viewed as rows of `cols`.
Tensor rows(const Tensor& t, int64_t first, int64_t count, int64_t cols) {
  return t.reshape({t.numel() / cols, cols}).slice(first, count);
}

}  // namespace

// Stash: x [B*T, D], heads [B*H | B*K | B*K] of [T, S], probabilities [B*H, T, T], merged
// head outputs [B*T, D].
Tensor Attention::forward(const Tensor& x, Stash& stash, const ForwardContext&) {
  Backend& be = *backend_;
  const int64_t batch = x.shape()[0], t = len_, h = h_, hs = head_size_;
  const int64_t bk = batch * k_, gt = group() * t;
  const Tensor x2 = x.reshape({batch * t, dim_});
  const Tensor heads = splitHeads(
      project(x2, rope_.enabled() ? rowPositions(batch, t, 0) : std::vector<int32_t>{}), batch, t);
  const HeadViews in = headViews(heads, batch, h, k_, t, hs);

  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  Tensor probs = be.empty({batch * h, t, t});
  be.gemmBatched(false, true, scale, in.q, in.k, 0.0f, probs.reshape({bk, gt, t}));
  be.softmax(probs, causal_, probs);
  Tensor context = be.empty({batch * h, t, hs});
  be.gemmBatched(false, false, 1.0f, probs.reshape({bk, gt, t}), in.v, 0.0f,
                 context.reshape({bk, gt, hs}));
  Tensor merged = be.empty({batch * t, inner()});
  swapInner(be, context, merged, batch, h, t, hs);
  stash.saved = {x2, heads, probs, merged};
  return output(merged).reshape(x.shape());
}

// state.cache: keys and values [B, K, T, S] for the whole context; positions
// [0, state.position) hold those of the tokens seen so far.
Tensor Attention::decode(const Tensor& x, DecodeState& state) {
  Backend& be = *backend_;
  TANDEM_CHECK_MSG(x.shape().rank() == 3 && x.shape()[2] == dim_, InvalidArgument,
                   "attention: decoding expects [B, tokens, " << dim_ << "], got " << x.shape());
  const int64_t batch = x.shape()[0], fresh = x.shape()[1], h = h_, hs = head_size_;
  const int64_t k = k_, g = group(), all = totalHeads();
  TANDEM_CHECK_MSG(causal_, Unsupported,
                   "attention without the causal mask cannot decode token by token: each "
                   "token's output would change with the tokens after it");
  const int64_t past = state.position, seen = past + fresh, c = len_;
  TANDEM_CHECK_MSG(seen <= c, InvalidArgument,
                   "attention: " << seen << " tokens do not fit the context of " << c);
  if (state.cache.empty()) state.cache = {be.empty({batch, k, c, hs}), be.empty({batch, k, c, hs})};
  TANDEM_CHECK_MSG(
      state.cache[0].shape()[0] == batch, InvalidArgument,
      "attention: a cache of " << state.cache[0].shape()[0] << " sequences given " << batch);
  const Tensor qkv =
      project(x.reshape({batch * fresh, dim_}),
              rope_.enabled() ? rowPositions(batch, fresh, past) : std::vector<int32_t>{});
  Tensor heads = be.empty({batch, all, fresh, hs});
  swapInner(be, qkv, heads, batch, fresh, all, hs);
  // The new keys and values go into the cache, after those of the tokens seen before.
  const Tensor key_rows = state.cache[0].reshape({batch * k * c, hs});
  const Tensor value_rows = state.cache[1].reshape({batch * k * c, hs});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t at = (b * k + j) * c + past;
      be.copy(block(heads, b * all + h + j, fresh, hs), key_rows.slice(at, fresh));
      be.copy(block(heads, b * all + h + k + j, fresh, hs), value_rows.slice(at, fresh));
    }

  // Per sequence and group: its H/K query heads' new rows against the group's cache.
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  Tensor probs = be.empty({batch, h, fresh, seen});
  Tensor context = be.empty({batch, h, fresh, hs});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < k; ++j)
      be.gemm(false, true, scale, rows(heads, (b * all + j * g) * fresh, g * fresh, hs),
              key_rows.slice((b * k + j) * c, seen), 0.0f,
              rows(probs, (b * h + j * g) * fresh, g * fresh, seen));
  be.softmax(probs, causal_, probs);  // the new tokens see the past and each other causally
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < k; ++j)
      be.gemm(false, false, 1.0f, rows(probs, (b * h + j * g) * fresh, g * fresh, seen),
              value_rows.slice((b * k + j) * c, seen), 0.0f,
              rows(context, (b * h + j * g) * fresh, g * fresh, hs));
  Tensor merged = be.empty({batch * fresh, inner()});
  swapInner(be, context, merged, batch, h, fresh, hs);
  state.position = seen;
  return output(merged).reshape(x.shape());
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
  const int64_t h = h_, hs = head_size_, c = len_, k = k_, g = group();
  const int64_t all = totalHeads();
  std::vector<int32_t> positions;
  for (const DecodeState* state : states) {
    TANDEM_CHECK_MSG(
        state->position + 1 <= c, InvalidArgument,
        "attention: " << state->position + 1 << " tokens do not fit the context of " << c);
    if (rope_.enabled()) positions.push_back(static_cast<int32_t>(state->position));
  }
  const Tensor qkv = project(x.reshape({batch, dim_}), positions);
  Tensor heads = be.empty({batch, all, 1, hs});
  swapInner(be, qkv, heads, batch, 1, all, hs);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  Tensor context = be.empty({batch, h, 1, hs});
  for (int64_t b = 0; b < batch; ++b) {
    DecodeState& state = *states[static_cast<size_t>(b)];
    const int64_t past = state.position, seen = past + 1;
    if (state.cache.empty()) state.cache = {be.empty({1, k, c, hs}), be.empty({1, k, c, hs})};
    TANDEM_CHECK_MSG(
        state.cache[0].shape()[0] == 1, InvalidArgument,
        "attention: a cache of " << state.cache[0].shape()[0] << " sequences given one");
    const Tensor key_rows = state.cache[0].reshape({k * c, hs});
    const Tensor value_rows = state.cache[1].reshape({k * c, hs});
    for (int64_t j = 0; j < k; ++j) {
      be.copy(block(heads, b * all + h + j, 1, hs), key_rows.slice(j * c + past, 1));
      be.copy(block(heads, b * all + h + k + j, 1, hs), value_rows.slice(j * c + past, 1));
    }
    Tensor probs = be.empty({1, h, 1, seen});
    for (int64_t j = 0; j < k; ++j)
      be.gemm(false, true, scale, rows(heads, b * all + j * g, g, hs), key_rows.slice(j * c, seen),
              0.0f, rows(probs, j * g, g, seen));
    be.softmax(probs, causal_, probs);
    for (int64_t j = 0; j < k; ++j)
      be.gemm(false, false, 1.0f, rows(probs, j * g, g, seen), value_rows.slice(j * c, seen), 0.0f,
              rows(context, b * h + j * g, g, hs));
    state.position = seen;
  }
  Tensor merged = be.empty({batch, inner()});
  swapInner(be, context, merged, batch, h, 1, hs);
  return output(merged).reshape(x.shape());
}

Tensor Attention::backward(const Tensor& dy, Stash& stash, bool need_dx) {
  // Weight gradients need dqkv, which is most of the way to dx: always go through it.
  Tensor dx = backwardInput(dy, stash);
  backwardWeights(stash);
  return need_dx ? dx : Tensor();
}

// Leaves dy [B*T, D] and dqkv [B*T, (H + 2K) S] in the stash for backwardWeights. A key
// or value head's gradient sums its group's queries (the batched gemms' inner dimension).
Tensor Attention::backwardInput(const Tensor& dy, Stash& stash) {
  TANDEM_CHECK_MSG(stash.saved.size() == 4, InvalidArgument, "attention: backward without forward");
  Backend& be = *backend_;
  const Tensor& heads = stash.saved[1];
  const Tensor& probs = stash.saved[2];
  const int64_t h = h_, batch = probs.shape()[0] / h, t = len_, hs = head_size_;
  const int64_t bk = batch * k_, gt = group() * t, rows_n = batch * t;
  const Tensor dy2 = dy.reshape({rows_n, dim_});
  const HeadViews in = headViews(heads, batch, h, k_, t, hs);

  Tensor dmerged = be.empty({rows_n, inner()});
  be.gemm(false, false, 1.0f, dy2, w_out_.trainable().value, 0.0f, dmerged);
  Tensor dcontext = be.empty({batch * h, t, hs});
  swapInner(be, dmerged, dcontext, batch, t, h, hs);
  const Tensor dctx = dcontext.reshape({bk, gt, hs});

  Tensor dheads = be.empty(heads.shape());
  const HeadViews d = headViews(dheads, batch, h, k_, t, hs);
  Tensor dscores = be.empty({batch * h, t, t});
  const Tensor ds = dscores.reshape({bk, gt, t});
  be.gemmBatched(false, true, 1.0f, dctx, in.v, 0.0f, ds);
  be.gemmBatched(true, false, 1.0f, probs.reshape({bk, gt, t}), dctx, 0.0f, d.v);
  be.softmaxBackward(probs, dscores, dscores);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  be.gemmBatched(false, false, scale, ds, in.k, 0.0f, d.q);
  be.gemmBatched(true, false, scale, ds, in.q, 0.0f, d.k);
  Tensor dqkv = mergeHeads(dheads, batch, t);
  if (rope_.enabled()) {  // the rotation's transpose: by minus the angle
    const std::vector<int32_t> positions = rowPositions(batch, t, 0);
    Tensor pos = be.empty({rows_n}, DType::kI32);
    be.upload(pos, positions.data());
    be.rope(dqkv, pos, inv_freq_, h_ + k_, true, dqkv);
  }
  Tensor dx = be.empty({rows_n, dim_});
  be.gemm(false, false, 1.0f, dqkv, w_qkv_.trainable().value, 0.0f, dx);
  if (part_) allreducePart(be, dx, *part_, 1);  // every rank's heads reach every input
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
  be.gemm(true, false, 1.0f, dy2, merged, 1.0f, w_out_.trainable().grad);
  if (out_bias_) be.biasGrad(dy2, b_out_.grad);
  be.gemm(true, false, 1.0f, dqkv, x2, 1.0f, w_qkv_.trainable().grad);
  if (qkv_bias_) be.biasGrad(dqkv, b_qkv_.grad);
  stash.clear();
}

// The cost facts of this rank's heads (all of them unless tensor-split).
int64_t Attention::paramCount() const {
  const int64_t qkv = totalHeads() * head_size_;
  return qkv * dim_ + (qkv_bias_ ? qkv : 0) + dim_ * inner() + (out_bias_ ? dim_ : 0);
}

int64_t Attention::paramBytes() const {
  const int64_t qkv = totalHeads() * head_size_;
  return weightBytes(format_, qkv, dim_) + weightBytes(format_, dim_, inner()) +
         4 * ((qkv_bias_ ? qkv : 0) + (out_bias_ ? dim_ : 0));
}

int64_t Attention::flops() const {
  const int64_t qkv = totalHeads() * head_size_;
  const int64_t projections = 2 * len_ * dim_ * (qkv + inner()) + (qkv_bias_ ? len_ * qkv : 0) +
                              (out_bias_ ? len_ * dim_ : 0);
  const int64_t products = 2 * 2 * len_ * len_ * inner();  // Q K^T and P V over the heads
  const int64_t rotation = rope_.enabled() ? 3 * len_ * (h_ + k_) * head_size_ : 0;
  return projections + products + rotation + 5 * h_ * len_ * len_;
}

int64_t Attention::stashBytes() const {
  // x, the heads (queries, keys, values), merged; probabilities
  return (len_ * (dim_ + inner()) + len_ * totalHeads() * head_size_ + h_ * len_ * len_) * 4;
}

LayerSpec Attention::spec() const {
  LayerSpec s;
  s.type = type();
  s.attrs["heads"] = heads_;
  if (kv_heads_ != heads_) s.attrs["kv_heads"] = kv_heads_;
  if (!causal_) s.attrs["causal"] = std::string("false");
  if (!qkv_bias_) s.attrs["qkv_bias"] = std::string("false");
  if (!out_bias_) s.attrs["out_bias"] = std::string("false");
  writeRope(rope_, s);
  format_.write(s);
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
  std::vector<OpUse> out =
      f32Ops(training, {Op::kGemm, Op::kGemmBatched, Op::kTranspose01, Op::kSoftmax},
             {Op::kSoftmaxBackward});
  // The samples' heads are gathered by one more transpose when K = H, by copies otherwise.
  if (kv_heads_ != heads_) out.push_back({Op::kCopy, DType::kF32});
  if (qkv_bias_ || out_bias_) {
    out.push_back({Op::kAddBias, DType::kF32});
    if (training) out.push_back({Op::kBiasGrad, DType::kF32});
  }
  if (rope_.enabled()) {
    out.push_back({Op::kRope, DType::kF32});
    out.push_back({Op::kUpload, DType::kI32});  // the rows' positions
  }
  out.push_back(weightOp(format_));  // the projections (backward's gemms are f32)
  return unionOps({out});
}

std::vector<OpUse> PositionalEmbedding::ops(bool training) const {
  return f32Ops(training, {Op::kCopy, Op::kAddBias}, {Op::kBiasGrad});
}

}  // namespace tandem
