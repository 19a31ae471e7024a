// Argument checks every backend runs before an op, so a bad call gets the same message
// on each device ("<device> <op>: ..."), and the shapes they derive (GEMM sizes, the
// [N, C, R] view of a per-channel op). Ops call them before touching memory.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/backend.h"

namespace tandem::backends {

// Element counts of a and b agree.
void checkSameCount(const Tensor& a, const Tensor& b, std::string_view device, const char* op);

// [N, C, R] view of a tensor whose dimension 1 holds `channels` (bias, per-channel ops).
struct ChannelView {
  int64_t n, c, r;
};
ChannelView channelView(const Tensor& y, int64_t channels, std::string_view device, const char* op);

// Rows of x viewed as [M, d]: its last dimension must be d > 0.
int64_t rowsOf(const Tensor& x, int64_t d, std::string_view device, const char* op);

// x is [N, C, H, W] for the window, and the window leaves an output.
void checkWindowInput(const Tensor& x, const Window2d& g, std::string_view device, const char* op);
// Pooling: input [n, C, H, W] fits the window and pooled is its [n, C, OH, OW] output
// (x and y forward, dx and dy backward); returns n.
int64_t checkPool(const Tensor& input, const Tensor& pooled, const Window2d& g,
                  std::string_view device, const char* op);

// col is [C*kh*kw, n*OH*OW] for images [n, C, H, W] (im2col's output, col2im's input).
void checkColumns(const Tensor& col, const Tensor& images, const Window2d& g,
                  std::string_view device, const char* op);
// A convolution's tensors: x [n, C, H, W] matching the window, w of OC * C*kh*kw elements
// (OC from y), y [n, OC, OH, OW], bias undefined or [OC] elements; all f32-sized. Returns n,
// OC and K = C*kh*kw.
struct ConvDims {
  int64_t n = 0, oc = 0, k = 0;
};
ConvDims checkConv(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                   const Window2d& g, std::string_view device, const char* op);
// A depthwise convolution's tensors: x [n, C, H, W] matching the window, w of C*kh*kw
// values, y [n, C, OH, OW]. Returns n.
int64_t checkDepthwise(const Tensor& x, const Tensor& w, const Tensor& y, const Window2d& g,
                       std::string_view device, const char* op);
// argmax has the shape of the pooled tensor y (max pooling and its backward).
void checkArgmax(const Tensor& argmax, const Tensor& y, std::string_view device, const char* op);

// src viewed as [a, b, r] can be written to dst as [b, a, r].
struct Transpose01 {
  int64_t a, b, r;
};
Transpose01 checkTranspose01(const Tensor& src, const Tensor& dst, std::string_view device);

// Layer norm over rows [m, d] of x, d = gamma.numel(); every argument sized to match.
struct RowsView {
  int64_t m, d;
};
RowsView checkLayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd, std::string_view device);
RowsView checkLayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                const Tensor& dgamma, const Tensor& dbeta, std::string_view device);

// RMS norm over rows [m, d] of x, d = gamma.numel(); every argument sized to match.
RowsView checkRmsNorm(const Tensor& x, const Tensor& gamma, const Tensor& y, const Tensor& rstd,
                      std::string_view device);
RowsView checkRmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                              const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                              std::string_view device);

// Batch norm over x viewed as [n, c, r], c = gamma.numel() = x's dimension 1; every
// argument sized to match (f32).
ChannelView checkBatchNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                           const Tensor& mean, const Tensor& var, const Tensor& y,
                           std::string_view device, const char* op);
ChannelView checkBatchNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                   const Tensor& mean, const Tensor& var, const Tensor& dx,
                                   const Tensor& dgamma, const Tensor& dbeta,
                                   std::string_view device);

// Rotary embedding of the first `heads` heads of x viewed as [rows, all heads, size]:
// rows = positions.numel() (i32), size = 2 * inv_freq.numel() (f32), 0 < heads <= all
// heads, y as many elements as x.
struct RopeView {
  int64_t rows, heads, all_heads, size;
};
RopeView checkRope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, int64_t heads,
                   const Tensor& y, std::string_view device);

// An embedding table [vocab, d] (or its gradient) and rows [m, d] for m ids (the lookup's
// output or the gradient flowing back). Ids themselves: checkIds.
struct EmbeddingView {
  int64_t vocab, d, m;
};
EmbeddingView checkEmbedding(const Tensor& ids, const Tensor& table, const Tensor& rows,
                             std::string_view device, const char* op);

// Rows of the last dimension of x viewed as [n, tq, tk] (rows = n * tq), the other
// tensors the same size. Causal needs tk >= tq (each query row sees at least one key).
struct SoftmaxView {
  int64_t rows, tq, tk;
};
SoftmaxView checkSoftmax(const Tensor& x, const Tensor& y, bool causal, std::string_view device,
                         const char* op);

// logits [n, c], labels and losses [n], dlogits [n, c] when defined.
struct LogitsView {
  int64_t n, c;
};
LogitsView checkSoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels,
                                    const Tensor& losses, const Tensor& dlogits,
                                    std::string_view device);

// c = op(a) * op(b): m x k times k x n; InvalidArgument when the shapes disagree.
struct GemmDims {
  int64_t m, n, k;
};
GemmDims gemmDims(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b, const Tensor& c);
// gemmQ8's operands: x f32 [M, K], w i8 [N, K], scales f32 [N, K / group], y f32 [M, N].
struct GemmQ8Dims {
  int64_t m, n, k, group;
};
GemmQ8Dims checkGemmQ8(const Tensor& x, const Tensor& w, const Tensor& scales, const Tensor& y,
                       std::string_view device);
// The blocks of a batched gemm: a, b and c rank 3 with the same first dimension; `matrix`
// views one block [rows, cols] of each (the first) for gemmDims.
struct BatchedGemm {
  int64_t batch;
  GemmDims dims;
};
BatchedGemm batchedGemmDims(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b,
                            const Tensor& c);

// Every id in [0, limit); the first that is not raises InvalidArgument, e.g.
// checkIds(.., "embedding id", "at position") -> "embedding id 12 at position 3 is outside
// [0, 10)".
void checkIds(const int32_t* ids, int64_t count, int64_t limit, const char* what,
              const char* where);

}  // namespace tandem::backends
