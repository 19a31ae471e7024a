// The row kernels of row_products.h, and the CPU backend's gemmQ8 built on them: for few
// rows each weight row is loaded once (int8 widened to floats in registers) and multiplied
// into up to four input rows, with AVX2 and FMA where the CPU has them, else portable
// loops; for many rows (a prompt's prefill) int8 panels are dequantized to f32 and
// multiplied by OpenBLAS, the conversion paid once per panel.
#include "backends/cpu/row_products.h"

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/op_checks.h"
#include "core/simd.h"

#if TANDEM_X86
#include <immintrin.h>
#endif

namespace tandem::cpu {

namespace {

// Weight rows per dequantized panel (int8, many rows).
constexpr int64_t kPanel = 32;

// y = alpha * (x w^T) + beta * y, w of W (float, or int8 with `scales` per `group` inputs
// of a row; for float, one group of all k and no scales).
template <typename W>
struct RowProblem {
  const float* x;
  const W* w;
  const float* scales;
  float* y;
  int64_t m, n, k, group;
  float alpha = 1, beta = 0;
};

template <typename W>
float scaleOf(const RowProblem<W>& p, int64_t j, int64_t gi) {
  return p.scales ? p.scales[j * (p.k / p.group) + gi] : 1.0f;
}

template <typename W>
void store(const RowProblem<W>& p, int64_t row, int64_t j, float dot) {
  float& out = p.y[row * p.n + j];
  out = p.beta == 0.0f ? p.alpha * dot : p.alpha * dot + p.beta * out;
}

// Outputs j of rows [r0, r0 + R), the portable way: per group, 8 running float sums
// (index mod 8), then the scaled group sums in order.
template <int R, typename W>
void dotRowsPortable(const RowProblem<W>& p, int64_t r0, int64_t j) {
  const W* w = p.w + j * p.k;
  float total[R] = {};
  for (int64_t g0 = 0, gi = 0; g0 < p.k; g0 += p.group, ++gi) {
    const float scale = scaleOf(p, j, gi);
    for (int r = 0; r < R; ++r) {
      const float* x = p.x + (r0 + r) * p.k;
      float lanes[8] = {};
      int64_t i = g0;
      for (; i + 8 <= g0 + p.group; i += 8)
        for (int l = 0; l < 8; ++l) lanes[l] += x[i + l] * static_cast<float>(w[i + l]);
      float sum = 0;
      for (float v : lanes) sum += v;
      for (; i < g0 + p.group; ++i) sum += x[i] * static_cast<float>(w[i]);
      total[r] += sum * scale;
    }
  }
  for (int r = 0; r < R; ++r) store(p, r0 + r, j, total[r]);
}

#if TANDEM_X86
bool hasFma() {
  static const bool has = hasAvx2() && __builtin_cpu_supports("fma") != 0;
  return has;
}

__attribute__((target("avx2,fma"))) inline __m256 load8(const int8_t* w) {
  const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
}

__attribute__((target("avx2,fma"))) inline __m256 load8(const float* w) {
  return _mm256_loadu_ps(w);
}

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The same with AVX2: 16 weights a step (two independent sums per row, so one row keeps
// two FMA chains in flight), loaded once and multiplied into every row.
template <int R, typename W>
__attribute__((target("avx2,fma"))) void dotRowsAvx2(const RowProblem<W>& p, int64_t r0,
                                                     int64_t j) {
  const W* w = p.w + j * p.k;
  const float* x[R];
  for (int r = 0; r < R; ++r) x[r] = p.x + (r0 + r) * p.k;
  __m256 total[R];
  float tail_total[R];
  for (int r = 0; r < R; ++r) {
    total[r] = _mm256_setzero_ps();
    tail_total[r] = 0;
  }
  for (int64_t g0 = 0, gi = 0; g0 < p.k; g0 += p.group, ++gi) {
    const int64_t end = g0 + p.group;
    __m256 a[R], b[R];
    for (int r = 0; r < R; ++r) a[r] = b[r] = _mm256_setzero_ps();
    int64_t i = g0;
    for (; i + 16 <= end; i += 16) {
      const __m256 w0 = load8(w + i), w1 = load8(w + i + 8);
      for (int r = 0; r < R; ++r) {
        a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x[r] + i), w0, a[r]);
        b[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x[r] + i + 8), w1, b[r]);
      }
    }
    if (i + 8 <= end) {
      const __m256 w0 = load8(w + i);
      for (int r = 0; r < R; ++r) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x[r] + i), w0, a[r]);
      i += 8;
    }
    const float s = scaleOf(p, j, gi);
    const __m256 scale = _mm256_set1_ps(s);
    for (int r = 0; r < R; ++r) {
      total[r] = _mm256_fmadd_ps(_mm256_add_ps(a[r], b[r]), scale, total[r]);
      float tail = 0;
      for (int64_t t = i; t < end; ++t) tail += x[r][t] * static_cast<float>(w[t]);
      tail_total[r] += tail * s;
    }
  }
  for (int r = 0; r < R; ++r) store(p, r0 + r, j, hsum(total[r]) + tail_total[r]);
}
#endif

