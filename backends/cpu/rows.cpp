// Row-wise kernels of the CPU backend: layer and RMS normalisation, rotary embedding,
// embedding lookup, softmax (attention's, with its causal mask) and softmax
// cross-entropy.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/fast_math.h"
#include "backends/op_checks.h"
#include "core/error.h"
#include "core/simd.h"

namespace tandem::cpu {

namespace {

// One row of a softmax over its first `seen` of `n` values (the rest 0): exp in floats
// that vectorise (fast_math.h), summed in double; `out` may alias `row`.
TANDEM_CLONES void softmaxRow(const float* row, float* out, int64_t seen, int64_t n) {
  float mx = row[0];
  for (int64_t j = 1; j < seen; ++j) mx = row[j] > mx ? row[j] : mx;
  for (int64_t j = 0; j < seen; ++j) out[j] = expApprox(row[j] - mx);
  double sum = 0;
  for (int64_t j = 0; j < seen; ++j) sum += out[j];
  const auto inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < seen; ++j) out[j] *= inv;
  std::fill(out + seen, out + n, 0.0f);
}

// Sum of a[j] b[j]: 8 running float sums (j mod 8, in j's order: the same in every
// clone, so it vectorises without depending on the CPU), added up in double.
TANDEM_CLONES double dot8(const float* __restrict a, const float* __restrict b, int64_t n) {
  float lanes[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) lanes[k] += a[j + k] * b[j + k];
  double sum = 0;
  for (int k = 0; k < 8; ++k) sum += lanes[k];
  for (; j < n; ++j) sum += static_cast<double>(a[j]) * b[j];
  return sum;
}

// One row of layer norm's backward: dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma.
TANDEM_CLONES void layerNormBackwardRow(const float* __restrict x, const float* __restrict dy,
                                        const float* __restrict gamma, float mean, float rstd,
                                        float* __restrict dx, int64_t d) {
  // dx holds g for a moment; the sums go in 8 lanes as dot8's.
  float lanes_g[8] = {}, lanes_gx[8] = {};
  for (int64_t i = 0; i < d; ++i) dx[i] = dy[i] * gamma[i];
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int k = 0; k < 8; ++k) {
      lanes_g[k] += dx[i + k];
      lanes_gx[k] += dx[i + k] * ((x[i + k] - mean) * rstd);
    }
  double sum_g = 0, sum_gx = 0;
  for (int k = 0; k < 8; ++k) {
    sum_g += lanes_g[k];
    sum_gx += lanes_gx[k];
  }
  for (; i < d; ++i) {
    sum_g += dx[i];
    sum_gx += static_cast<double>(dx[i]) * ((x[i] - mean) * rstd);
  }
  const auto mean_g = static_cast<float>(sum_g / static_cast<double>(d));
  const auto mean_gx = static_cast<float>(sum_gx / static_cast<double>(d));
  for (int64_t j = 0; j < d; ++j)
    dx[j] = rstd * (dx[j] - mean_g - ((x[j] - mean) * rstd) * mean_gx);
}

// One row's share of layer norm's gamma and beta gradients: per column, in double.
TANDEM_CLONES void columnSumsRow(const float* __restrict x, const float* __restrict dy, float mean,
                                 float rstd, double* __restrict sg, double* __restrict sb,
                                 int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double xhat = (x[i] - mean) * rstd;
    sg[i] += static_cast<double>(dy[i]) * xhat;
    sb[i] += dy[i];
  }
}

// One row of RMS norm's backward: dx = rstd (g - xhat mean(g xhat)), g = dy gamma,
// xhat = x rstd (the sum in dot8's 8 lanes).
TANDEM_CLONES void rmsNormBackwardRow(const float* __restrict x, const float* __restrict dy,
                                      const float* __restrict gamma, float rstd,
                                      float* __restrict dx, int64_t d) {
  for (int64_t i = 0; i < d; ++i) dx[i] = dy[i] * gamma[i];  // g, for a moment
  float lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int k = 0; k < 8; ++k) lanes[k] += dx[i + k] * (x[i + k] * rstd);
  double sum = 0;
  for (float lane : lanes) sum += lane;
  for (; i < d; ++i) sum += static_cast<double>(dx[i]) * (x[i] * rstd);
  const auto mean_gx = static_cast<float>(sum / static_cast<double>(d));
  for (int64_t j = 0; j < d; ++j) dx[j] = rstd * (dx[j] - (x[j] * rstd) * mean_gx);
}

// One row of softmax's backward: dx = y (dy - y . dy).
TANDEM_CLONES void softmaxBackwardRow(const float* __restrict y, const float* __restrict dy,
                                      float* __restrict dx, int64_t n) {
  const auto dot = static_cast<float>(dot8(dy, y, n));
  for (int64_t j = 0; j < n; ++j) dx[j] = y[j] * (dy[j] - dot);
}

