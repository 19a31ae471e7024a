// Row-wise kernels of the CPU backend: layer normalisation, embedding lookup, softmax
// (attention's, with its causal mask) and softmax cross-entropy.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/op_checks.h"
#include "core/error.h"

namespace tandem::cpu {

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
    for (int64_t r = b; r < e; ++r) {
      const float* row = xp + r * d;
      const float* grow = gy + r * d;
      double sum_g = 0, sum_gx = 0;
      for (int64_t i = 0; i < d; ++i) {
        const double xhat = (row[i] - mp[r]) * rp[r];
        const double g = static_cast<double>(grow[i]) * gp[i];
        sum_g += g;
        sum_gx += g * xhat;
      }
      const double mean_g = sum_g / static_cast<double>(d);
      const double mean_gx = sum_gx / static_cast<double>(d);
      for (int64_t i = 0; i < d; ++i) {
        const double xhat = (row[i] - mp[r]) * rp[r];
        const double g = static_cast<double>(grow[i]) * gp[i];
        gx[r * d + i] = static_cast<float>(rp[r] * (g - mean_g - xhat * mean_gx));
      }
    }
  });
  // Column sums over rows in row order: deterministic for any thread count.
  pool_.parallelFor(d, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      double sg = 0, sb = 0;
      for (int64_t r = 0; r < m; ++r) {
        const double xhat = (xp[r * d + i] - mp[r]) * rp[r];
        sg += static_cast<double>(gy[r * d + i]) * xhat;
        sb += gy[r * d + i];
      }
      gg[i] += static_cast<float>(sg);
      gb[i] += static_cast<float>(sb);
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
      const float* row = xp + r * v.tk;
      float* out = yp + r * v.tk;
      const int64_t seen = causal ? v.tk - v.tq + r % v.tq + 1 : v.tk;
      const float mx = *std::max_element(row, row + seen);
      // One float exp per element (an exp in double costs twice as much, and this is most
      // of attention's time outside gemm), summed in double; y may alias x.
      double sum = 0;
      for (int64_t j = 0; j < seen; ++j) {
        out[j] = std::exp(row[j] - mx);
        sum += out[j];
      }
      const auto inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < seen; ++j) out[j] *= inv;
      std::fill(out + seen, out + v.tk, 0.0f);
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
    for (int64_t r = b; r < e; ++r) {
      const float* yr = yp + r * v.tk;
      const float* gr = gp + r * v.tk;
      double dot = 0;
      for (int64_t j = 0; j < v.tk; ++j) dot += static_cast<double>(gr[j]) * yr[j];
      float* out = dp + r * v.tk;
      for (int64_t j = 0; j < v.tk; ++j) out[j] = static_cast<float>(yr[j] * (gr[j] - dot));
    }
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
    for (int64_t r = b; r < e; ++r) {
      const float* row = xp + r * c;
      const float mx = *std::max_element(row, row + c);
      double sum = 0;
      for (int64_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(row[j] - mx));
      const double log_sum = std::log(sum);
      loss[r] = static_cast<float>(log_sum - (row[lp[r]] - mx));
      if (gp) {
        float* g = gp + r * c;
        for (int64_t j = 0; j < c; ++j) {
          const double p = std::exp(static_cast<double>(row[j] - mx) - log_sum);
          g[j] = static_cast<float>((p - (j == lp[r] ? 1.0 : 0.0)) * grad_scale);
        }
      }
    }
  });
}

}  // namespace tandem::cpu
