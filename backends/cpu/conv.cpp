// Convolution kernels of the CPU backend. Each sample is convolved as the product of the
// weights [OC, K] (K = C*kh*kw) with its column matrix [K, OH*OW], built a tile of output
// rows at a time (at most kTileFloats floats, so it stays in cache between im2col and the
// product) and never for the whole batch. With at least as many samples as threads each
// thread takes whole samples: its own tile, one sgemm per tile, no transposes. With fewer, the
// samples go one at a time and each tile's im2col, product and col2im are split over the threads.
// The weight gradient is split into blocks of dw, each thread summing its block over the samples in
// their order. Every element is thus summed in one order whatever the thread count: a product is
// split only along M or N, in multiples of 16, never along its K, and sgemm then sums each
// element's K in the same order (gemm's blocks of C rely on the same).
//
// Small outputs (fewer than kGroupedPixels pixels a sample: a ResNet's last stages) make
// that product a thin one — at 1x1 a matrix-vector product that reads all the weights for
// one column — bound by memory. There (and wherever a sample fits a group, when
// orderedGemm's vectors are wider than those of OpenBLAS's kernels) the samples go a group
// at a time through one orderedGemm (ordered_gemm.h) over all their columns, whose elements
// are each one chain of fused multiply-adds in k's order: a sample's outputs and dx are what
// it gets alone, and dw is each element's chain over the samples in order, whatever the
// group and the threads.
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "backends/cpu/columns.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ordered_gemm.h"
#include "backends/cpu/row_sums.h"
#include "backends/op_checks.h"

namespace tandem::cpu {

namespace {

constexpr int64_t kTileFloats = int64_t{1} << 16;  // a column tile: 256 KiB of f32
constexpr int64_t kGroupedPixels = 16;  // outputs per sample below which samples are grouped
// A sample's column matrix (or outputs) of at most this many floats may be grouped, so that
// convColumnChunk (what the memory model counts, the composed path's chunk) holds two
// samples or more: a group, at most that chunk, then never needs more than it counts.
constexpr int64_t kGroupedSample = int64_t{1} << 19;
// A group's column matrix (or outputs) of at most this many floats (1 MiB), so that it is
// still in cache when the product reads it; at least one sample.
constexpr int64_t kGroupFloats = int64_t{1} << 18;
// Threads take whole groups when each one's columns would still fill this many.
constexpr int64_t kThreadColumns = 128;
// Fewer taps or output channels than these make thin products (a network's first layer, a
// depthwise group): those stay on OpenBLAS.
constexpr int64_t kGroupedMinTaps = 32, kGroupedMinChannels = 16;

struct ConvPlan {
  int64_t n = 0, c = 0, oc = 0, k = 0;
  int64_t oh = 0, ow = 0, ohw = 0;
  int64_t in_sample = 0;   // C*H*W
  int64_t tile_rows = 1;   // output rows per column tile
  bool pointwise = false;  // 1x1, stride 1, no padding: the sample itself is its column matrix
  bool grouped = false;    // samples a group at a time through orderedGemm
  int64_t group = 1;       // samples per group