// One row's softmax cross-entropy against `label`: the loss, and in `out` the gradient
// (p - onehot) * grad_scale when `grad`, else only e^(x - max) (scratch).
TANDEM_CLONES float crossEntropyRow(const float* __restrict row, int32_t label, int64_t c,
                                    float grad_scale, float* __restrict out, bool grad) {
  float mx = row[0];
  for (int64_t j = 1; j < c; ++j) mx = row[j] > mx ? row[j] : mx;
  for (int64_t j = 0; j < c; ++j) out[j] = expApprox(row[j] - mx);
  double sum = 0;
  for (int64_t j = 0; j < c; ++j) sum += out[j];
  const auto loss = static_cast<float>(std::log(sum) - (row[label] - mx));
  if (grad) {
    const auto scale = static_cast<float>(grad_scale / sum);
    for (int64_t j = 0; j < c; ++j) out[j] *= scale;
    out[label] -= grad_scale;
  }
  return loss;
}

}  // namespace

void CpuBackend::layerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                           const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const backends::RowsView v = backends::checkLayerNorm(x, gamma, beta, y, mean, rstd, "cpu");
  const int64_t m = v.m, d = v.d;
  const float* xp = f32(x);
  const float* gp = f32(gamma);
  const float* bp = f32(beta);
  float* yp = f32(y);
  float* mp = f32(mean);
  float* rp = f32(rstd);
  pool_.parallelFor(m, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* row = xp + r * d;
      double s = 0;
      for (int64_t i = 0; i < d; ++i) s += row[i];
      const double mu = s / static_cast<double>(d);
      double v = 0;
      for (int64_t i = 0; i < d; ++i) v += (row[i] - mu) * (row[i] - mu);
      const float inv = static_cast<float>(1.0 / std::sqrt(v / static_cast<double>(d) + eps));
      const auto muf = static_cast<float>(mu);
      mp[r] = muf;
      rp[r] = inv;
      float* out = yp + r * d;
      for (int64_t i = 0; i < d; ++i) out[i] = (row[i] - muf) * inv * gp[i] + bp[i];
    }
  });
}

void CpuBackend::layerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                   const Tensor& dgamma, const Tensor& dbeta) {
  const backends::RowsView v =
      backends::checkLayerNormBackward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, "cpu");
  const int64_t m = v.m, d = v.d;
  const float* gy = f32(dy);
  const float* xp = f32(x);
  const float* gp = f32(gamma);
  const float* mp = f32(mean);
  const float* rp = f32(rstd);
  float* gx = f32(dx);
  float* gg = f32(dgamma);
  float* gb = f32(dbeta);
  pool_.parallelFor(m, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      layerNormBackwardRow(xp + r * d, gy + r * d, gp, mp[r], rp[r], gx + r * d, d);
  });
  // Column sums over rows in row order: deterministic for any thread count. Each range
  // of columns walks the rows in order, a running sum per column (contiguous reads).
  pool_.parallelFor(d, 64, [&](int64_t b, int64_t e) {
    std::vector<double> sg(static_cast<size_t>(e - b)), sb(static_cast<size_t>(e - b));
    for (int64_t r = 0; r < m; ++r)
      columnSumsRow(xp + r * d + b, gy + r * d + b, mp[r], rp[r], sg.data(), sb.data(), e - b);
    for (int64_t i = b; i < e; ++i) {
      gg[i] += static_cast<float>(sg[static_cast<size_t>(i - b)]);
      gb[i] += static_cast<float>(sb[static_cast<size_t>(i - b)]);
    }
  });
}

void CpuBackend::rmsNorm(const Tensor& x, const Tensor& gamma, float eps, const Tensor& y,
                         const Tensor& rstd) {
  const backends::RowsView v = backends::checkRmsNorm(x, gamma, y, rstd, "cpu");
  const int64_t d = v.d;
  const float* xp = f32(x);
  const float* gp = f32(gamma);
  float* yp = f32(y);
  float* rp = f32(rstd);
  pool_.parallelFor(v.m, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* row = xp + r * d;
      const auto inv =
          static_cast<float>(1.0 / std::sqrt(dot8(row, row, d) / static_cast<double>(d) + eps));
      rp[r] = inv;
      float* out = yp + r * d;
      for (int64_t i = 0; i < d; ++i) out[i] = row[i] * inv * gp[i];
    }
  });
}

void CpuBackend::rmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                 const Tensor& rstd, const Tensor& dx, const Tensor& dgamma) {
  const backends::RowsView v =
      backends::checkRmsNormBackward(dy, x, gamma, rstd, dx, dgamma, "cpu");
  const int64_t m = v.m, d = v.d;
  const float* gy = f32(dy);
  const float* xp = f32(x);
  const float* gp = f32(gamma);
  const float* rp = f32(rstd);
  float* gx = f32(dx);
  float* gg = f32(dgamma);
  pool_.parallelFor(m, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      rmsNormBackwardRow(xp + r * d, gy + r * d, gp, rp[r], gx + r * d, d);
  });
  // Column sums of dy xhat over rows in row order, as layerNormBackward's.
  pool_.parallelFor(d, 64, [&](int64_t b, int64_t e) {
    std::vector<double> sg(static_cast<size_t>(e - b));
    for (int64_t r = 0; r < m; ++r) {
      const float* xr = xp + r * d;
      const float* gr = gy + r * d;
      for (int64_t i = b; i < e; ++i)
        sg[static_cast<size_t>(i - b)] += static_cast<double>(gr[i]) * (xr[i] * rp[r]);
    }
    for (int64_t i = b; i < e; ++i) gg[i] += static_cast<float>(sg[static_cast<size_t>(i - b)]);
  });
}

