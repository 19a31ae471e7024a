// Spatial kernels of the CPU backend: the column matrix (im2col/col2im) of convolution, the [A,B,R]
// transpose that moves between sample-major and channel-major layouts, and pooling.
#include <algorithm>
#include <cstring>
#include <limits>

#include "backends/cpu/columns.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/op_checks.h"
#include "core/error.h"
#include "core/simd.h"

namespace tandem::cpu {

namespace {

// The output columns [lo, hi) whose input column ox*stride - pad + k lies inside [0, w).
void validRange(int64_t k, int64_t stride, int64_t pad, int64_t w, int64_t out, int64_t& lo,
                int64_t& hi) {
  lo = 0;
  while (lo < out && lo * stride - pad + k < 0) ++lo;
  hi = lo;
  while (hi < out && hi * stride - pad + k < w) ++hi;
}

// dst[i] += src[i * stride] for i < n: one tap's output row back into its input row.
TANDEM_CLONES void addStrided(const float* __restrict src, float* __restrict dst, int64_t n,
                              int64_t stride) {
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i * stride] += src[i];
  }
}

// One output row of a 2x2, stride 2, unpadded max pool over input rows r0 and r1 (r0 at
// flat index `base` of its plane, r1 `width` further): each window's first maximum in
// (row, column) order, as the general loop picks it, by selects that vectorise.
TANDEM_CLONES void maxPool2x2Row(const float* __restrict r0, const float* __restrict r1, int64_t ow,
                                 int32_t base, int32_t width, float* __restrict out,
                                 int32_t* __restrict arg) {
  for (int64_t ox = 0; ox < ow; ++ox) {
    const float a = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox], d = r1[2 * ox + 1];
    const int32_t at = base + 2 * static_cast<int32_t>(ox);
    float best = a;
    int32_t best_at = at;
    best_at = b > best ? at + 1 : best_at;
    best = b > best ? b : best;
    best_at = c > best ? at + width : best_at;
    best = c > best ? c : best;
    best_at = d > best ? at + width + 1 : best_at;
    best = d > best ? d : best;
    out[ox] = best;
    arg[ox] = best_at;
  }
}

}  // namespace

void im2colRows(const float* x, const Window2d& g, int64_t r0, int64_t r1, int64_t oy0, int64_t oy1,
                float* col, int64_t ld) {
  const int64_t ow = g.outWidth(), plane = g.height * g.width;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t c = r / (g.kernel_h * g.kernel_w);
    const int64_t ki = (r / g.kernel_w) % g.kernel_h, kj = r % g.kernel_w;
    const float* src = x + c * plane;
    float* dst = col + (r - r0) * ld;
    int64_t lo, hi;
    validRange(kj, g.stride_w, g.pad_w, g.width, ow, lo, hi);
    for (int64_t oy = oy0; oy < oy1; ++oy) {
      const int64_t iy = oy * g.stride_h - g.pad_h + ki;
      float* out = dst + (oy - oy0) * ow;
      if (iy < 0 || iy >= g.height) {
        std::fill(out, out + ow, 0.0f);
        continue;
      }
      const float* in = src + iy * g.width - g.pad_w + kj;
      std::fill(out, out + lo, 0.0f);
      if (g.stride_w == 1) {
        std::memcpy(out + lo, in + lo, static_cast<size_t>(hi - lo) * sizeof(float));
      } else {
        for (int64_t ox = lo; ox < hi; ++ox) out[ox] = in[ox * g.stride_w];
      }
      std::fill(out + hi, out + ow, 0.0f);
    }
  }
}

void col2imRows(const float* col, int64_t ld, const Window2d& g, int64_t c0, int64_t c1,
                int64_t oy0, int64_t oy1, float* dx) {
  const int64_t ow = g.outWidth(), plane = g.height * g.width;
  for (int64_t c = c0; c < c1; ++c) {
    float* dst = dx + c * plane;
    for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
      for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
        const float* src = col + (((c - c0) * g.kernel_h + ki) * g.kernel_w + kj) * ld;
        int64_t lo, hi;
        validRange(kj, g.stride_w, g.pad_w, g.width, ow, lo, hi);
        for (int64_t oy = oy0; oy < oy1; ++oy) {
          const int64_t iy = oy * g.stride_h - g.pad_h + ki;
          if (iy < 0 || iy >= g.height) continue;
          float* out = dst + iy * g.width - g.pad_w + kj + lo * g.stride_w;
          addStrided(src + (oy - oy0) * ow + lo, out, hi - lo, g.stride_w);
        }
      }
    }
  }
}

