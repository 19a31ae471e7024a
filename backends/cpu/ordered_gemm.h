// A matrix product whose every element is one chain of fused multiply-adds over k in
// ascending order. OpenBLAS's sgemm sums an element differently by where it sits in the
// product and by the product's size (its edge kernels, and the small-matrix kernels of its
// AVX-512 builds), so a sample's result would depend on the samples beside it. Here it does
// not: an element's bits depend only on its own row of a, its own column of b and its start
// value — not on m or n, the element's place, the blocking or the pool's threads — and a
// chain cut into k blocks (stored in c between them) continues exactly. That lets the
// convolutions multiply many samples at once and still give each sample the bits it gets
// alone.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "backends/cpu/thread_pool.h"

namespace tandem::cpu {

// A row-major operand: element (i, j) at p[i * ld + j], or at p[j * ld + i] when `trans`.
struct MatrixView {
  const float* p = nullptr;
  int64_t ld = 0;
  bool trans = false;

  float at(int64_t i, int64_t j) const { return trans ? p[j * ld + i] : p[i * ld + j]; }
};

// The tile kernels: each computes the same chains (fused multiply-adds are exact to one
// rounding on every ISA), so which one runs changes speed only.
enum class TileIsa { kPortable, kAvx2, kAvx512 };

// The kernels this CPU runs, slowest first: portable always (std::fma; a library call where
// the CPU has no FMA), then AVX2 + FMA and AVX-512 where it has them.
std::vector<TileIsa> tileIsas();
const char* tileIsaName(TileIsa isa);

// c [m, n] (row-major, row stride ldc) = (accumulate ? c : +0) + a [m, k] b [k, n]:
// element (i, j) is acc = start; acc = fma(a(i, kk), b(kk, j), acc) for kk = 0 .. k-1.
// The pool splits the elements, never an element's chain. `isa` (tests) picks a kernel of
// tileIsas(); by default the last.
void orderedGemm(ThreadPool& pool, int64_t m, int64_t n, int64_t k, MatrixView a, MatrixView b,
                 bool accumulate, float* c, int64_t ldc, std::optional<TileIsa> isa = {});

// Whether orderedGemm runs vectorised here: x86 with AVX2 and FMA, or a non-x86 build
// (whose fused multiply-add is an instruction). Elsewhere it is exact but slow.
bool orderedGemmFast();

// Whether its vectors here are wider than those of the kernels OpenBLAS loaded (AVX-512
// against OpenBLAS's AVX2 ones, as under OPENBLAS_CORETYPE=Haswell on an AVX-512 CPU): then
// it outruns sgemm on wide products too.
bool orderedGemmWiderThanBlas();

}  // namespace tandem::cpu