void CpuBackend::rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
                      int64_t rotated, bool inverse, const Tensor& y) {
  const backends::RopeView v = backends::checkRope(x, positions, inv_freq, rotated, y, "cpu");
  const int64_t heads = v.heads, all = v.all_heads, size = v.size, half = size / 2;
  const int32_t* pp = i32(positions);
  const float* fp = f32(inv_freq);
  const float* xp = f32(x);
  float* yp = f32(y);
  pool_.parallelFor(v.rows, 4, [&](int64_t b, int64_t e) {
    std::vector<float> cosines(static_cast<size_t>(half)), sines(static_cast<size_t>(half));
    for (int64_t r = b; r < e; ++r) {
      for (int64_t i = 0; i < half; ++i) {
        const float a = static_cast<float>(pp[r]) * fp[i];
        cosines[static_cast<size_t>(i)] = std::cos(a);
        sines[static_cast<size_t>(i)] = inverse ? -std::sin(a) : std::sin(a);
      }
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t at = (r * all + h) * size;
        for (int64_t i = 0; i < half; ++i) {
          const float c = cosines[static_cast<size_t>(i)], s = sines[static_cast<size_t>(i)];
          const float x0 = xp[at + i], x1 = xp[at + i + half];
          yp[at + i] = x0 * c - x1 * s;
          yp[at + i + half] = x1 * c + x0 * s;
        }
      }
    }
  });
}

void CpuBackend::embedding(const Tensor& ids, const Tensor& table, const Tensor& y) {
  const backends::EmbeddingView v = backends::checkEmbedding(ids, table, y, "cpu", "embedding");
  const int64_t vocab = v.vocab, d = v.d, m = v.m;
  const int32_t* ip = i32(ids);
  backends::checkIds(ip, m, vocab, "embedding id", "at position");
  const float* tp = f32(table);
  float* yp = f32(y);
  pool_.parallelFor(m, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::copy_n(tp + ip[i] * d, d, yp + i * d);
  });
}

void CpuBackend::embeddingBackward(const Tensor& ids, const Tensor& dy, const Tensor& dtable) {
  const backends::EmbeddingView v =
      backends::checkEmbedding(ids, dtable, dy, "cpu", "embeddingBackward");
  const int64_t vocab = v.vocab, d = v.d, m = v.m;
  const int32_t* ip = i32(ids);
  backends::checkIds(ip, m, vocab, "embedding id", "at position");
  const float* gp = f32(dy);
  float* tp = f32(dtable);
  // Split by column so repeated ids accumulate in position order without races.
  pool_.parallelFor(d, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = 0; i < m; ++i) {
      float* dst = tp + ip[i] * d;
      const float* src = gp + i * d;
      for (int64_t j = b; j < e; ++j) dst[j] += src[j];
    }
  });
}

void CpuBackend::softmax(const Tensor& x, bool causal, const Tensor& y) {
  const backends::SoftmaxView v = backends::checkSoftmax(x, y, causal, "cpu", "softmax");
  const float* xp = f32(x);
  float* yp = f32(y);
  pool_.parallelFor(v.rows, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t seen = causal ? v.tk - v.tq + r % v.tq + 1 : v.tk;
      softmaxRow(xp + r * v.tk, yp + r * v.tk, seen, v.tk);
    }
  });
}

void CpuBackend::softmaxBackward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const backends::SoftmaxView v = backends::checkSoftmax(y, dy, false, "cpu", "softmaxBackward");
  backends::checkSameCount(y, dx, "cpu", "softmaxBackward");
  const float* yp = f32(y);
  const float* gp = f32(dy);
  float* dp = f32(dx);
  pool_.parallelFor(v.rows, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      softmaxBackwardRow(yp + r * v.tk, gp + r * v.tk, dp + r * v.tk, v.tk);
  });
}

void CpuBackend::softmaxCrossEntropy(const Tensor& logits, const Tensor& labels, float grad_scale,
                                     const Tensor& losses, const Tensor& dlogits) {
  const backends::LogitsView v =
      backends::checkSoftmaxCrossEntropy(logits, labels, losses, dlogits, "cpu");
  const int64_t n = v.n, c = v.c;
  const int32_t* lp = i32(labels);
  backends::checkIds(lp, n, c, "label", "of sample");
  const float* xp = f32(logits);
  float* loss = f32(losses);
  float* gp = dlogits.defined() ? f32(dlogits) : nullptr;
  pool_.parallelFor(n, 16, [&](int64_t b, int64_t e) {
    std::vector<float> scratch(gp ? 0 : static_cast<size_t>(c));
    for (int64_t r = b; r < e; ++r)
      loss[r] = crossEntropyRow(xp + r * c, lp[r], c, grad_scale, gp ? gp + r * c : scratch.data(),
                                gp != nullptr);
  });
}

}  // namespace tandem::cpu
