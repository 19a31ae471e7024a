// The column matrix of a convolution, one sample at a time: the building blocks of
// im2col/col2im (spatial.cpp) and of the direct convolution kernels (conv.cpp).
#pragma once

#include <cstdint>

#include "core/backend.h"

namespace tandem::cpu {

// Writes rows [r0, r1) of one sample's column matrix (row c * kh*kw + ki * kw + kj: input
// channel c under kernel tap (ki, kj)) for output rows [oy0, oy1): row r's entry at column
// (oy - oy0) * OW + ox is the input under that tap (0 in the padding). Row r goes to
// col + (r - r0) * ld.
void im2colRows(const float* x, const Window2d& g, int64_t r0, int64_t r1, int64_t oy0, int64_t oy1,
                float* col, int64_t ld);

// The adjoint for the rows of input channels [c0, c1) (row c * kh*kw + ... at col +
// (c * kh*kw - c0 * kh*kw + ...) * ld): adds each entry into the pixel of dx [C, H, W] it
// was read from, channel by channel, then tap by tap (ki, kj), then output row by row.
void col2imRows(const float* col, int64_t ld, const Window2d& g, int64_t c0, int64_t c1,
                int64_t oy0, int64_t oy1, float* dx);

}  // namespace tandem::cpu
