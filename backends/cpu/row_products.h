// Products of a few rows with a weight matrix, as decoding takes them: x [m, k] times
// w [n, k] transposed, for f32 weights (gemm's x w^T with few rows) and int8 weights with
// scales (gemmQ8). Such a product reads every weight once for a handful of multiply-adds,
// so it is bound by how fast the weights stream from memory: sgemm would first copy (pack)
// them, and int8 reads a quarter of f32's bytes. Each output's sum runs in one order that
// depends on neither the row count (below kFewRows) nor the threads, so a sequence decodes
// bitwise alike alone and beside others.
#pragma once

#include <cstdint>

#include "backends/cpu/thread_pool.h"

namespace tandem::cpu {

// Below this many rows the row kernels; from it on sgemm (f32) or dequantized panels and
// sgemm (int8).
constexpr int64_t kFewRows = 16;

// y = alpha * x w^T + beta * y (beta 0: y is not read), m < kFewRows; x, w and y
// contiguous ([m, k], [n, k], [m, n]).
void fewRowsF32(ThreadPool& pool, const float* x, const float* w, float alpha, float beta, float* y,
                int64_t m, int64_t n, int64_t k);

// y = alpha * x w + beta * y, m < kFewRows, w as it lies ([k, n]; x and y as above): each
// output one chain of fused multiply-adds over k in order, alike in every row count and on
// any thread, as a sequence decoding beside others needs of attention's weights times its
// cached values (m = the query heads of a group; sgemm would pack the values each call,
// which cost more than the product). false (nothing done) on a CPU without AVX2 and FMA,
// where sgemm does it.
bool fewRowsNnF32(ThreadPool& pool, const float* x, const float* w, float alpha, float beta,
                  float* y, int64_t m, int64_t n, int64_t k);

}  // namespace tandem::cpu