void CpuBackend::im2col(const Tensor& x, const Window2d& g, const Tensor& col) {
  backends::checkWindowInput(x, g, "cpu", "im2col");
  const int64_t n = x.shape()[0];
  const int64_t ohw = g.outHeight() * g.outWidth(), taps = g.kernel_h * g.kernel_w;
  backends::checkColumns(col, x, g, "cpu", "im2col");
  const float* xp = f32(x);
  float* cp = f32(col);
  const int64_t sample = g.channels * g.height * g.width;
  pool_.parallelFor(g.channels * n, std::max<int64_t>(1, 4096 / std::max<int64_t>(taps * ohw, 1)),
                    [&](int64_t b, int64_t e) {
                      for (int64_t idx = b; idx < e; ++idx) {
                        const int64_t c = idx / n, s = idx % n;
                        im2colRows(xp + s * sample, g, c * taps, (c + 1) * taps, 0, g.outHeight(),
                                   cp + c * taps * n * ohw + s * ohw, n * ohw);
                      }
                    });
}

void CpuBackend::col2im(const Tensor& col, const Window2d& g, const Tensor& dx) {
  backends::checkWindowInput(dx, g, "cpu", "col2im");
  const int64_t n = dx.shape()[0];
  const int64_t ohw = g.outHeight() * g.outWidth(), taps = g.kernel_h * g.kernel_w;
  backends::checkColumns(col, dx, g, "cpu", "col2im");
  const float* cp = f32(col);
  float* xp = f32(dx);
  const int64_t plane = g.height * g.width, sample = g.channels * plane;
  // Each (channel, sample) plane is written by one range only, in a fixed order.
  pool_.parallelFor(g.channels * n, 1, [&](int64_t b, int64_t e) {
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t c = idx / n, s = idx % n;
      float* plane_s = xp + s * sample + c * plane;
      std::fill(plane_s, plane_s + plane, 0.0f);
      col2imRows(cp + c * taps * n * ohw + s * ohw, n * ohw, g, c, c + 1, 0, g.outHeight(),
                 xp + s * sample);
    }
  });
}

void CpuBackend::transpose01(const Tensor& src, const Tensor& dst) {
  const backends::Transpose01 t = backends::checkTranspose01(src, dst, "cpu");
  const int64_t a = t.a, b = t.b, r = t.r;
  const float* sp = f32(src);
  float* dp = f32(dst);
  pool_.parallelFor(
      a * b, std::max<int64_t>(1, 4096 / std::max<int64_t>(r, 1)), [&](int64_t lo, int64_t hi) {
        for (int64_t idx = lo; idx < hi; ++idx) {
          const int64_t j = idx / a, i = idx % a;  // destination row (j, i) <- source (i, j)
          std::memcpy(dp + idx * r, sp + (i * b + j) * r, static_cast<size_t>(r) * sizeof(float));
        }
      });
}

void CpuBackend::maxPool(const Tensor& x, const Window2d& g, const Tensor& y,
                         const Tensor& argmax) {
  const int64_t n = backends::checkPool(x, y, g, "cpu", "maxPool");
  backends::checkArgmax(argmax, y, "cpu", "maxPool");
  const float* xp = f32(x);
  float* yp = f32(y);
  int32_t* ap = i32(argmax);
  const int64_t oh = g.outHeight(), ow = g.outWidth(), plane = g.height * g.width;
  const bool halving = g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 &&
                       g.pad_h == 0 && g.pad_w == 0 && 2 * oh <= g.height && 2 * ow <= g.width;
  pool_.parallelFor(n * g.channels, 8, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const float* in = xp + p * plane;
      float* out = yp + p * oh * ow;
      int32_t* arg = ap + p * oh * ow;
      if (halving) {
        for (int64_t oy = 0; oy < oh; ++oy)
          maxPool2x2Row(in + 2 * oy * g.width, in + (2 * oy + 1) * g.width, ow,
                        static_cast<int32_t>(2 * oy * g.width), static_cast<int32_t>(g.width),
                        out + oy * ow, arg + oy * ow);
        continue;
      }
      for (int64_t oy = 0; oy < oh; ++oy) {
        const int64_t y0 = std::max<int64_t>(0, oy * g.stride_h - g.pad_h);
        const int64_t y1 = std::min(g.height, oy * g.stride_h - g.pad_h + g.kernel_h);
        for (int64_t ox = 0; ox < ow; ++ox) {
          const int64_t x0 = std::max<int64_t>(0, ox * g.stride_w - g.pad_w);
          const int64_t x1 = std::min(g.width, ox * g.stride_w - g.pad_w + g.kernel_w);
          // Padding never covers a whole window (pad <= kernel / 2), so (y0, x0) exists.
          // Selects instead of branches: the winner of random data is unpredictable.
          float best = in[y0 * g.width + x0];
          int64_t best_at = y0 * g.width + x0;
          for (int64_t iy = y0; iy < y1; ++iy) {
            for (int64_t ix = x0; ix < x1; ++ix) {
              const float v = in[iy * g.width + ix];
              const bool better = v > best;  // the first maximum wins
              best_at = better ? iy * g.width + ix : best_at;
              best = better ? v : best;
            }
          }
          out[oy * ow + ox] = best;
          arg[oy * ow + ox] = static_cast<int32_t>(best_at);
        }
      }
    }
  });
}

