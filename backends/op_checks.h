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
// y is the window's [n, C, OH, OW] output.
void checkWindowOutput(const Tensor& y, int64_t n, const Window2d& g, std::string_view device,
                       const char* op);

// c = op(a) * op(b): m x k times k x n; InvalidArgument when the shapes disagree.
struct GemmDims {
  int64_t m, n, k;
};
GemmDims gemmDims(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b, const Tensor& c);

// Every id in [0, limit); the first that is not raises InvalidArgument, e.g.
// checkIds(.., "embedding id", "at position") -> "embedding id 12 at position 3 is outside
// [0, 10)".
void checkIds(const int32_t* ids, int64_t count, int64_t limit, const char* what,
              const char* where);

}  // namespace tandem::backends