template <int R, typename W>
void dotRows(const RowProblem<W>& p, int64_t r0, int64_t j) {
#if TANDEM_X86
  if (hasFma()) return dotRowsAvx2<R>(p, r0, j);
#endif
  dotRowsPortable<R>(p, r0, j);
}

// Outputs [j0, j1) of every row, four rows at a time (each weight row read once per four;
// a row's sum is the same in every block size).
template <typename W>
void fewRowColumns(const RowProblem<W>& p, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    int64_t r = 0;
    for (; r + 4 <= p.m; r += 4) dotRows<4>(p, r, j);
    for (; r + 2 <= p.m; r += 2) dotRows<2>(p, r, j);
    if (r < p.m) dotRows<1>(p, r, j);
  }
}

// Outputs shared out over the pool, each computed whole by one thread.
template <typename W>
void fewRows(ThreadPool& pool, const RowProblem<W>& p) {
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, p.m * p.k));
  pool.parallelFor(p.n, grain, [&](int64_t j0, int64_t j1) { fewRowColumns(p, j0, j1); });
}

// Panels [p0, p1) of kPanel int8 weight rows (the last may be short), each dequantized and
// multiplied into its outputs of every row. A panel is the same whatever the thread count,
// so are its products.
void panelColumns(const RowProblem<int8_t>& p, int64_t p0, int64_t p1) {
  std::vector<float> panel(static_cast<size_t>(kPanel * p.k));
  const int64_t groups = p.k / p.group;
  for (int64_t start = p0 * kPanel; start < std::min(p1 * kPanel, p.n); start += kPanel) {
    const int64_t rows = std::min(kPanel, p.n - start);
    for (int64_t j = 0; j < rows; ++j) {
      const int8_t* w = p.w + (start + j) * p.k;
      const float* s = p.scales + (start + j) * groups;
      float* out = panel.data() + j * p.k;
      for (int64_t i = 0; i < p.k; ++i) out[i] = static_cast<float>(w[i]) * s[i / p.group];
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(p.m),
                static_cast<blasint>(rows), static_cast<blasint>(p.k), 1.0f, p.x,
                static_cast<blasint>(p.k), panel.data(), static_cast<blasint>(p.k), 0.0f,
                p.y + start, static_cast<blasint>(p.n));
  }
}

#if TANDEM_X86
// Few rows times a matrix as it lies (x [m, k] times w [k, n], as attention's weights
// times a cache's values): each output one chain of fused multiply-adds over t = 0..k-1,
// whatever the block it is computed in. Columns [j0, j1) of rows [r0, r0 + R), J vectors
// of 8 columns each: every w row's vectors loaded once per block and multiplied into the
// R rows' broadcast entries.
template <int R, int J>
__attribute__((target("avx2,fma"))) void axpyBlock(const float* x, const float* w, float* y,
                                                   int64_t k, int64_t n, int64_t r0, int64_t j,
                                                   float alpha, float beta) {
  __m256 acc[R][J];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < J; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t t = 0; t < k; ++t) {
    __m256 wv[J];
    for (int v = 0; v < J; ++v) wv[v] = _mm256_loadu_ps(w + t * n + j + 8 * v);
    for (int r = 0; r < R; ++r) {
      const __m256 xb = _mm256_set1_ps(x[(r0 + r) * k + t]);
      for (int v = 0; v < J; ++v) acc[r][v] = _mm256_fmadd_ps(xb, wv[v], acc[r][v]);
    }
  }
  // alpha * sum, or alpha * sum + beta * y fused, as axpyOne does it.
  const __m256 a = _mm256_set1_ps(alpha), b = _mm256_set1_ps(beta);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < J; ++v) {
      float* out = y + (r0 + r) * n + j + 8 * v;
      _mm256_storeu_ps(out, beta == 0.0f ? _mm256_mul_ps(a, acc[r][v])
                                         : _mm256_fmadd_ps(a, acc[r][v],
                                                           _mm256_mul_ps(b, _mm256_loadu_ps(out))));
    }
}

