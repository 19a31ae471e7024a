// The ops every Backend implements, listed once. The list declares Backend's pure virtual
// ops (core/backend.h), each backend's overrides (TANDEM_BACKEND_OP_OVERRIDES), the `Op`
// names that capability queries use (Backend::supports), and the tests' forwarding
// backends; an op added here is declared everywhere at once.
//
// Each entry: X(Name, return type, name, (parameters), (arguments)) — `Op::kName` is the
// op's name in queries, the last two are its signature and the names that forward it.
// The comments before an entry are the op's contract.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

// clang-format off
#define TANDEM_BACKEND_OPS(X)                                                                  \
  /* --- buffers --- */                                                                        \
  /* Copies dst.bytes() bytes from host memory into dst. */                                    \
  X(Upload, void, upload, (const Tensor& dst, const void* src), (dst, src))                    \
  /* Copies src.bytes() bytes of src into host memory; waits for pending work. */              \
  X(Download, void, download, (const Tensor& src, void* dst), (src, dst))                      \
  X(Copy, void, copy, (const Tensor& src, const Tensor& dst), (src, dst))                      \
  /* Sets every element (f32 or i32 tensors) to value. */                                      \
  X(Fill, void, fill, (const Tensor& dst, float value), (dst, value))                          \
  /* Element-wise dtype conversion between f32 and f16, bf16 or i32 (either way). */           \
  X(Convert, void, convert, (const Tensor& src, const Tensor& dst), (src, dst))                \
  X(Synchronize, void, synchronize, (), ())                                                    \
  /* --- dense math --- */                                                                     \
  /* c = alpha * op(a) * op(b) + beta * c, all 2-D row-major. */                               \
  X(Gemm, void, gemm, (bool trans_a, bool trans_b, float alpha, const Tensor& a,               \
                       const Tensor& b, float beta, const Tensor& c),                          \
    (trans_a, trans_b, alpha, a, b, beta, c))                                                  \
  /* y = x w^T for x f32 [M, K], int8 weights w [N, K] with f32 scales [N, K / G]           \
     (weight-only quantization; G, the group, divides K; G = K: one scale per output row):  \
     w[n, k] stands for w[n, k] * scales[n, k / G]. y f32 [M, N] is overwritten. Keyed by    \
     i8. Each group's products are summed in f32 before its scale multiplies them. */       \
  X(GemmQ8, void, gemmQ8, (const Tensor& x, const Tensor& w, const Tensor& scales,           \
                           const Tensor& y),                                                 \
    (x, w, scales, y))                                                                       \
  /* The same for each i < batch of a, b and c viewed as [batch, rows, cols] (one gemm per     \
     block, e.g. per sample and attention head); backends may run the blocks in parallel. */  \
  X(GemmBatched, void, gemmBatched, (bool trans_a, bool trans_b, float alpha, const Tensor& a, \
                                     const Tensor& b, float beta, const Tensor& c),            \
    (trans_a, trans_b, alpha, a, b, beta, c))                                                  \
  /* y = alpha * x + beta * y */                                                               \
  X(Axpby, void, axpby, (float alpha, const Tensor& x, float beta, const Tensor& y),           \
    (alpha, x, beta, y))                                                                       \
  /* out = a * b element-wise (out may alias a or b) */                                        \
  X(Mul, void, mul, (const Tensor& a, const Tensor& b, const Tensor& out), (a, b, out))        \
  /* sum(a * b), accumulated in double; waits for the result. */                               \
  X(Dot, double, dot, (const Tensor& a, const Tensor& b), (a, b))                              \
  /* y[n, c, r] += bias[c] for y viewed as [N, C, R] with C = bias.numel(). */                 \
  X(AddBias, void, addBias, (const Tensor& y, const Tensor& bias), (y, bias))                  \
  /* db[c] += sum over n, r of dy[n, c, r]. */                                                 \
  X(BiasGrad, void, biasGrad, (const Tensor& dy, const Tensor& db), (dy, db))                  \
  /* --- activations --- */                                                                    \
  X(Activation, void, activation, (Activation kind, const Tensor& x, const Tensor& y),         \
    (kind, x, y))                                                                              \
  /* dx = dy * f'(x). GELU and SiLU read x; ReLU, tanh and sigmoid read y (ReLU's y > 0      \
     exactly where x > 0). The other may be undefined. Inputs and outputs must not overlap. */ \
  X(ActivationBackward, void, activationBackward, (Activation kind, const Tensor& x,           \
                                                   const Tensor& y, const Tensor& dy,          \
                                                   const Tensor& dx),                          \
    (kind, x, y, dy, dx))                                                                      \
  /* mask[i] = 0 with probability p, else 1/(1-p), from a counter-based hash of (seed, i),     \
     so every backend draws the same mask; y = x * mask. */                                    \
  X(Dropout, void, dropout, (const Tensor& x, float p, uint64_t seed, const Tensor& mask,      \
                             const Tensor& y),                                                 \
    (x, p, seed, mask, y))                                                                     \
  /* --- convolution support --- */                                                            \
  /* x [n, C, H, W] -> col [C*kh*kw, n*OH*OW] (column index = sample * OH*OW + pixel). */      \
  X(Im2col, void, im2col, (const Tensor& x, const Window2d& g, const Tensor& col), (x, g, col)) \
  /* The adjoint of im2col: dx [n, C, H, W] = sum of col's entries into their pixels. */       \
  X(Col2im, void, col2im, (const Tensor& col, const Window2d& g, const Tensor& dx),             \
    (col, g, dx))                                                                              \
  /* src viewed as [A, B, R] (A = dim 0, B = dim 1) -> dst [B, A, R]. */                       \
  X(Transpose01, void, transpose01, (const Tensor& src, const Tensor& dst), (src, dst))        \
  /* --- convolution: x [n, C, H, W] (C = g.channels), w [OC, C, kh, kw] or [OC, C*kh*kw] --- */ \
  /* y [n, OC, OH, OW] = the cross-correlation of x with w, plus bias[o] where bias is         \
     defined ([OC]). Each output's sum over C*kh*kw runs in one order whatever the batch    \
     and threads (a sample's outputs never depend on the others in its batch). */          \
  X(Conv2d, void, conv2d, (const Tensor& x, const Tensor& w, const Tensor& bias,               \
                           const Window2d& g, const Tensor& y),                                \
    (x, w, bias, g, y))                                                                        \
  /* dx [n, C, H, W] (overwritten) = conv2d's input gradient for dy [n, OC, OH, OW]. */        \
  X(Conv2dBackwardData, void, conv2dBackwardData, (const Tensor& dy, const Tensor& w,          \
                                                   const Window2d& g, const Tensor& dx),       \
    (dy, w, g, dx))                                                                            \
  /* dw += conv2d's weight gradient and db[o] += dy's sum over samples and pixels (where db    \
     is defined), each summed sample by sample in the batch's order, whatever the threads. */ \
  X(Conv2dBackwardWeight, void, conv2dBackwardWeight, (const Tensor& x, const Tensor& dy,      \
                                                       const Window2d& g, const Tensor& dw,    \
                                                       const Tensor& db),                      \
    (x, dy, g, dw, db))                                                                        \
  /* --- depthwise convolution: x [n, C, H, W] (C = g.channels), w [C, 1, kh, kw] (C*kh*kw   \
     values): channel c of y [n, C, OH, OW] is the cross-correlation of x's channel c with   \
     w's, each output's taps summed from 0 in (ki, kj) order; no bias (addBias after). */   \
  X(DepthwiseConv2d, void, depthwiseConv2d, (const Tensor& x, const Tensor& w,                 \
                                             const Window2d& g, const Tensor& y),              \
    (x, w, g, y))                                                                              \
  /* dx [n, C, H, W] (overwritten) = its input gradient for dy [n, C, OH, OW]. */              \
  X(DepthwiseConv2dBackwardData, void, depthwiseConv2dBackwardData,                            \
    (const Tensor& dy, const Tensor& w, const Window2d& g, const Tensor& dx), (dy, w, g, dx))  \
  /* dw += its weight gradient, summed sample by sample in the batch's order (each sample's   \
     share over its outputs in order), whatever the threads. */                             \
  X(DepthwiseConv2dBackwardWeight, void, depthwiseConv2dBackwardWeight,                        \
    (const Tensor& x, const Tensor& dy, const Window2d& g, const Tensor& dw), (x, dy, g, dw))  \
  /* --- pooling over [N, C, H, W] --- */                                                      \
  /* argmax (i32) holds, per output, the flat index inside its input plane. */                 \
  X(MaxPool, void, maxPool, (const Tensor& x, const Window2d& g, const Tensor& y,              \
                             const Tensor& argmax),                                            \
    (x, g, y, argmax))                                                                         \
  X(MaxPoolBackward, void, maxPoolBackward, (const Tensor& dy, const Tensor& argmax,           \
                                             const Window2d& g, const Tensor& dx),             \
    (dy, argmax, g, dx))                                                                       \
  /* Average over the window, padding counted as zeros (divisor kh*kw). */                     \
  X(AvgPool, void, avgPool, (const Tensor& x, const Window2d& g, const Tensor& y), (x, g, y))  \
  X(AvgPoolBackward, void, avgPoolBackward, (const Tensor& dy, const Window2d& g,              \
                                             const Tensor& dx),                                \
    (dy, g, dx))                                                                               \
  /* --- normalisation: rows of x [M, D] --- */                                                \
  X(LayerNorm, void, layerNorm, (const Tensor& x, const Tensor& gamma, const Tensor& beta,     \
                                 float eps, const Tensor& y, const Tensor& mean,               \
                                 const Tensor& rstd),                                          \
    (x, gamma, beta, eps, y, mean, rstd))                                                      \
  /* Writes dx; accumulates into dgamma and dbeta. */                                          \
  X(LayerNormBackward, void, layerNormBackward, (const Tensor& dy, const Tensor& x,            \
                                                 const Tensor& gamma, const Tensor& mean,      \
                                                 const Tensor& rstd, const Tensor& dx,         \
                                                 const Tensor& dgamma, const Tensor& dbeta),   \
    (dy, x, gamma, mean, rstd, dx, dgamma, dbeta))                                             \
  /* RMS norm (Llama's): y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps) per row. */   \
  X(RmsNorm, void, rmsNorm, (const Tensor& x, const Tensor& gamma, float eps, const Tensor& y, \
                             const Tensor& rstd),                                              \
    (x, gamma, eps, y, rstd))                                                                  \
  /* Writes dx; accumulates into dgamma. */                                                    \
  X(RmsNormBackward, void, rmsNormBackward, (const Tensor& dy, const Tensor& x,                \
                                             const Tensor& gamma, const Tensor& rstd,          \
                                             const Tensor& dx, const Tensor& dgamma),          \
    (dy, x, gamma, rstd, dx, dgamma))                                                          \
  /* --- batch normalisation: x viewed as [N, C, R], C = gamma.numel() (channels of          \
     [N, C, H, W], features of [N, C]) --- */                                                 \
  /* With `batch`, mean[c] and var[c] (biased) of channel c's N*R values are written (sums    \
     in double, in sample and position order); otherwise they are read (running             \
     statistics). y = (x - mean[c]) * (rstd[c] * gamma[c]) + beta[c], rstd[c] = 1 /         \
     sqrt(var[c] + eps) computed from the f32 var. y may alias x. */                         \
  X(BatchNorm, void, batchNorm, (const Tensor& x, const Tensor& gamma, const Tensor& beta,     \
                                 float eps, bool batch, const Tensor& mean, const Tensor& var, \
                                 const Tensor& y),                                             \
    (x, gamma, beta, eps, batch, mean, var, y))                                                \
  /* The gradient through batchNorm with batch statistics: dx written (the batch's mean and   \
     variance differentiated too; dx may alias dy); with xhat = (x - mean[c]) * rstd[c],      \
     dgamma[c] += sum dy * xhat, dbeta[c] += sum dy. */                                       \
  X(BatchNormBackward, void, batchNormBackward, (const Tensor& dy, const Tensor& x,            \
                                                 const Tensor& gamma, const Tensor& mean,      \
                                                 const Tensor& var, float eps,                 \
                                                 const Tensor& dx, const Tensor& dgamma,       \
                                                 const Tensor& dbeta),                         \
    (dy, x, gamma, mean, var, eps, dx, dgamma, dbeta))                                         \
  /* --- rotary position embedding --- */                                                     \
  /* x viewed as [R, H, S], R = positions.numel(), S = 2 * inv_freq.numel(): rotates the       \
     first `heads` heads of each row (queries and keys of a fused projection; the rest are    \
     not written) pair by pair, (i, i + S/2) as Hugging Face's rotate_half, by the angle      \
     a = float(positions[r]) * inv_freq[i], a product in f32: y[i] = x[i] cos a -             \
     x[i + S/2] sin a, y[i + S/2] = x[i + S/2] cos a + x[i] sin a; inverse rotates by -a      \
     (the backward). positions i32 [R], inv_freq f32 [S/2]; y may alias x. */                 \
  X(Rope, void, rope, (const Tensor& x, const Tensor& positions, const Tensor& inv_freq,       \
                       int64_t heads, bool inverse, const Tensor& y),                          \
    (x, positions, inv_freq, heads, inverse, y))                                               \
  /* --- embedding: ids i32 [M], table [V, D] --- */                                           \
  /* Ids outside [0, V) raise InvalidArgument naming the id. */                                \
  X(Embedding, void, embedding, (const Tensor& ids, const Tensor& table, const Tensor& y),     \
    (ids, table, y))                                                                           \
  X(EmbeddingBackward, void, embeddingBackward, (const Tensor& ids, const Tensor& dy,          \
                                                 const Tensor& dtable),                        \
    (ids, dy, dtable))                                                                         \
  /* --- attention: softmax over the last dimension --- */                                     \
  /* y = softmax(x) per row of x viewed as [N, Tq, Tk]. With causal, query row i sees keys     \
     [0, Tk - Tq + i] only and y is 0 beyond them: Tq = Tk for a whole sequence, Tq = 1        \
     for one decoding step over a cache of Tk keys. y may alias x. */                          \
  X(Softmax, void, softmax, (const Tensor& x, bool causal, const Tensor& y), (x, causal, y))   \
  /* dx = y * (dy - sum(dy * y)) per row, the gradient through y = softmax(x); dx may          \
     alias dy. */                                                                              \
  X(SoftmaxBackward, void, softmaxBackward, (const Tensor& y, const Tensor& dy,                \
                                             const Tensor& dx),                                \
    (y, dy, dx))                                                                               \
  /* --- loss --- */                                                                           \
  /* Per row of logits [N, C] with label i32 [N]: losses[n] = -log softmax(logits)[label],     \
     dlogits = (softmax - onehot) * grad_scale. Labels outside [0, C) raise                    \
     InvalidArgument. */                                                                       \
  X(SoftmaxCrossEntropy, void, softmaxCrossEntropy, (const Tensor& logits,                     \
                                                     const Tensor& labels, float grad_scale,   \
                                                     const Tensor& losses,                     \
                                                     const Tensor& dlogits),                   \
    (logits, labels, grad_scale, losses, dlogits))                                             \
  /* --- optimizers (in place on param and state) --- */                                       \
  X(SgdStep, void, sgdStep, (const Tensor& param, const Tensor& grad, const Tensor& velocity,  \
                             const SgdStep& s),                                                \
    (param, grad, velocity, s))                                                                \
  X(AdamwStep, void, adamwStep, (const Tensor& param, const Tensor& grad, const Tensor& m,     \
                                 const Tensor& v, const AdamWStep& s),                         \
    (param, grad, m, v, s))