void CpuBackend::maxPoolBackward(const Tensor& dy, const Tensor& argmax, const Window2d& g,
                                 const Tensor& dx) {
  const int64_t n = backends::checkPool(dx, dy, g, "cpu", "maxPoolBackward");
  backends::checkArgmax(argmax, dy, "cpu", "maxPoolBackward");
  const float* gy = f32(dy);
  const int32_t* ap = i32(argmax);
  float* gx = f32(dx);
  const int64_t ohw = g.outHeight() * g.outWidth(), plane = g.height * g.width;
  pool_.parallelFor(n * g.channels, 8, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      float* out = gx + p * plane;
      std::fill(out, out + plane, 0.0f);
      for (int64_t i = 0; i < ohw; ++i) {
        const int32_t at = ap[p * ohw + i];
        if (at >= 0 && at < plane) out[at] += gy[p * ohw + i];
      }
    }
  });
}

void CpuBackend::avgPool(const Tensor& x, const Window2d& g, const Tensor& y) {
  const int64_t n = backends::checkPool(x, y, g, "cpu", "avgPool");
  const float* xp = f32(x);
  float* yp = f32(y);
  const int64_t oh = g.outHeight(), ow = g.outWidth(), plane = g.height * g.width;
  const float inv = 1.0f / static_cast<float>(g.kernel_h * g.kernel_w);
  pool_.parallelFor(n * g.channels, 8, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const float* in = xp + p * plane;
      for (int64_t oy = 0; oy < oh; ++oy) {
        for (int64_t ox = 0; ox < ow; ++ox) {
          float s = 0;
          for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
            const int64_t iy = oy * g.stride_h - g.pad_h + ki;
            if (iy < 0 || iy >= g.height) continue;
            for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
              const int64_t ix = ox * g.stride_w - g.pad_w + kj;
              if (ix >= 0 && ix < g.width) s += in[iy * g.width + ix];
            }
          }
          yp[p * oh * ow + oy * ow + ox] = s * inv;
        }
      }
    }
  });
}

void CpuBackend::avgPoolBackward(const Tensor& dy, const Window2d& g, const Tensor& dx) {
  const int64_t n = backends::checkPool(dx, dy, g, "cpu", "avgPoolBackward");
  const float* gy = f32(dy);
  float* gx = f32(dx);
  const int64_t oh = g.outHeight(), ow = g.outWidth(), plane = g.height * g.width;
  const float inv = 1.0f / static_cast<float>(g.kernel_h * g.kernel_w);
  pool_.parallelFor(n * g.channels, 8, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      float* out = gx + p * plane;
      std::fill(out, out + plane, 0.0f);
      for (int64_t oy = 0; oy < oh; ++oy) {
        for (int64_t ox = 0; ox < ow; ++ox) {
          const float v = gy[p * oh * ow + oy * ow + ox] * inv;
          for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
            const int64_t iy = oy * g.stride_h - g.pad_h + ki;
            if (iy < 0 || iy >= g.height) continue;
            for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
              const int64_t ix = ox * g.stride_w - g.pad_w + kj;
              if (ix >= 0 && ix < g.width) out[iy * g.width + ix] += v;
            }
          }
        }
      }
    }
  });
}

namespace {

// The outputs ox whose tap kj reads inside the row: 0 <= ox * stride - pad + kj < width
// (so input column ox * stride + kj - pad is never negative for ox >= lo).
std::pair<int64_t, int64_t> tapSpan(int64_t kj, int64_t stride, int64_t pad, int64_t width,
                                    int64_t outs) {
  const int64_t t = pad - kj, u = width - 1 + pad - kj;
  const int64_t lo = t <= 0 ? 0 : (t + stride - 1) / stride;
  const int64_t hi = u < 0 ? 0 : std::min(outs, u / stride + 1);
  return {lo, std::max(lo, hi)};
}

}  // namespace

