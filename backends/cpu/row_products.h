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

}  // namespace tandem::cpu