// clang-format on

// A backend's overrides of every op, in its class body.
#define TANDEM_BACKEND_OP_OVERRIDE(Name, Ret, name, Params, Args) Ret name Params override;
#define TANDEM_BACKEND_OP_OVERRIDES TANDEM_BACKEND_OPS(TANDEM_BACKEND_OP_OVERRIDE)

namespace tandem {

enum class Op : uint8_t {
#define TANDEM_BACKEND_OP_ENUM(Name, Ret, name, Params, Args) k##Name,
  TANDEM_BACKEND_OPS(TANDEM_BACKEND_OP_ENUM)
#undef TANDEM_BACKEND_OP_ENUM
};

inline constexpr Op kAllOps[] = {
#define TANDEM_BACKEND_OP_VALUE(Name, Ret, name, Params, Args) Op::k##Name,
    TANDEM_BACKEND_OPS(TANDEM_BACKEND_OP_VALUE)
#undef TANDEM_BACKEND_OP_VALUE
};

// The op's method name ("gemm", "layerNorm").
std::string_view opName(Op op);

// One op a layer (or a step) runs, and the data type it runs it on: the dtype of the op's
// first tensor argument (embedding's ids: i32), except for convert, where it is the side
// that is not f32 (convert on f16: between f32 and f16). Ops without tensors
// (synchronize) take f32.
struct OpUse {
  Op op = Op::kCopy;
  DType dtype = DType::kF32;
  friend bool operator==(const OpUse&, const OpUse&) = default;
  friend auto operator<=>(const OpUse&, const OpUse&) = default;
};

// "gemm on f32", and back (InvalidArgument naming the text).
std::string opUseName(const OpUse& use);
OpUse parseOpUse(std::string_view text);
// "gemm on f32, softmax on f32".
std::string opUseNames(const std::vector<OpUse>& uses);

// What the CPU and OpenCL backends both run: every math op on f32 (embedding's on i32
// ids, gemmQ8 keyed by its i8 weights), buffers of any dtype, fill on f32 and i32, convert
// between f32 and f16, bf16 or i32. A backend's supports() starts from it and says where it
// differs.
bool commonOpSupport(Op op, DType dtype);

}  // namespace tandem
