// Row-wise kernels of the CPU backend: layer normalisation, embedding lookup and
// softmax cross-entropy.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/op_checks.h"
#include "core/error.h"

namespace tandem::cpu {

void CpuBackend::layerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                           const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const int64_t d = gamma.numel();
  const int64_t m = backends::rowsOf(x, d, "cpu", "layerNorm");
  TANDEM_CHECK_MSG(
      beta.numel() == d && y.numel() == x.numel() && mean.numel() == m && rstd.numel() == m,
      InvalidArgument, "cpu layerNorm: argument sizes disagree with x " << x.shape());
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
  const int64_t d = gamma.numel();
  const int64_t m = backends::rowsOf(x, d, "cpu", "layerNormBackward");
  TANDEM_CHECK_MSG(dy.numel() == x.numel() && dx.numel() == x.numel() && mean.numel() == m &&
                       rstd.numel() == m && dgamma.numel() == d && dbeta.numel() == d,
                   InvalidArgument,
                   "cpu layerNormBackward: argument sizes disagree with x " << x.shape());
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
  TANDEM_CHECK_MSG(table.shape().rank() == 2, InvalidArgument,
                   "cpu embedding: table " << table.shape() << " is not [V, D]");
  const int64_t vocab = table.shape()[0], d = table.shape()[1], m = ids.numel();
  TANDEM_CHECK_MSG(y.numel() == m * d, InvalidArgument,
                   "cpu embedding: output " << y.shape() << " does not hold " << m << " x " << d);
  const int32_t* ip = i32(ids);
  backends::checkIds(ip, m, vocab, "embedding id", "at position");
  const float* tp = f32(table);
  float* yp = f32(y);
  pool_.parallelFor(m, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::copy_n(tp + ip[i] * d, d, yp + i * d);
  });
}

void CpuBackend::embeddingBackward(const Tensor& ids, const Tensor& dy, const Tensor& dtable) {
  TANDEM_CHECK_MSG(dtable.shape().rank() == 2, InvalidArgument,
                   "cpu embeddingBackward: table gradient " << dtable.shape() << " is not [V, D]");
  const int64_t vocab = dtable.shape()[0], d = dtable.shape()[1], m = ids.numel();
  TANDEM_CHECK_MSG(
      dy.numel() == m * d, InvalidArgument,
      "cpu embeddingBackward: gradient " << dy.shape() << " does not hold " << m << " x " << d);
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

void CpuBackend::softmaxCrossEntropy(const Tensor& logits, const Tensor& labels, float grad_scale,
                                     const Tensor& losses, const Tensor& dlogits) {
  TANDEM_CHECK_MSG(logits.shape().rank() == 2, InvalidArgument,
                   "cpu softmaxCrossEntropy: logits " << logits.shape() << " are not [N, C]");
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  TANDEM_CHECK_MSG(labels.numel() == n && losses.numel() == n &&
                       (!dlogits.defined() || dlogits.numel() == n * c),
                   InvalidArgument,
                   "cpu softmaxCrossEntropy: labels " << labels.shape() << " / losses "
                                                      << losses.shape() << " do not match logits "
                                                      << logits.shape());
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
