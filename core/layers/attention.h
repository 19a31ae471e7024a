// Causal multi-head self-attention and the learned positional embedding, the two layers a
// GPT adds to the MLP/CNN set (the transformer block composes them: transformer.h).
//
// Attention over per-sample [T, D] with H query heads of size S = D / H and K key/value
// heads (grouped-query attention: each of K groups of H / K query heads shares one key and
// value head; K = H is multi-head attention, K = 1 multi-query):
//   qkv = x Wqkv^T + bqkv                 [T, (H + 2K) S]  (one fused projection)
//   queries and keys rotated by their position (rotary embedding, rope.h), if asked
//   per head h: S = Q_h K_g^T / sqrt(S), P = causal softmax(S), O_h = P V_g, g = h / (H/K)
//   y = concat_h(O_h) Wo^T + bo           [T, D]
// composed from gemm, transpose01, rope and two ops added for it: a row softmax with the
// causal mask, and a batched gemm. The H / K query heads of a group are adjacent, so one
// block of the batched gemm takes a whole group against its key head (B * K blocks of
// (H/K) T rows): grouping costs no copies. Decoding (a few tokens against a cache of K key
// and value heads) runs a gemm per sequence and group.
#pragma once

#include "core/layers/layer.h"
#include "core/layers/rope.h"
#include "core/layers/tensor_split.h"
#include "core/layers/weight_matrix.h"

namespace tandem {

// `attention: {heads: 8, kv_heads: 2, qkv_bias: false, out_bias: false, rope_theta: 1e4}`;
// kv_heads defaults to heads, the biases to true, rope_theta to none (rope.h: the scaling);
// `weights: int8` (and `group`) quantizes both projections (weight_matrix.h).
// Tensor-split (tensor_split.h) by key/value head groups: a rank computes whole groups —
// its query heads and their key and value heads, the rows of Wqkv that make them (column-
// parallel) — and its heads' columns of Wo (row-parallel): its partial output is summed over
// the ranks (one all-reduce) before the output bias; backward's input gradient likewise.
// Decoding keeps the keys and values of the rank's own heads only.
class Attention final : public Layer, public TensorSplitBlock {
 public:
  explicit Attention(const LayerSpec& spec);
  std::string type() const override { return "attention"; }
  void build(Backend& backend, Rng& rng) override;
  std::vector<Param*> params() override;
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  Tensor decode(const Tensor& x, DecodeState& state) override;
  Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>& states) override;
  Tensor backwardInput(const Tensor& dy, Stash& stash) override;
  void backwardWeights(Stash& stash) override;
  int64_t paramCount() const override;
  int64_t paramBytes() const override;
  bool trains() const override { return !format_.int8; }
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override;
  int64_t stashBytes() const override;
  LayerSpec spec() const override;
  int64_t heads() const { return heads_; }
  int64_t kvHeads() const { return kv_heads_; }
  bool causal() const { return causal_; }
  bool qkvBias() const { return qkv_bias_; }
  bool outBias() const { return out_bias_; }
  const RopeSpec& rope() const { return rope_; }
  bool tensorSplits() const override { return !format_.int8; }
  void splitTensor(Group& group, const std::vector<double>& shares, uint64_t& next_tag) override;
  int tensorAllreduces() const override { return 1; }  // the output's (row-parallel) sum

 protected:
  Shape infer(const Shape& input) override;

 private:
  // The heads this rank computes (all of them unless tensor-split), and their width.
  int64_t totalHeads() const { return h_ + 2 * k_; }
  int64_t inner() const { return h_ * head_size_; }
  void buildPart(Backend& backend, Rng& rng, float bound);
  int64_t group() const { return heads_ / kv_heads_; }
  // qkv [rows, (H + 2K) S] from x [rows, D], rotated when rope is on (positions: one per
  // row; callers build them only then).
  Tensor project(const Tensor& x2, const std::vector<int32_t>& positions);
  Tensor splitHeads(const Tensor& qkv, int64_t batch, int64_t t) const;
  Tensor mergeHeads(const Tensor& heads, int64_t batch, int64_t t) const;
  Tensor output(const Tensor& merged);

  int64_t heads_, kv_heads_ = 0, dim_ = 0, len_ = 0, head_size_ = 0;
  int64_t h_ = 0, k_ = 0;           // query and key/value heads on this rank
  std::optional<TensorPart> part_;  // a tensor part: key/value head groups [begin, end)
  bool causal_, qkv_bias_, out_bias_;
  RopeSpec rope_;
  Tensor inv_freq_;      // [S / 2] when rope is on
  WeightFormat format_;  // both projections'
  WeightMatrix w_qkv_, w_out_;
  Param b_qkv_, b_out_;
};

// y = x + P[:T] for per-sample [T, D] with a learned table P [context, D].
class PositionalEmbedding final : public Layer {
 public:
  explicit PositionalEmbedding(const LayerSpec& spec);
  std::string type() const override { return "positional"; }
  void build(Backend& backend, Rng& rng) override;
  std::vector<Param*> params() override { return {&table_}; }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  Tensor decode(const Tensor& x, DecodeState& state) override;
  Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>& states) override;
  int64_t paramCount() const override { return context_ * dim_; }
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override { return inputShape().numel(); }
  LayerSpec spec() const override;

 protected:
  Shape infer(const Shape& input) override;

 private:
  int64_t context_, dim_ = 0;
  Param table_;
};

}  // namespace tandem