  int64_t tileFloats() const { return k * tile_rows * ow; }
  int64_t groups() const { return (n + group - 1) / group; }
};

// Samples per group: what fits kGroupFloats (at most convColumnChunk's), evened out so that
// the threads, when they take whole groups, take as many each. Any grouping gives the same
// bits; this one only sets the speed.
int64_t groupSize(const ConvPlan& p, const Window2d& g, int64_t threads) {
  if (p.n <= 1) return 1;
  const int64_t fit =
      std::clamp<int64_t>(kGroupFloats / std::max<int64_t>(std::max(p.k, p.oc) * p.ohw, 1), 1,
                          convColumnChunk(g, p.oc, p.n));
  int64_t groups = (p.n + fit - 1) / fit;
  if (groups < threads && (p.n + threads - 1) / threads * p.ohw >= kThreadColumns) groups = threads;
  if (groups >= threads) groups = (groups + threads - 1) / threads * threads;
  return (p.n + groups - 1) / groups;
}

ConvPlan planConv(const backends::ConvDims& d, const Window2d& g, int64_t threads) {
  ConvPlan p;
  p.n = d.n, p.c = g.channels, p.oc = d.oc, p.k = d.k;
  p.oh = g.outHeight(), p.ow = g.outWidth(), p.ohw = p.oh * p.ow;
  p.in_sample = g.channels * g.height * g.width;
  p.pointwise = g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 && g.stride_w == 1 &&
                g.pad_h == 0 && g.pad_w == 0;
  // Grouped where a sample's column matrix fits a group, if the outputs are small or the
  // ordered product outruns OpenBLAS's here anyway. The choice depends on the shape and the
  // machine only, never on the batch.
  p.grouped = orderedGemmFast() && std::max(p.k, p.oc) * p.ohw <= kGroupedSample &&
              p.k >= kGroupedMinTaps && p.oc >= kGroupedMinChannels &&
              (p.ohw < kGroupedPixels || orderedGemmWiderThanBlas());
  if (p.grouped) p.group = groupSize(p, g, threads);
  p.tile_rows = p.pointwise
                    ? p.oh
                    : std::clamp<int64_t>(kTileFloats / std::max<int64_t>(p.k * p.ow, 1), 1, p.oh);
  return p;
}

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// Runs fn(begin, end) over [0, n): on the pool when `split`, else at once on this thread.
void maybeSplit(ThreadPool& pool, bool split, int64_t n, int64_t grain,
                const std::function<void(int64_t, int64_t)>& fn) {
  if (split) {
    pool.parallelFor(n, grain, fn);
  } else {
    fn(0, n);
  }
}

// C [m, n] (+)= op(A) B with B's columns split into blocks of 16 over the pool when `split`.
void product(ThreadPool& pool, bool split, bool trans_a, int64_t m, int64_t n, int64_t k,
             const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
             int64_t ldc) {
  const int64_t blocks = (n + 15) / 16;
  maybeSplit(pool, split, blocks, 1, [&](int64_t b0, int64_t b1) {
    const int64_t j0 = b0 * 16, j1 = std::min(n, b1 * 16);
    sgemm(trans_a, false, m, j1 - j0, k, a, lda, b + j0, ldb, beta, c + j0, ldc);
  });
}

// y [OC, OH*OW] of one sample x [C, H, W]; `col` holds a tile. y starts as the bias (or 0)
// and the products add to it: one pass over y fewer than sgemm's zeroing and a bias pass,
// and the same sum (the product's, plus the bias).
void forwardSample(ThreadPool& pool, bool split, const ConvPlan& p, const Window2d& g,
                   const float* x, const float* w, const float* bias, float* y, float* col) {
  maybeSplit(pool, split, p.oc, 8, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      std::fill(y + o * p.ohw, y + (o + 1) * p.ohw, bias == nullptr ? 0.0f : bias[o]);
  });
  if (p.pointwise) {
    product(pool, split, false, p.oc, p.ohw, p.k, w, p.k, x, p.ohw, 1.0f, y, p.ohw);
    return;
  }
  const int64_t taps = g.kernel_h * g.kernel_w;
  for (int64_t oy0 = 0; oy0 < p.oh; oy0 += p.tile_rows) {
    const int64_t oy1 = std::min(p.oh, oy0 + p.tile_rows), cols = (oy1 - oy0) * p.ow;
    maybeSplit(pool, split, p.c, 1, [&](int64_t c0, int64_t c1) {
      im2colRows(x, g, c0 * taps, c1 * taps, oy0, oy1, col + c0 * taps * cols, cols);
    });
    product(pool, split, false, p.oc, cols, p.k, w, p.k, col, cols, 1.0f, y + oy0 * p.ow, p.ohw);
  }
}

// dx [C, H, W] of one sample from its dy [OC, OH*OW]; `col` holds a tile.
void backwardDataSample(ThreadPool& pool, bool split, const ConvPlan& p, const Window2d& g,
                        const float* dy, const float* w, float* dx, float* col) {
  if (p.pointwise) {
    product(pool, split, true, p.k, p.ohw, p.oc, w, p.k, dy, p.ohw, 0.0f, dx, p.ohw);
    return;
  }
  const int64_t plane = g.height * g.width, taps = g.kernel_h * g.kernel_w;
  maybeSplit(pool, split, p.c, 1,
             [&](int64_t c0, int64_t c1) { std::fill(dx + c0 * plane, dx + c1 * plane, 0.0f); });
  for (int64_t oy0 = 0; oy0 < p.oh; oy0 += p.tile_rows) {
    const int64_t oy1 = std::min(p.oh, oy0 + p.tile_rows), cols = (oy1 - oy0) * p.ow;
    product(pool, split, true, p.k, cols, p.oc, w, p.k, dy + oy0 * p.ow, p.ohw, 0.0f, col, cols);
    maybeSplit(pool, split, p.c, 1, [&](int64_t c0, int64_t c1) {
      col2imRows(col + c0 * taps * cols, cols, g, c0, c1, oy0, oy1, dx);
    });
  }
}

// The grouped path (small outputs). A group of `count` samples from `s0` is `cols` = count *
// OH*OW columns: sample s's pixels at columns [(s - s0) * OH*OW, ...).
struct Group {
  int64_t s0 = 0, count = 0, cols = 0;
};

// A buffer for a group's [OC, cols], where groups hold more than one sample.
Tensor rowBuffer(CpuBackend& be, const ConvPlan& p) {
  return p.group > 1 ? be.empty({p.oc * p.group * p.ohw}) : Tensor();
}

Group groupAt(const ConvPlan& p, int64_t index) {
  const int64_t s0 = index * p.group, count = std::min(p.group, p.n - s0);
  return Group{s0, count, count * p.ohw};
}

// Runs fn(group, col, rows) for every group, col and rows a group's column matrix and
// [OC, cols] buffers (rows null where groups are single samples). With at least as many
// groups as threads each thread takes whole groups, its buffers and products its own (the
// ops inside run on it alone); else the groups go one by one and their ops use the pool.
template <typename Fn>
void forEachGroup(CpuBackend& be, const ConvPlan& p, Fn&& fn) {
  const int64_t groups = p.groups();
  auto run = [&](int64_t g0, int64_t g1) {
    Tensor col = be.empty({p.k * p.group * p.ohw}), rows = rowBuffer(be, p);
    for (int64_t i = g0; i < g1; ++i)
      fn(groupAt(p, i), be.f32(col), rows.defined() ? be.f32(rows) : nullptr);
  };
  if (groups >= be.pool().threads()) {
    be.pool().parallelFor(groups, 1, run);
  } else {
    run(0, groups);
  }
}

// Rows [r0, r1) of the group's column matrix [K, cols], one sample per task.
void groupColumns(ThreadPool& pool, const ConvPlan& p, const Window2d& g, const Group& gr,
                  const float* x, int64_t r0, int64_t r1, float* col) {
  pool.parallelFor(gr.count, 1, [&](int64_t a, int64_t b) {
    for (int64_t s = a; s < b; ++s)
      im2colRows(x + (gr.s0 + s) * p.in_sample, g, r0, r1, 0, p.oh, col + s * p.ohw, gr.cols);
  });
}

// Calls fn(b, q) for each sample's row of output channels [o0, o1), channels split over
// the pool: at b in the batch's [n, OC, OH*OW], at q in the group's [o1 - o0, cols].
template <typename Fn>
void forEachRow(ThreadPool& pool, const ConvPlan& p, const Group& gr, int64_t o0, int64_t o1,
                Fn&& fn) {
  pool.parallelFor(o1 - o0, 4, [&](int64_t a, int64_t b) {
    for (int64_t o = o0 + a; o < o0 + b; ++o)
      for (int64_t s = 0; s < gr.count; ++s)
        fn(((gr.s0 + s) * p.oc + o) * p.ohw, (o - o0) * gr.cols + s * p.ohw);
  });
}

// The group's dy rows of channels [o0, o1) as [o1 - o0, cols]: gathered into `grouped`, or
// in place for a single sample.
const float* groupRows(ThreadPool& pool, const ConvPlan& p, const Group& gr, const float* dy,
                       int64_t o0, int64_t o1, float* grouped) {
  if (gr.count == 1) return dy + (gr.s0 * p.oc + o0) * p.ohw;
  forEachRow(pool, p, gr, o0, o1,
             [&](int64_t b, int64_t q) { std::copy(dy + b, dy + b + p.ohw, grouped + q); });
  return grouped;
}

void forwardGrouped(CpuBackend& be, const ConvPlan& p, const Window2d& g, const float* x,
                    const float* w, const float* bias, float* y) {
  ThreadPool& pool = be.pool();
  forEachGroup(be, p, [&](const Group& gr, float* col, float* rows) {
    // A group of one sample is its own [OC, OH*OW]: no copies.
    float* out = gr.count > 1 ? rows : y + gr.s0 * p.oc * p.ohw;
    groupColumns(pool, p, g, gr, x, 0, p.k, col);
    pool.parallelFor(p.oc, 4, [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o)
        std::fill(out + o * gr.cols, out + (o + 1) * gr.cols, bias == nullptr ? 0.0f : bias[o]);
    });
    orderedGemm(pool, p.oc, gr.cols, p.k, MatrixView{w, p.k, false},
                MatrixView{col, gr.cols, false}, true, out, gr.cols);
    if (gr.count > 1)
      forEachRow(pool, p, gr, 0, p.oc,
                 [&](int64_t b, int64_t q) { std::copy(out + q, out + q + p.ohw, y + b); });
  });
}