// One output as axpyBlock computes each lane: the same fused chain, one column.
__attribute__((target("avx2,fma"))) void axpyOne(const float* x, const float* w, float* y,
                                                 int64_t k, int64_t n, int64_t r, int64_t j,
                                                 float alpha, float beta) {
  float acc = 0;
  for (int64_t t = 0; t < k; ++t) acc = __builtin_fmaf(x[r * k + t], w[t * n + j], acc);
  float& out = y[r * n + j];
  out = beta == 0.0f ? alpha * acc : __builtin_fmaf(alpha, acc, beta * out);
}

// Columns [c0, c1) of every row: 16 columns (two vectors) by four rows at a time, then
// the rows left, then 8 columns, then single columns.
void axpyColumns(const float* x, const float* w, float* y, int64_t m, int64_t k, int64_t n,
                 int64_t c0, int64_t c1, float alpha, float beta) {
  int64_t j = c0;
  auto rows = [&](auto block4, auto block1) {
    int64_t r = 0;
    for (; r + 4 <= m; r += 4) block4(r);
    for (; r < m; ++r) block1(r);
  };
  for (; j + 16 <= c1; j += 16)
    rows([&](int64_t r) { axpyBlock<4, 2>(x, w, y, k, n, r, j, alpha, beta); },
         [&](int64_t r) { axpyBlock<1, 2>(x, w, y, k, n, r, j, alpha, beta); });
  for (; j + 8 <= c1; j += 8)
    rows([&](int64_t r) { axpyBlock<4, 1>(x, w, y, k, n, r, j, alpha, beta); },
         [&](int64_t r) { axpyBlock<1, 1>(x, w, y, k, n, r, j, alpha, beta); });
  for (; j < c1; ++j)
    for (int64_t r = 0; r < m; ++r) axpyOne(x, w, y, k, n, r, j, alpha, beta);
}
#endif

}  // namespace

bool fewRowsNnF32(ThreadPool& pool, const float* x, const float* w, float alpha, float beta,
                  float* y, int64_t m, int64_t n, int64_t k) {
#if TANDEM_X86
  if (!hasFma()) return false;
  // Blocks of 16 columns shared out (a block's sums are the same on any thread), at
  // least ~64 K multiply-adds a share.
  const int64_t blocks = (n + 15) / 16;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, m * k * 16));
  pool.parallelFor(blocks, grain, [&](int64_t b0, int64_t b1) {
    axpyColumns(x, w, y, m, k, n, b0 * 16, std::min(n, b1 * 16), alpha, beta);
  });
  return true;
#else
  (void)pool, (void)x, (void)w, (void)alpha, (void)beta, (void)y, (void)m, (void)n, (void)k;
  return false;
#endif
}

void fewRowsF32(ThreadPool& pool, const float* x, const float* w, float alpha, float beta, float* y,
                int64_t m, int64_t n, int64_t k) {
  fewRows(pool, RowProblem<float>{x, w, nullptr, y, m, n, k, k, alpha, beta});
}

void CpuBackend::gemmQ8(const Tensor& x, const Tensor& w, const Tensor& scales, const Tensor& y) {
  const backends::GemmQ8Dims d = backends::checkGemmQ8(x, w, scales, y, "cpu");
  if (d.m == 0 || d.n == 0) return;
  const RowProblem<int8_t> p{
      f32(x), static_cast<const int8_t*>(data(w)), f32(scales), f32(y), d.m, d.n, d.k, d.group};
  if (d.m < kFewRows) return fewRows(pool_, p);
  pool_.parallelFor((d.n + kPanel - 1) / kPanel, 1,
                    [&](int64_t p0, int64_t p1) { panelColumns(p, p0, p1); });
}

}  // namespace tandem::cpu
