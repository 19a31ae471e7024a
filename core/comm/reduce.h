// The reduction kernels the groups share (transport/'s in-process and peer groups): the
// steps of a reduction over fp32 buffers, in rank order, bitwise the same on every rank.
// Kept out of group.h, the interface callers see.
#pragma once

#include <cstddef>
#include <span>

#include "core/comm/group.h"

namespace tandem {

// The reduction's steps, shared by the groups: acc[i] = acc[i] op x[i] (sum and mean
// add, max keeps the larger, the first of equal or unordered values), or out[i] = x[i]
// op y[i] (`out` may be x or y), then, for the mean, acc[i] / ranks.
void accumulate(std::span<float> acc, std::span<const float> x, ReduceOp op);
void combine(std::span<float> out, std::span<const float> x, std::span<const float> y, ReduceOp op);
void finishReduce(std::span<float> acc, ReduceOp op, int ranks);
// All three at once, the in-process group's kernel: every out[j][begin, end) = op over
// src[0], src[1], ... in that order, for the mean divided by src.size(); bitwise what the
// steps above give. An output may be a source. With AVX2, tiles of 32 values are reduced
// in registers and stored to every output: each value is read once from every source and
// written once to every output, nothing more.
void reduceInto(std::span<float* const> out, std::span<const float* const> src, size_t begin,
                size_t end, ReduceOp op);
namespace detail {
// reduceInto without AVX2 (blocks reduced in a buffer with the steps above, then copied to
// every output): what runs elsewhere; tests compare the two.
void reduceIntoPortable(std::span<float* const> out, std::span<const float* const> src,
                        size_t begin, size_t end, ReduceOp op);
}  // namespace detail

}  // namespace tandem