// One (sample, channel) plane per task: each output row accumulates its taps in (ki, kj)
// order, a tap's outputs at once (contiguous for stride 1, so vectorised).
void CpuBackend::depthwiseConv2d(const Tensor& x, const Tensor& w, const Window2d& g,
                                 const Tensor& y) {
  const int64_t n = backends::checkDepthwise(x, w, y, g, "cpu", "depthwiseConv2d");
  const float* xp = f32(x);
  const float* wp = f32(w);
  float* yp = f32(y);
  const int64_t ow = g.outWidth(), outs = g.outHeight() * ow, plane = g.height * g.width;
  const int64_t taps = g.kernel_h * g.kernel_w, sw = g.stride_w;
  pool_.parallelFor(n * g.channels, 4, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const float* in = xp + p * plane;
      const float* wk = wp + (p % g.channels) * taps;
      float* out = yp + p * outs;
      std::fill(out, out + outs, 0.0f);
      for (int64_t oy = 0; oy < g.outHeight(); ++oy) {
        float* row = out + oy * ow;
        for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
          const int64_t iy = oy * g.stride_h - g.pad_h + ki;
          if (iy < 0 || iy >= g.height) continue;
          const float* src = in + iy * g.width;
          for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
            const auto [lo, hi] = tapSpan(kj, sw, g.pad_w, g.width, ow);
            const float v = wk[ki * g.kernel_w + kj];
            const int64_t shift = kj - g.pad_w;
            if (sw == 1)
              for (int64_t ox = lo; ox < hi; ++ox) row[ox] += v * src[ox + shift];
            else
              for (int64_t ox = lo; ox < hi; ++ox) row[ox] += v * src[ox * sw + shift];
          }
        }
      }
    }
  });
}

// The adjoint, plane by plane: each output's gradient scattered to the inputs its taps
// read, in (oy, ki, kj, ox) order. (Its loops are the forward's written out again: the
// two sharing them through a callback made mobilenet_v2's step 8% slower.)
void CpuBackend::depthwiseConv2dBackwardData(const Tensor& dy, const Tensor& w, const Window2d& g,
                                             const Tensor& dx) {
  const int64_t n = backends::checkDepthwise(dx, w, dy, g, "cpu", "depthwiseConv2dBackwardData");
  const float* gy = f32(dy);
  const float* wp = f32(w);
  float* gx = f32(dx);
  const int64_t ow = g.outWidth(), outs = g.outHeight() * ow, plane = g.height * g.width;
  const int64_t taps = g.kernel_h * g.kernel_w, sw = g.stride_w;
  pool_.parallelFor(n * g.channels, 4, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      float* din = gx + p * plane;
      const float* wk = wp + (p % g.channels) * taps;
      std::fill(din, din + plane, 0.0f);
      for (int64_t oy = 0; oy < g.outHeight(); ++oy) {
        const float* grow = gy + p * outs + oy * ow;
        for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
          const int64_t iy = oy * g.stride_h - g.pad_h + ki;
          if (iy < 0 || iy >= g.height) continue;
          float* dst = din + iy * g.width;
          for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
            const auto [lo, hi] = tapSpan(kj, sw, g.pad_w, g.width, ow);
            const float v = wk[ki * g.kernel_w + kj];
            const int64_t shift = kj - g.pad_w;
            for (int64_t ox = lo; ox < hi; ++ox) dst[ox * sw + shift] += v * grow[ox];
          }
        }
      }
    }
  });
}

// Channel by channel: each sample's share of a tap (its outputs in order) added to dw in
// the batch's order.
void CpuBackend::depthwiseConv2dBackwardWeight(const Tensor& x, const Tensor& dy, const Window2d& g,
                                               const Tensor& dw) {
  const int64_t n = backends::checkDepthwise(x, dw, dy, g, "cpu", "depthwiseConv2dBackwardWeight");
  const float* xp = f32(x);
  const float* gy = f32(dy);
  float* gw = f32(dw);
  const int64_t oh = g.outHeight(), ow = g.outWidth(), plane = g.height * g.width;
  const int64_t taps = g.kernel_h * g.kernel_w, sw = g.stride_w, c = g.channels;
  pool_.parallelFor(c, 1, [&](int64_t b, int64_t e) {
    for (int64_t ch = b; ch < e; ++ch)
      for (int64_t s = 0; s < n; ++s) {
        const float* in = xp + (s * c + ch) * plane;
        const float* grad = gy + (s * c + ch) * oh * ow;
        for (int64_t ki = 0; ki < g.kernel_h; ++ki)
          for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
            const auto [lo, hi] = tapSpan(kj, sw, g.pad_w, g.width, ow);
            float share = 0.0f;
            for (int64_t oy = 0; oy < oh; ++oy) {
              const int64_t iy = oy * g.stride_h - g.pad_h + ki;
              if (iy < 0 || iy >= g.height) continue;
              const float* src = in + iy * g.width;
              const float* grow = grad + oy * ow;
              const int64_t shift = kj - g.pad_w;
              for (int64_t ox = lo; ox < hi; ++ox) share += src[ox * sw + shift] * grow[ox];
            }
            gw[ch * taps + ki * g.kernel_w + kj] += share;
          }
      }
  });
}

}  // namespace tandem::cpu
