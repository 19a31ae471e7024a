// Batch normalisation on the CPU backend: x viewed as [N, C, R], one channel per task,
// each channel's N*R values summed in sample and position order in double, so the
// statistics and the gradients are the same for any thread count.
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/row_sums.h"
#include "backends/op_checks.h"

namespace tandem::cpu {

namespace {

float rstdOf(float var, float eps) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(var) + eps));
}

}  // namespace

void CpuBackend::batchNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                           bool batch, const Tensor& mean, const Tensor& var, const Tensor& y) {
  const backends::ChannelView v =
      backends::checkBatchNorm(x, gamma, beta, mean, var, y, "cpu", "batchNorm");
  const int64_t C = v.c, R = v.r;
  const float* xp = f32(x);
  const float* gp = f32(gamma);
  const float* bp = f32(beta);
  float* mp = f32(mean);
  float* vp = f32(var);
  float* yp = f32(y);
  const auto count = static_cast<double>(v.n * R);
  pool_.parallelFor(C, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      if (batch) {
        double s = 0;
        for (int64_t n = 0; n < v.n; ++n) s += sum8(xp + (n * C + c) * R, R);
        const double mu = s / count;
        double q = 0;
        for (int64_t n = 0; n < v.n; ++n) {
          const float* row = xp + (n * C + c) * R;
          for (int64_t r = 0; r < R; ++r) q += (row[r] - mu) * (row[r] - mu);
        }
        mp[c] = static_cast<float>(mu);
        vp[c] = static_cast<float>(q / count);
      }
      const float mu = mp[c];
      const float scale = rstdOf(vp[c], eps) * gp[c];
      const float shift = bp[c];
      for (int64_t n = 0; n < v.n; ++n) {
        const float* row = xp + (n * C + c) * R;
        float* out = yp + (n * C + c) * R;
        for (int64_t r = 0; r < R; ++r) out[r] = (row[r] - mu) * scale + shift;
      }
    }
  });
}

void CpuBackend::batchNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                   const Tensor& mean, const Tensor& var, float eps,
                                   const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  const backends::ChannelView v =
      backends::checkBatchNormBackward(dy, x, gamma, mean, var, dx, dgamma, dbeta, "cpu");
  const int64_t C = v.c, R = v.r;
  const float* gy = f32(dy);
  const float* xp = f32(x);
  const float* gp = f32(gamma);
  const float* mp = f32(mean);
  const float* vp = f32(var);
  float* gx = f32(dx);
  float* gg = f32(dgamma);
  float* gb = f32(dbeta);
  const auto count = static_cast<double>(v.n * R);
  pool_.parallelFor(C, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const float mu = mp[c];
      const float inv = rstdOf(vp[c], eps);
      double sg = 0, sgx = 0;
      for (int64_t n = 0; n < v.n; ++n) {
        const float* row = xp + (n * C + c) * R;
        const float* grow = gy + (n * C + c) * R;
        for (int64_t r = 0; r < R; ++r) {
          sg += grow[r];
          sgx += static_cast<double>(grow[r]) * ((row[r] - mu) * inv);
        }
      }
      const auto mg = static_cast<float>(sg / count), mgx = static_cast<float>(sgx / count);
      const float k = gp[c] * inv;
      for (int64_t n = 0; n < v.n; ++n) {
        const float* row = xp + (n * C + c) * R;
        const float* grow = gy + (n * C + c) * R;
        float* out = gx + (n * C + c) * R;
        for (int64_t r = 0; r < R; ++r) out[r] = k * (grow[r] - mg - (row[r] - mu) * inv * mgx);
      }
      gg[c] += static_cast<float>(sgx);
      gb[c] += static_cast<float>(sg);
    }
  });
}

}  // namespace tandem::cpu
