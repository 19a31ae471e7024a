// LayerNorm and RmsNorm over the last dimension, and Embedding (integer ids -> learned
// vectors).
#pragma once

#include "core/layers/layer.h"

namespace tandem {

class LayerNorm final : public Layer {
 public:
  explicit LayerNorm(const LayerSpec& spec);
  std::string type() const override { return "layernorm"; }
  void build(Backend& backend, Rng& rng) override;
  std::vector<Param*> params() override { return {&gamma_, &beta_}; }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor decode(const Tensor& x, DecodeState&) override { return forwardPerToken(x); }
  Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>&) override {
    return forwardPerToken(x);
  }
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  int64_t paramCount() const override { return 2 * dim_; }
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override { return 8 * inputShape().numel(); }
  int64_t stashBytes() const override;
  LayerSpec spec() const override;

 protected:
  Shape infer(const Shape& input) override;

 private:
  int64_t dim_ = 0;
  float eps_;
  Param gamma_, beta_;
};

// Llama's RMSNorm: y = x / sqrt(mean(x^2) + eps) * gamma over the last dimension (Hugging
// Face's LlamaRMSNorm; its `weight` is gamma). `rmsnorm: {eps: 1e-6}`.
class RmsNorm final : public Layer {
 public:
  explicit RmsNorm(const LayerSpec& spec);
  std::string type() const override { return "rmsnorm"; }
  void build(Backend& backend, Rng& rng) override;
  std::vector<Param*> params() override { return {&gamma_}; }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor decode(const Tensor& x, DecodeState&) override { return forwardPerToken(x); }
  Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>&) override {
    return forwardPerToken(x);
  }
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  int64_t paramCount() const override { return dim_; }
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override { return 4 * inputShape().numel(); }
  int64_t stashBytes() const override;
  LayerSpec spec() const override;
  float eps() const { return eps_; }

 protected:
  Shape infer(const Shape& input) override;

 private:
  int64_t dim_ = 0;
  float eps_;
  Param gamma_;
};

// Batch normalisation over the channels of per-sample [C, ...] inputs (PyTorch's
// BatchNorm1d/2d): training normalises with the batch's statistics (each microbatch's, as
// PyTorch's train mode; more than one value per channel) and moves the running ones by
// `momentum` (the running variance unbiased); inference uses the running statistics.
// `batchnorm: {eps: 1e-5, momentum: 0.1}`. Its running mean and variance are parameters
// without a gradient: saved with the model and its checkpoints, never trained.
class BatchNorm final : public Layer {
 public:
  explicit BatchNorm(const LayerSpec& spec);
  std::string type() const override { return "batchnorm"; }
  void build(Backend& backend, Rng& rng) override;
  std::vector<Param*> params() override { return {&gamma_, &beta_, &mean_, &var_}; }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  int64_t paramCount() const override { return 2 * channels_; }  // trained ones
  int64_t paramBytes() const override { return 4 * channels_ * 4; }
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override { return 4 * inputShape().numel(); }
  int64_t stashBytes() const override { return inputShape().numel() * 4; }
  LayerSpec spec() const override;

 protected:
  Shape infer(const Shape& input) override;

 private:
  int64_t channels_ = 0;
  float eps_, momentum_;
  Param gamma_, beta_, mean_, var_;
};

// Input: per-sample [T] of i32 ids in [0, vocab); output [T, dim].
class Embedding final : public Layer {
 public:
  explicit Embedding(const LayerSpec& spec);
  std::string type() const override { return "embedding"; }
  DType inputDType() const override { return DType::kI32; }
  void build(Backend& backend, Rng& rng) override;
  std::vector<Param*> params() override { return {&table_}; }
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) override;
  // Ids have no gradient: dx is never produced.
  Tensor decode(const Tensor& x, DecodeState&) override { return forwardPerToken(x); }
  Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>&) override {
    return forwardPerToken(x);
  }
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) override;
  int64_t paramCount() const override { return vocab_ * dim_; }
  std::vector<OpUse> ops(bool training) const override;
  int64_t flops() const override { return 0; }
  int64_t stashBytes() const override { return inputShape().numel() * 4; }
  LayerSpec spec() const override;

 protected:
  Shape infer(const Shape& input) override;

 private:
  int64_t vocab_, dim_;
  Param table_;
};

}  // namespace tandem
