// Causal multi-head self-attention and the learned positional embedding, the two layers a
// GPT adds to the MLP/CNN set (the transformer block composes them: transformer.h).
//
// Attention over per-sample [T, D] with H heads of size D / H:
//   qkv = x Wqkv^T + bqkv               [T, 3D]  (one fused projection, PyTorch's in_proj)
//   per head h: S = Q_h K_h^T / sqrt(D/H), P = causal softmax(S), O_h = P V_h
//   y = concat_h(O_h) Wo^T + bo         [T, D]
// composed from gemm, transpose01 and two ops added for it: a row softmax with the causal
// mask, and a batched gemm, so each per-head product is one call over every sample and
// head (B * H blocks; the CPU shares them out among its threads, OpenCL runs CLBlast's
// strided batched gemm). Decoding (a few tokens against a cache) runs a gemm per head.
#pragma once

#include "core/layers/layer.h"

namespace tandem {

class Attention final : public Layer {
 public:
  explicit Attention(const LayerSpec& spec);
  std::string type() const override { return "attention"; }
  void build(Backend& backend, Rng& rng) override;
  std::vector<Param*> params() override { return {&w_qkv_, &b_qkv_, &w_out_, &b_out_}; }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  Tensor decode(const Tensor& x, DecodeState& state) override;
  Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>& states) override;
  Tensor backwardInput(const Tensor& dy, Stash& stash) override;
  void backwardWeights(Stash& stash) override;
  int64_t paramCount() const override { return 4 * dim_ * dim_ + 4 * dim_; }
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override;
  int64_t stashBytes() const override;
  LayerSpec spec() const override;
  int64_t heads() const { return heads_; }
  bool causal() const { return causal_; }

 protected:
  Shape infer(const Shape& input) override;

 private:
  Tensor splitHeads(const Tensor& qkv, int64_t batch, int64_t t) const;

  int64_t heads_, dim_ = 0, len_ = 0, head_size_ = 0;
  bool causal_;
  Param w_qkv_, b_qkv_, w_out_, b_out_;
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
