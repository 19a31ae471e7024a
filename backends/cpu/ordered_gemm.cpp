// orderedGemm: packed panels (GotoBLAS's layout: a tile's rows of a, its columns of b, a k
// block at a time) and one tile kernel: AVX-512 (12 x 32) or AVX2 + FMA (6 x 16) on x86,
// portable fused multiply-adds (6 x 16) elsewhere; every one of them computes each element
// as the same chain, so the kernel changes no bits either. Edge tiles run the same kernel on
// zero-padded panels, through a tile-sized copy of c, so every element takes the same path wherever
// it sits.
#include "backends/cpu/ordered_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "backends/cpu/blas_core.h"
#include "core/simd.h"

#if TANDEM_X86
#include <immintrin.h>
#endif

namespace tandem::cpu {

namespace {

constexpr int64_t kKc = 256;  // k per block of a tile's chains: a's panel stays in L1
constexpr int64_t kNc = 512;  // at most this many columns of b packed at once
constexpr int64_t kPackedB = int64_t{1} << 19;  // and at most this many floats of them (2 MiB)
constexpr int64_t kMaxTile = 12 * 32;
constexpr int64_t kPackAPanels = 4;  // a tile of a is packed when it meets this many panels

// a's element (i, kk) of a tile at ap[i * rs + kk * ks]: packed (rs 1, ks the tile's rows)
// or read where it lies (a's own strides).
struct TileA {
  const float* p;
  int64_t rs, ks;
};

// b's panel: element (kk, j) of a tile at p[kk * ks + j], packed (ks the tile's columns) or
// in place (ks b's row stride; a whole panel of an untransposed b).
struct TileB {
  const float* p;
  int64_t ks;
};

using TileKernel = void (*)(int64_t kc, TileA a, TileB b, float* c, int64_t ldc, bool load);

struct Tile {
  int64_t mr, nr;             // rows and columns of c a kernel call computes
  TileKernel packed, direct;  // a packed, or read in place
};

// Columns [j0, j0 + cols) and k [p0, p0 + kc) of b, as panels of nr columns: panel q holds
// b(p0 + kk, j0 + q*nr + c) at [q*nr*kc + kk*nr + c], 0 past `cols`. A tile's rows of a are
// the same packing of a's transpose (transposed()).
void packB(const MatrixView& b, int64_t j0, int64_t cols, int64_t p0, int64_t kc, int64_t nr,
           float* out) {
  for (int64_t q = 0; q < cols; q += nr) {
    const int64_t w = std::min(nr, cols - q);
    float* panel = out + q * kc;
    if (w < nr) std::fill(panel, panel + nr * kc, 0.0f);
    if (b.trans) {
      for (int64_t cc = 0; cc < w; ++cc) {
        const float* src = b.p + (j0 + q + cc) * b.ld + p0;
        for (int64_t kk = 0; kk < kc; ++kk) panel[kk * nr + cc] = src[kk];
      }
    } else {
      for (int64_t kk = 0; kk < kc; ++kk)
        std::memcpy(panel + kk * nr, b.p + (p0 + kk) * b.ld + j0 + q,
                    static_cast<size_t>(w) * sizeof(float));
    }
  }
}

MatrixView transposed(const MatrixView& m) { return MatrixView{m.p, m.ld, !m.trans}; }

constexpr int64_t kPortableRows = 6, kPortableColumns = 16;

template <bool kPacked>
void tilePortable(int64_t kc, TileA a, TileB b, float* c, int64_t ldc, bool load) {
  constexpr int64_t R = kPortableRows, C = kPortableColumns;
  const int64_t rs = kPacked ? 1 : a.rs, ks = kPacked ? R : a.ks;
  float acc[R][C];
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) acc[i][j] = load ? c[i * ldc + j] : 0.0f;
  for (int64_t kk = 0; kk < kc; ++kk)
    for (int64_t i = 0; i < R; ++i) {
      const float av = a.p[kk * ks + i * rs];
      const float* bk = b.p + kk * b.ks;
      for (int64_t j = 0; j < C; ++j) acc[i][j] = std::fma(av, bk[j], acc[i][j]);
    }
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) c[i * ldc + j] = acc[i][j];
}

#if TANDEM_X86
// 6 rows x 2 vectors of 8: 12 accumulators, two vectors of b and a broadcast of a, 15 of the
// 16 registers. Each lane is one element's chain, FMA by FMA, as tilePortable's.
template <bool kPacked>
__attribute__((target("avx2,fma"))) void tileAvx2(int64_t kc, TileA a, TileB b, float* c,
                                                  int64_t ldc, bool load) {
  constexpr int R = 6;
  const int64_t rs = kPacked ? 1 : a.rs, ks = kPacked ? R : a.ks;
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i) {
    acc[i][0] = load ? _mm256_loadu_ps(c + i * ldc) : _mm256_setzero_ps();
    acc[i][1] = load ? _mm256_loadu_ps(c + i * ldc + 8) : _mm256_setzero_ps();
  }
  const float* bp = b.p;
  for (int64_t kk = 0; kk < kc; ++kk, bp += b.ks) {
    const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
    const float* ak = a.p + kk * ks;
#pragma GCC unroll 6
    for (int i = 0; i < R; ++i) {
      const __m256 av = _mm256_broadcast_ss(ak + i * rs);
      acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i) {
    _mm256_storeu_ps(c + i * ldc, acc[i][0]);
    _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
  }
}