void backwardDataGrouped(CpuBackend& be, const ConvPlan& p, const Window2d& g, const float* dy,
                         const float* w, float* dx) {
  ThreadPool& pool = be.pool();
  forEachGroup(be, p, [&](const Group& gr, float* col, float* rows) {
    const float* dyg = groupRows(pool, p, gr, dy, 0, p.oc, rows);
    orderedGemm(pool, p.k, gr.cols, p.oc, MatrixView{w, p.k, true}, MatrixView{dyg, gr.cols, false},
                false, col, gr.cols);
    pool.parallelFor(gr.count, 1, [&](int64_t a, int64_t b) {
      for (int64_t s = a; s < b; ++s) {
        float* dxs = dx + (gr.s0 + s) * p.in_sample;
        std::fill(dxs, dxs + p.in_sample, 0.0f);
        col2imRows(col + s * p.ohw, gr.cols, g, 0, p.c, 0, p.oh, dxs);
      }
    });
  });
}

// dw's elements each continue one chain over the samples in order, group after group. The
// pool splits dw into blocks along its longer side (as the per-sample path does); each
// thread runs every group through its block: the column matrix's rows of its block (or all,
// and the dy rows of its output channels).
void backwardWeightGrouped(CpuBackend& be, const ConvPlan& p, const Window2d& g, const float* x,
                           const float* dy, float* dw, float* db) {
  ThreadPool& pool = be.pool();
  const bool by_rows = p.k >= p.oc;
  const int64_t side = by_rows ? p.k : p.oc;
  const int64_t parts = std::clamp<int64_t>(side / 32, 1, pool.threads());
  const int64_t step = (side + parts - 1) / parts;
  pool.parallelFor(parts, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = b * step, hi = std::min(side, lo + step);
      const int64_t r0 = by_rows ? lo : 0, r1 = by_rows ? hi : p.k;
      const int64_t o0 = by_rows ? 0 : lo, o1 = by_rows ? p.oc : hi;
      Tensor col = be.empty({(r1 - r0) * p.group * p.ohw});
      Tensor rows = p.group > 1 ? be.empty({(o1 - o0) * p.group * p.ohw}) : Tensor();
      float* cp = be.f32(col);
      for (int64_t i = 0; i < p.groups(); ++i) {
        const Group gr = groupAt(p, i);
        groupColumns(pool, p, g, gr, x, r0, r1, cp);
        const float* dyg =
            groupRows(pool, p, gr, dy, o0, o1, rows.defined() ? be.f32(rows) : nullptr);
        orderedGemm(pool, o1 - o0, r1 - r0, gr.cols, MatrixView{dyg, gr.cols, false},
                    MatrixView{cp, gr.cols, true}, true, dw + o0 * p.k + r0, p.k);
      }
    }
  });
  if (db == nullptr) return;
  be.pool().parallelFor(p.oc, 8, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      double sum = 0;
      for (int64_t s = 0; s < p.n; ++s) sum += sum8(dy + (s * p.oc + o) * p.ohw, p.ohw);
      db[o] += static_cast<float>(sum);
    }
  });
}

}  // namespace

void CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& g,
                        const Tensor& y) {
  const ConvPlan p =
      planConv(backends::checkConv(x, w, bias, y, g, "cpu", "conv2d"), g, pool_.threads());
  const float* xp = f32(x);
  const float* wp = f32(w);
  const float* bp = bias.defined() ? f32(bias) : nullptr;
  float* yp = f32(y);
  if (p.grouped) {
    forwardGrouped(*this, p, g, xp, wp, bp, yp);
    return;
  }
  if (p.n >= pool_.threads()) {
    pool_.parallelFor(p.n, 1, [&](int64_t s0, int64_t s1) {
      Tensor col = empty({p.pointwise ? 1 : p.tileFloats()});
      for (int64_t s = s0; s < s1; ++s)
        forwardSample(pool_, false, p, g, xp + s * p.in_sample, wp, bp, yp + s * p.oc * p.ohw,
                      f32(col));
    });
    return;
  }
  Tensor col = empty({p.pointwise ? 1 : p.tileFloats()});
  for (int64_t s = 0; s < p.n; ++s)
    forwardSample(pool_, true, p, g, xp + s * p.in_sample, wp, bp, yp + s * p.oc * p.ohw, f32(col));
}

void CpuBackend::conv2dBackwardData(const Tensor& dy, const Tensor& w, const Window2d& g,
                                    const Tensor& dx) {
  const ConvPlan p = planConv(
      backends::checkConv(dx, w, Tensor(), dy, g, "cpu", "conv2dBackwardData"), g, pool_.threads());
  const float* gy = f32(dy);
  const float* wp = f32(w);
  float* gx = f32(dx);
  if (p.grouped) {
    backwardDataGrouped(*this, p, g, gy, wp, gx);
    return;
  }
  if (p.n >= pool_.threads()) {
    pool_.parallelFor(p.n, 1, [&](int64_t s0, int64_t s1) {
      Tensor col = empty({p.pointwise ? 1 : p.tileFloats()});
      for (int64_t s = s0; s < s1; ++s)
        backwardDataSample(pool_, false, p, g, gy + s * p.oc * p.ohw, wp, gx + s * p.in_sample,
                           f32(col));
    });
    return;
  }
  Tensor col = empty({p.pointwise ? 1 : p.tileFloats()});
  for (int64_t s = 0; s < p.n; ++s)
    backwardDataSample(pool_, true, p, g, gy + s * p.oc * p.ohw, wp, gx + s * p.in_sample,
                       f32(col));
}