// 12 rows x 2 vectors of 16: 24 of the 32 registers accumulate.
template <bool kPacked>
__attribute__((target("avx512f"))) void tileAvx512(int64_t kc, TileA a, TileB b, float* c,
                                                   int64_t ldc, bool load) {
  constexpr int R = 12;
  const int64_t rs = kPacked ? 1 : a.rs, ks = kPacked ? R : a.ks;
  __m512 acc[R][2];
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i) {
    acc[i][0] = load ? _mm512_loadu_ps(c + i * ldc) : _mm512_setzero_ps();
    acc[i][1] = load ? _mm512_loadu_ps(c + i * ldc + 16) : _mm512_setzero_ps();
  }
  const float* bp = b.p;
  for (int64_t kk = 0; kk < kc; ++kk, bp += b.ks) {
    const __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
    const float* ak = a.p + kk * ks;
#pragma GCC unroll 12
    for (int i = 0; i < R; ++i) {
      const __m512 av = _mm512_set1_ps(ak[i * rs]);
      acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i) {
    _mm512_storeu_ps(c + i * ldc, acc[i][0]);
    _mm512_storeu_ps(c + i * ldc + 16, acc[i][1]);
  }
}
#endif

Tile tileOf(TileIsa isa) {
  switch (isa) {
#if TANDEM_X86
    case TileIsa::kAvx2:
      return Tile{6, 16, tileAvx2<true>, tileAvx2<false>};
    case TileIsa::kAvx512:
      return Tile{12, 32, tileAvx512<true>, tileAvx512<false>};
#endif
    default:
      return Tile{kPortableRows, kPortableColumns, tilePortable<true>, tilePortable<false>};
  }
}

// Scratch that stays with a pool thread, so steady products do not allocate.
float* scratch(std::vector<float>& v, int64_t floats) {
  if (static_cast<int64_t>(v.size()) < floats) v.resize(static_cast<size_t>(floats));
  return v.data();
}

struct Product {
  int64_t m, n, k;
  MatrixView a, b;
  bool accumulate;
  float* c;
  int64_t ldc;
  Tile tile;
};

// A tile of c at rows [i, i + r), columns [j, j + w) from a's tile and a packed panel of b:
// in place when whole, else through a tile-sized copy, so the kernel is the same for every
// element.
void runTile(const Product& p, int64_t kc, TileA a, bool packed, TileB bp, int64_t i, int64_t j,
             int64_t r, int64_t w, bool load) {
  float* c = p.c + i * p.ldc + j;
  const int64_t nr = p.tile.nr;
  const TileKernel run = packed ? p.tile.packed : p.tile.direct;
  if (r == p.tile.mr && w == nr) {
    run(kc, a, bp, c, p.ldc, load);
    return;
  }
  float edge[kMaxTile] = {};
  for (int64_t row = 0; row < r && load; ++row)
    std::copy(c + row * p.ldc, c + row * p.ldc + w, edge + row * nr);
  run(kc, a, bp, edge, nr, load);
  for (int64_t row = 0; row < r; ++row)
    std::copy(edge + row * nr, edge + row * nr + w, c + row * p.ldc);
}

// Whether panel q of a column block `cols` wide is packed: b transposed, or the block's last
// panel narrower than a tile. Other panels are read in place, row kk at b's row stride.
bool packsPanel(const Product& p, int64_t cols, int64_t q) {
  return p.b.trans || (q + 1) * p.tile.nr > cols;
}

void packPanels(const Product& p, int64_t j0, int64_t cols, float* bp, int64_t q0, int64_t q1) {
  const int64_t nr = p.tile.nr;
  for (int64_t q = q0; q < q1; ++q)
    if (packsPanel(p, cols, q))
      packB(p.b, j0 + q * nr, std::min(nr, cols - q * nr), 0, p.k, nr, bp + q * nr * p.k);
}

// Panel q of the column block at j0, from k = p0.
TileB panelAt(const Product& p, int64_t j0, int64_t cols, const float* bp, int64_t q, int64_t p0) {
  const int64_t nr = p.tile.nr;
  if (packsPanel(p, cols, q)) return TileB{bp + q * nr * p.k + p0 * nr, nr};
  return TileB{p.b.p + p0 * p.b.ld + j0 + q * nr, p.b.ld};
}

// Rows [i0, i1) by panels [q0, q1) of the column block at j0 (`cols` wide), whose packed
// panels of b (all of k) are at bp, packed here first when `pack`: k block by k block, each
// row tile's a packed once and run against the block's panels (in L1 and L2) before the next.
void runTask(const Product& p, int64_t j0, int64_t cols, float* bp, int64_t i0, int64_t i1,
             int64_t q0, int64_t q1, bool pack) {
  const int64_t mr = p.tile.mr, nr = p.tile.nr;
  if (pack) packPanels(p, j0, cols, bp, q0, q1);
  thread_local std::vector<float> a_buffer;
  float* ap = scratch(a_buffer, mr * kKc);
  for (int64_t p0 = 0; p0 < p.k; p0 += kKc) {
    const int64_t kc = std::min(kKc, p.k - p0);
    for (int64_t i = i0; i < i1; i += mr) {
      const int64_t r = std::min(mr, i1 - i);
      // Packing a tile of a pays when its rows meet many panels; for a few (a thin b: a
      // sample's 1x1 outputs) a whole tile is read where it lies.
      const bool packed = r < mr || q1 - q0 >= kPackAPanels;
      TileA at{ap, 1, mr};
      if (packed) {
        packB(transposed(p.a), i, r, p0, kc, mr, ap);
      } else {
        at = p.a.trans ? TileA{p.a.p + p0 * p.a.ld + i, 1, p.a.ld}
                       : TileA{p.a.p + i * p.a.ld + p0, p.a.ld, 1};
      }
      for (int64_t q = q0; q < q1; ++q)
        runTile(p, kc, at, packed, panelAt(p, j0, cols, bp, q, p0), i, j0 + q * nr, r,
                std::min(nr, cols - q * nr), p.accumulate || p0 > 0);
    }
  }
}

// The column block [j0, j0 + cols) of c over the pool. With panels enough for every thread,
// each thread takes a run of them and packs those it packs itself (no thread reads what
// another wrote); else b's panels are packed first, over the pool, and the threads split
// the rows.
void runColumns(ThreadPool& pool, const Product& p, int64_t j0, int64_t cols, float* bp) {
  const int64_t mr = p.tile.mr, nr = p.tile.nr;
  const int64_t threads = pool.threads(), panels = (cols + nr - 1) / nr;
  if (panels >= 2 * threads || threads == 1) {
    pool.parallelFor(
        panels, 1, [&](int64_t q0, int64_t q1) { runTask(p, j0, cols, bp, 0, p.m, q0, q1, true); });
    return;
  }
  pool.parallelFor(panels, 1, [&](int64_t q0, int64_t q1) { packPanels(p, j0, cols, bp, q0, q1); });
  const int64_t row_tiles = (p.m + mr - 1) / mr;
  pool.parallelFor(row_tiles, 1, [&](int64_t t0, int64_t t1) {
    runTask(p, j0, cols, bp, t0 * mr, std::min(p.m, t1 * mr), 0, panels, false);
  });
}

}  // namespace

std::vector<TileIsa> tileIsas() {
  std::vector<TileIsa> isas{TileIsa::kPortable};
#if TANDEM_X86
  __builtin_cpu_init();
  if (hasAvx2() && __builtin_cpu_supports("fma") != 0) isas.push_back(TileIsa::kAvx2);
  if (__builtin_cpu_supports("avx512f") != 0) isas.push_back(TileIsa::kAvx512);
#endif
  return isas;
}

const char* tileIsaName(TileIsa isa) {
  switch (isa) {
    case TileIsa::kAvx2:
      return "avx2";
    case TileIsa::kAvx512:
      return "avx512";
    case TileIsa::kPortable:
      break;
  }
  return "portable";
}

TileIsa bestTileIsa() {
  static const TileIsa best = tileIsas().back();
  return best;
}

bool orderedGemmFast() { return !TANDEM_X86 || bestTileIsa() != TileIsa::kPortable; }

bool orderedGemmWiderThanBlas() {
  static const bool wider =
      bestTileIsa() == TileIsa::kAvx512 && coreClass(blasCoreName()) != VectorClass::kAvx512;
  return wider;
}

void orderedGemm(ThreadPool& pool, int64_t m, int64_t n, int64_t k, MatrixView a, MatrixView b,
                 bool accumulate, float* c, int64_t ldc, std::optional<TileIsa> isa) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  const Product p{m, n, k, a, b, accumulate, c, ldc, tileOf(isa.value_or(bestTileIsa()))};
  const int64_t nr = p.tile.nr;
  // Columns of b a block at a time, each panel packed once for all k.
  const int64_t nc = std::clamp<int64_t>(kPackedB / k / nr * nr, nr, kNc);
  thread_local std::vector<float> b_buffer;
  float* bp = scratch(b_buffer, (std::min(nc, n) + nr - 1) / nr * nr * k);
  for (int64_t j0 = 0; j0 < n; j0 += nc) {
    const int64_t cols = std::min(nc, n - j0);
    runColumns(pool, p, j0, cols, bp);
  }
}

}  // namespace tandem::cpu