void CpuBackend::conv2dBackwardWeight(const Tensor& x, const Tensor& dy, const Window2d& g,
                                      const Tensor& dw, const Tensor& db) {
  const ConvPlan p = planConv(backends::checkConv(x, dw, db, dy, g, "cpu", "conv2dBackwardWeight"),
                              g, pool_.threads());
  const float* xp = f32(x);
  const float* gy = f32(dy);
  float* gw = f32(dw);
  float* gb = db.defined() ? f32(db) : nullptr;
  if (p.grouped) {
    backwardWeightGrouped(*this, p, g, xp, gy, gw, gb);
    return;
  }
  // Each thread owns a block of dw, output channels [o0, o1) by column-matrix rows [r0, r1),
  // summed over the samples in order (a fixed number of products per element: K never
  // splits). Blocks go along dw's longer side in multiples of 16, as gemm's do.
  // The block holding column-matrix row 0 also sums its output channels' dy into db, each
  // sample's rows while they are in cache (in double across samples, 8 lanes within one).
  auto block = [&](int64_t o0, int64_t o1, int64_t r0, int64_t r1) {
    Tensor col = empty({p.pointwise ? 1 : (r1 - r0) * p.tile_rows * p.ow});
    float* cp = f32(col);
    std::vector<double> bias_sums(gb != nullptr && r0 == 0 ? static_cast<size_t>(o1 - o0) : 0);
    for (int64_t s = 0; s < p.n; ++s) {
      const float* xs = xp + s * p.in_sample;
      const float* dys = gy + s * p.oc * p.ohw + o0 * p.ohw;
      for (size_t o = 0; o < bias_sums.size(); ++o)
        bias_sums[o] += sum8(dys + static_cast<int64_t>(o) * p.ohw, p.ohw);
      if (p.pointwise) {
        sgemm(false, true, o1 - o0, r1 - r0, p.ohw, dys, p.ohw, xs + r0 * p.ohw, p.ohw, 1.0f,
              gw + o0 * p.k + r0, p.k);
        continue;
      }
      for (int64_t oy0 = 0; oy0 < p.oh; oy0 += p.tile_rows) {
        const int64_t oy1 = std::min(p.oh, oy0 + p.tile_rows), cols = (oy1 - oy0) * p.ow;
        im2colRows(xs, g, r0, r1, oy0, oy1, cp, cols);
        sgemm(false, true, o1 - o0, r1 - r0, cols, dys + oy0 * p.ow, p.ohw, cp, cols, 1.0f,
              gw + o0 * p.k + r0, p.k);
      }
    }
    for (size_t o = 0; o < bias_sums.size(); ++o)
      gb[o0 + static_cast<int64_t>(o)] += static_cast<float>(bias_sums[o]);
  };
  const bool by_rows = p.k >= p.oc;
  const int64_t side = by_rows ? p.k : p.oc;
  const int64_t parts = std::min<int64_t>(pool_.threads(), (side + 15) / 16);
  const int64_t step = (side + parts * 16 - 1) / (parts * 16) * 16;
  pool_.parallelFor((side + step - 1) / step, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = b * step, hi = std::min(side, lo + step);
      if (by_rows) {
        block(0, p.oc, lo, hi);
      } else {
        block(lo, hi, 0, p.k);
      }
    }
  });
}

}  // namespace tandem::cpu
