// Known-answer tests of the CPU backend's dense, element-wise, row-wise and optimizer
// ops against naive loops, at sizes that hit vector tails (1, 7, 13, 127), and with 1 and
// 3 threads (results must be bitwise equal: every reduction has a fixed order).
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::randomVector;

class CpuOpsTest : public ::testing::TestWithParam<int64_t> {
 protected:
  cpu::CpuBackend one_{cpu::CpuOptions{1}};
  cpu::CpuBackend three_{cpu::CpuOptions{3}};
};

INSTANTIATE_TEST_SUITE_P(OddSizes, CpuOpsTest, ::testing::Values(1, 7, 13, 127));

TEST_P(CpuOpsTest, GemmAllTransposesMatchNaive) {
  const int64_t n = GetParam();
  const int64_t m = n + 2, k = 2 * n + 1;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const auto a = randomVector(1, m * k), b = randomVector(2, k * n),
                 c0 = randomVector(3, m * n);
      Tensor at = toDevice(one_, ta ? Shape{k, m} : Shape{m, k}, a);
      Tensor bt = toDevice(one_, tb ? Shape{n, k} : Shape{k, n}, b);
      Tensor ct = toDevice(one_, {m, n}, c0);
      one_.gemm(ta, tb, 0.5f, at, bt, 2.0f, ct);
      const auto got = toHost(ct);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p)
            s += static_cast<double>(ta ? a[p * m + i] : a[i * k + p]) *
                 (tb ? b[j * k + p] : b[p * n + j]);
          const double want = 0.5 * s + 2.0 * c0[i * n + j];
          EXPECT_NEAR(got[i * n + j], want, 1e-4 * (1 + std::abs(want)))
              << ta << tb << i << "," << j;
        }
      }
    }
  }
}

// Each block of a batched gemm equals the plain gemm of that block, bitwise, whether the
// blocks are shared out among threads (7 blocks, 3 threads) or fewer than the threads.
TEST_P(CpuOpsTest, BatchedGemmIsTheGemmOfEachBlock) {
  const int64_t n = GetParam(), m = n + 3, k = 2 * n + 1;
  for (const int64_t batch : {int64_t{7}, int64_t{2}}) {
    const auto av = randomVector(20, batch * k * m), bv = randomVector(21, batch * k * n);
    const auto cv = randomVector(22, batch * m * n);
    Tensor a = toDevice(three_, {batch, k, m}, av), b = toDevice(three_, {batch, k, n}, bv);
    Tensor c = toDevice(three_, {batch, m, n}, cv);
    three_.gemmBatched(true, false, 0.5f, a, b, 1.5f, c);
    const auto got = toHost(c);
    for (int64_t i = 0; i < batch; ++i) {
      Tensor ci = toDevice(one_, {m, n}, {cv.begin() + i * m * n, cv.begin() + (i + 1) * m * n});
      one_.gemm(true, false, 0.5f,
                toDevice(one_, {k, m}, {av.begin() + i * k * m, av.begin() + (i + 1) * k * m}),
                toDevice(one_, {k, n}, {bv.begin() + i * k * n, bv.begin() + (i + 1) * k * n}),
                1.5f, ci);
      const auto want = toHost(ci);
      for (int64_t e = 0; e < m * n; ++e) ASSERT_EQ(got[i * m * n + e], want[e]) << i << " " << e;
    }
  }
  Tensor a = one_.empty({2, 3, 4}), b = one_.empty({3, 4, 5}), c = one_.empty({2, 3, 5});
  testing::expectThrowWith<InvalidArgument>([&] { one_.gemmBatched(false, false, 1, a, b, 0, c); },
                                            {"batched gemm needs 3-D tensors with one batch"});
}

// Few rows times a matrix as it lies (attention's weights times a cache's values while
// decoding): every row is the product of that row alone, bitwise, on 1 and 3 threads, with
// and without beta, at column counts that hit the 16- and 8-column blocks and the single
// columns after them, and near the naive sum.
TEST(CpuFewRowsTest, FewRowsTimesAMatrixAreEachRowAloneBitwiseOnAnyThreads) {
  cpu::CpuBackend one{cpu::CpuOptions{1}}, three{cpu::CpuOptions{3}};
  for (const int64_t m : {1, 3, 4, 6, 15})
    for (const int64_t n : {1, 7, 8, 29, 64, 200})
      for (const int64_t k : {1, 13, 300})
        for (const float beta : {0.0f, 1.5f}) {
          const auto a = randomVector(30, m * k), b = randomVector(31, k * n),
                     c0 = randomVector(32, m * n);
          const std::string at = std::to_string(m) + "x" + std::to_string(k) + " times " +
                                 std::to_string(k) + "x" + std::to_string(n) + ", beta " +
                                 std::to_string(beta);
          Tensor c1 = toDevice(one, {m, n}, c0), c3 = toDevice(three, {m, n}, c0);
          one.gemm(false, false, 0.5f, toDevice(one, {m, k}, a), toDevice(one, {k, n}, b), beta,
                   c1);
          three.gemm(false, false, 0.5f, toDevice(three, {m, k}, a), toDevice(three, {k, n}, b),
                     beta, c3);
          const auto got = toHost(c1);
          ASSERT_EQ(got, toHost(c3)) << at << ": 1 and 3 threads";
          for (int64_t r = 0; r < m; ++r) {
            Tensor row = toDevice(one, {1, n}, {c0.begin() + r * n, c0.begin() + (r + 1) * n});
            one.gemm(false, false, 0.5f,
                     toDevice(one, {1, k}, {a.begin() + r * k, a.begin() + (r + 1) * k}),
                     toDevice(one, {k, n}, b), beta, row);
            const auto alone = toHost(row);
            for (int64_t j = 0; j < n; ++j) {
              ASSERT_EQ(got[r * n + j], alone[j]) << at << ": row " << r << " alone, column " << j;
              double s = 0;
              for (int64_t t = 0; t < k; ++t) s += static_cast<double>(a[r * k + t]) * b[t * n + j];
              const double want = 0.5 * s + beta * c0[r * n + j];
              ASSERT_NEAR(got[r * n + j], want, 1e-4 * (1 + std::abs(want))) << at;
            }
          }
        }
}

TEST_P(CpuOpsTest, GemmRejectsMismatchedShapes) {
  const int64_t n = GetParam();
  Tensor a = one_.zeros({n, n + 1}), b = one_.zeros({n, n}), c = one_.zeros({n, n});
  testing::expectThrowWith<InvalidArgument>([&] { one_.gemm(false, false, 1, a, b, 0, c); },
                                            {"gemm shapes do not agree"});
}

TEST_P(CpuOpsTest, ElementwiseOpsMatchNaive) {
  const int64_t n = GetParam() * 1000 + 3;  // big enough to split across threads
  const auto x = randomVector(4, n), y = randomVector(5, n);
  for (cpu::CpuBackend* be : {&one_, &three_}) {
    Tensor xt = toDevice(*be, {n}, x), yt = toDevice(*be, {n}, y);
    be->axpby(2.0f, xt, -0.5f, yt);
    const auto r = toHost(yt);
    for (int64_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(r[i], 2.0f * x[i] - 0.5f * y[i]);
    Tensor out = be->empty({n});
    be->mul(xt, xt, out);
    const auto sq = toHost(out);
    double dot = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(sq[i], x[i] * x[i]);
      dot += static_cast<double>(x[i]) * x[i];
    }
    EXPECT_NEAR(be->dot(xt, xt), dot, 1e-9 * dot);
  }
  Tensor a1 = toDevice(one_, {n}, x), a3 = toDevice(three_, {n}, x);
  EXPECT_EQ(one_.dot(a1, a1), three_.dot(a3, a3));  // fixed-order reduction
}

TEST_P(CpuOpsTest, BiasForwardAndGradient) {
  const int64_t c = GetParam(), n = 3, r = 5;
  const auto y = randomVector(6, n * c * r), b = randomVector(7, c);
  Tensor yt = toDevice(one_, {n, c, r}, y), bt = toDevice(one_, {c}, b);
  one_.addBias(yt, bt);
  const auto got = toHost(yt);
  for (int64_t i = 0; i < n * c * r; ++i) ASSERT_FLOAT_EQ(got[i], y[i] + b[(i / r) % c]);
  Tensor db = toDevice(one_, {c}, b);  // accumulates onto the existing values
  one_.biasGrad(toDevice(one_, {n, c, r}, y), db);
  const auto g = toHost(db);
  for (int64_t ch = 0; ch < c; ++ch) {
    double s = b[ch];
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < r; ++j) s += y[(i * c + ch) * r + j];
    EXPECT_NEAR(g[ch], s, 1e-5);
  }
  Tensor db2 = one_.zeros({c});
  one_.biasGrad(toDevice(one_, {n, c}, randomVector(8, n * c)), db2);  // the [N, C] path
  const auto rows = randomVector(8, n * c);
  const auto g2 = toHost(db2);
  for (int64_t ch = 0; ch < c; ++ch)
    EXPECT_NEAR(g2[ch], rows[ch] + rows[c + ch] + rows[2 * c + ch], 1e-5);
}

// An activation and its derivative in double, to check a backend's against.
struct ActivationRef {
  Activation kind;
  double (*f)(double);
  double (*df)(double);
};

void expectActivation(Backend& be, const ActivationRef& ref, const std::vector<float>& x,
                      const std::vector<float>& dy) {
  const auto n = static_cast<int64_t>(x.size());
  Tensor xt = toDevice(be, {n}, x), yt = be.empty({n}), dx = be.empty({n});
  be.activation(ref.kind, xt, yt);
  be.activationBackward(ref.kind, xt, yt, toDevice(be, {n}, dy), dx);
  const auto y = toHost(yt), g = toHost(dx);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(y[i], ref.f(x[i]), 2e-6) << static_cast<int>(ref.kind) << " at " << x[i];
    EXPECT_NEAR(g[i], dy[i] * ref.df(x[i]), 2e-6) << static_cast<int>(ref.kind) << " at " << x[i];
  }
}

TEST_P(CpuOpsTest, ActivationsAndDerivativesMatchFormulas) {
  const int64_t n = GetParam();
  const auto x = randomVector(9, n, -3, 3), dy = randomVector(10, n);
  const ActivationRef refs[] = {
      {Activation::kReLU, [](double v) { return v > 0 ? v : 0.0; },
       [](double v) { return v > 0 ? 1.0 : 0.0; }},
      {Activation::kGELU, [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); },
       [](double v) {
         return 0.5 * (1 + std::erf(v / std::sqrt(2.0))) +
                v * std::exp(-v * v / 2) / std::sqrt(2 * M_PI);
       }},
      {Activation::kTanh, [](double v) { return std::tanh(v); },
       [](double v) { return 1 - std::tanh(v) * std::tanh(v); }},
      {Activation::kSigmoid, [](double v) { return 1 / (1 + std::exp(-v)); },
       [](double v) {
         const double s = 1 / (1 + std::exp(-v));
         return s * (1 - s);
       }},
      {Activation::kSiLU, [](double v) { return v / (1 + std::exp(-v)); },
       [](double v) {
         const double s = 1 / (1 + std::exp(-v));
         return s * (1 + v * (1 - s));
       }},
  };
  for (const ActivationRef& ref : refs) expectActivation(one_, ref, x, dy);
}

// The mobile networks' piecewise-linear activations as PyTorch defines them, their bounds
// included: ReLU6's gradient is 0 at 0 and 6, the hard sigmoid's 0 at -3 and 3, the hard
// swish's x / 3 + 1/2 from -3 to 3 inclusive.
TEST_P(CpuOpsTest, HardActivationsMatchPyTorchsDefinitionsAtTheirBounds) {
  const int64_t n = GetParam();
  std::vector<float> x = randomVector(12, n, -8, 8);
  const float bounds[] = {-3, 0, 3, 6, -8, 8};
  for (size_t i = 0; i < std::size(bounds) && i < x.size(); ++i) x[i] = bounds[i];
  const auto dy = randomVector(13, n);
  const ActivationRef refs[] = {
      {Activation::kReLU6, [](double v) { return std::min(std::max(v, 0.0), 6.0); },
       [](double v) { return v > 0 && v < 6 ? 1.0 : 0.0; }},
      {Activation::kHardSigmoid, [](double v) { return std::min(std::max(v + 3, 0.0), 6.0) / 6; },
       [](double v) { return v > -3 && v < 3 ? 1.0 / 6 : 0.0; }},
      {Activation::kHardSwish, [](double v) { return v * std::min(std::max(v + 3, 0.0), 6.0) / 6; },
       [](double v) { return v < -3   ? 0.0
                             : v <= 3 ? v / 3 + 0.5
                                      : 1.0; }},
  };
  for (const ActivationRef& ref : refs) expectActivation(three_, ref, x, dy);
}

TEST_P(CpuOpsTest, DropoutMaskIsSeededScaledAndThreadIndependent) {
  const int64_t n = GetParam() * 997;
  const auto x = randomVector(11, n);
  std::vector<float> masks[2];
  int which = 0;
  for (cpu::CpuBackend* be : {&one_, &three_}) {
    Tensor m = be->empty({n}), y = be->empty({n});
    be->dropout(toDevice(*be, {n}, x), 0.25f, 1234, m, y);
    masks[which] = toHost(m);
    const auto yv = toHost(y);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(masks[which][i] == 0.0f || masks[which][i] == 1.0f / 0.75f);
      ASSERT_EQ(yv[i], x[i] * masks[which][i]);
    }
    ++which;
  }
  EXPECT_EQ(masks[0], masks[1]);
  if (n > 10000) {
    int64_t dropped = 0;
    for (float v : masks[0]) dropped += v == 0.0f;
    EXPECT_NEAR(static_cast<double>(dropped) / n, 0.25, 0.02);
  }
  Tensor m = one_.empty({n}), y = one_.empty({n});
  EXPECT_THROW(one_.dropout(toDevice(one_, {n}, x), 1.0f, 1, m, y), InvalidArgument);
}

TEST_P(CpuOpsTest, SoftmaxCrossEntropyMatchesNaive) {
  const int64_t c = GetParam() + 1, n = 5;
  const auto logits = randomVector(12, n * c, -4, 4);
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int32_t>((i * 3) % c));
  Tensor loss = one_.empty({n}), grad = one_.empty({n, c});
  one_.softmaxCrossEntropy(toDevice(one_, {n, c}, logits), toDeviceI32(one_, {n}, labels), 0.5f,
                           loss, grad);
  const auto l = toHost(loss), g = toHost(grad);
  for (int64_t i = 0; i < n; ++i) {
    double z = 0;
    for (int64_t j = 0; j < c; ++j) z += std::exp(static_cast<double>(logits[i * c + j]));
    EXPECT_NEAR(l[i], std::log(z) - logits[i * c + labels[i]], 1e-5);
    for (int64_t j = 0; j < c; ++j) {
      const double p = std::exp(static_cast<double>(logits[i * c + j])) / z;
      EXPECT_NEAR(g[i * c + j], 0.5 * (p - (j == labels[i])), 1e-6);
    }
  }
  labels[2] = static_cast<int32_t>(c);
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        one_.softmaxCrossEntropy(toDevice(one_, {n, c}, logits), toDeviceI32(one_, {n}, labels), 1,
                                 loss, grad);
      },
      {"label " + std::to_string(c), "sample 2"});
}

// Rows of [N, Tq, Tk] with the causal mask (query i sees keys 0..Tk-Tq+i) against the
// definition, on one thread and three; the backward against y * (dy - <dy, y>).
TEST_P(CpuOpsTest, CausalSoftmaxAndItsBackwardMatchNaive) {
  const int64_t tk = GetParam() + 1, tq = (tk + 1) / 2, n = 3;
  const auto x = randomVector(13, n * tq * tk, -5, 5);
  const auto dy = randomVector(14, n * tq * tk);
  for (cpu::CpuBackend* be : {&one_, &three_}) {
    Tensor y = be->empty({n, tq, tk}), dx = be->empty({n, tq, tk});
    be->softmax(toDevice(*be, {n, tq, tk}, x), true, y);
    be->softmaxBackward(y, toDevice(*be, {n, tq, tk}, dy), dx);
    const auto got = toHost(y), grad = toHost(dx);
    for (int64_t r = 0; r < n * tq; ++r) {
      const int64_t seen = tk - tq + r % tq + 1;
      double z = 0, dot = 0;
      for (int64_t j = 0; j < seen; ++j) z += std::exp(static_cast<double>(x[r * tk + j]));
      for (int64_t j = 0; j < tk; ++j) {
        const double p = j < seen ? std::exp(static_cast<double>(x[r * tk + j])) / z : 0.0;
        ASSERT_NEAR(got[r * tk + j], p, 1e-6) << "row " << r << " key " << j;
        dot += p * dy[r * tk + j];
      }
      for (int64_t j = 0; j < tk; ++j)
        ASSERT_NEAR(grad[r * tk + j], got[r * tk + j] * (dy[r * tk + j] - dot), 1e-6);
    }
  }
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        Tensor wide = one_.empty({tk + 1, tk});
        one_.softmax(wide, true, wide);
      },
      {"causal mask needs at least as many keys as queries"});
}

TEST_P(CpuOpsTest, LayerNormMatchesNaive) {
  const int64_t d = GetParam(), m = 4;
  const auto x = randomVector(13, m * d, -2, 2), gamma = randomVector(14, d),
             beta = randomVector(15, d);
  Tensor y = one_.empty({m, d}), mean = one_.empty({m}), rstd = one_.empty({m});
  one_.layerNorm(toDevice(one_, {m, d}, x), toDevice(one_, {d}, gamma), toDevice(one_, {d}, beta),
                 1e-5f, y, mean, rstd);
  const auto yv = toHost(y);
  for (int64_t r = 0; r < m; ++r) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mu += x[r * d + i];
    mu /= d;
    for (int64_t i = 0; i < d; ++i) var += (x[r * d + i] - mu) * (x[r * d + i] - mu);
    var /= d;
    for (int64_t i = 0; i < d; ++i)
      EXPECT_NEAR(yv[r * d + i], (x[r * d + i] - mu) / std::sqrt(var + 1e-5) * gamma[i] + beta[i],
                  1e-4);
  }
}

TEST_P(CpuOpsTest, RmsNormAndItsGradientsMatchNaive) {
  const int64_t d = GetParam(), m = 4;
  const auto x = randomVector(13, m * d, -2, 2), gamma = randomVector(14, d),
             dy = randomVector(15, m * d);
  const float eps = 1e-6f;
  Tensor xt = toDevice(one_, {m, d}, x), gt = toDevice(one_, {d}, gamma);
  Tensor y = one_.empty({m, d}), rstd = one_.empty({m}), dx = one_.empty({m, d});
  Tensor dgamma = one_.zeros({d});
  one_.rmsNorm(xt, gt, eps, y, rstd);
  one_.rmsNormBackward(toDevice(one_, {m, d}, dy), xt, gt, rstd, dx, dgamma);
  const auto yv = toHost(y), dxv = toHost(dx), dgv = toHost(dgamma);
  std::vector<double> dg(static_cast<size_t>(d));
  for (int64_t r = 0; r < m; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[r * d + i]) * x[r * d + i];
    const double rs = 1 / std::sqrt(ss / d + eps);
    // dx_i = rs (g_i - xhat_i mean(g xhat)), g = dy gamma, xhat = x rs.
    double mean_gx = 0;
    for (int64_t i = 0; i < d; ++i) mean_gx += dy[r * d + i] * gamma[i] * x[r * d + i] * rs / d;
    for (int64_t i = 0; i < d; ++i) {
      const double xhat = x[r * d + i] * rs;
      EXPECT_NEAR(yv[r * d + i], xhat * gamma[i], 1e-5);
      EXPECT_NEAR(dxv[r * d + i], rs * (dy[r * d + i] * gamma[i] - xhat * mean_gx), 1e-4);
      dg[static_cast<size_t>(i)] += dy[r * d + i] * xhat;
    }
  }
  for (int64_t i = 0; i < d; ++i) EXPECT_NEAR(dgv[i], dg[static_cast<size_t>(i)], 1e-4);
}

// Batch statistics over [N, C, R] (R = the size, and R = 1: features), the normalised
// output and the train-mode gradients (through the batch's mean and variance) against
// the formulas written out in double; the running-statistics form reads mean and var;
// three threads give the same bits.
TEST_P(CpuOpsTest, BatchNormAndItsGradientsMatchNaive) {
  for (const int64_t r : {GetParam(), int64_t{1}}) {
    const int64_t n = 3, c = 4, total = n * c * r, count = n * r;
    const auto x = randomVector(21, total, -2, 3), gamma = randomVector(22, c),
               beta = randomVector(23, c), dy = randomVector(24, total);
    const float eps = 1e-5f;
    std::vector<float> got[2][5];
    int slot = 0;
    for (cpu::CpuBackend* be : {&one_, &three_}) {
      Tensor xt = toDevice(*be, {n, c, r}, x), gt = toDevice(*be, {c}, gamma),
             bt = toDevice(*be, {c}, beta);
      Tensor y = be->empty({n, c, r}), mean = be->empty({c}), var = be->empty({c});
      Tensor dx = be->empty({n, c, r}), dg = be->zeros({c}), db = be->zeros({c});
      be->batchNorm(xt, gt, bt, eps, true, mean, var, y);
      be->batchNormBackward(toDevice(*be, {n, c, r}, dy), xt, gt, mean, var, eps, dx, dg, db);
      got[slot][0] = toHost(y), got[slot][1] = toHost(mean), got[slot][2] = toHost(var);
      got[slot][3] = toHost(dx), got[slot][4] = toHost(dg);
      ++slot;
    }
    for (int i = 0; i < 5; ++i) EXPECT_EQ(got[0][i], got[1][i]) << "output " << i;
    const auto at = [&](int64_t s, int64_t ch, int64_t p) { return (s * c + ch) * r + p; };
    for (int64_t ch = 0; ch < c; ++ch) {
      double mu = 0, v = 0, sg = 0, sgx = 0;
      for (int64_t s = 0; s < n; ++s)
        for (int64_t p = 0; p < r; ++p) mu += x[at(s, ch, p)] / static_cast<double>(count);
      for (int64_t s = 0; s < n; ++s)
        for (int64_t p = 0; p < r; ++p) v += std::pow(x[at(s, ch, p)] - mu, 2) / count;
      const double rs = 1 / std::sqrt(v + eps);
      EXPECT_NEAR(got[0][1][ch], mu, 1e-5);
      EXPECT_NEAR(got[0][2][ch], v, 1e-4);
      for (int64_t s = 0; s < n; ++s)
        for (int64_t p = 0; p < r; ++p) {
          sg += dy[at(s, ch, p)];
          sgx += dy[at(s, ch, p)] * (x[at(s, ch, p)] - mu) * rs;
        }
      EXPECT_NEAR(got[0][4][ch], sgx, 1e-3);
      for (int64_t s = 0; s < n; ++s)
        for (int64_t p = 0; p < r; ++p) {
          const size_t i = static_cast<size_t>(at(s, ch, p));
          const double xhat = (x[i] - mu) * rs;
          EXPECT_NEAR(got[0][0][i], xhat * gamma[ch] + beta[ch], 1e-4);
          EXPECT_NEAR(got[0][3][i], gamma[ch] * rs * (dy[i] - sg / count - xhat * sgx / count),
                      2e-3);
        }
    }
    // Running statistics: read, not written.
    const std::vector<float> rm = {0.5f, -1.0f, 0.0f, 2.0f}, rv = {1.0f, 0.25f, 4.0f, 2.0f};
    Tensor mean = toDevice(one_, {c}, rm), var = toDevice(one_, {c}, rv), y = one_.empty({n, c, r});
    one_.batchNorm(toDevice(one_, {n, c, r}, x), toDevice(one_, {c}, gamma),
                   toDevice(one_, {c}, beta), eps, false, mean, var, y);
    EXPECT_EQ(toHost(mean), rm);
    EXPECT_EQ(toHost(var), rv);
    const auto yv = toHost(y);
    for (int64_t i = 0; i < total; ++i) {
      const int64_t ch = (i / r) % c;
      EXPECT_NEAR(yv[i], (x[i] - rm[ch]) / std::sqrt(rv[ch] + eps) * gamma[ch] + beta[ch], 1e-4);
    }
  }
  EXPECT_THROW(one_.batchNorm(one_.zeros({2, 3}), one_.zeros({4}), one_.zeros({4}), 1e-5f, true,
                              one_.zeros({4}), one_.zeros({4}), one_.zeros({2, 3})),
               InvalidArgument);
}

// Rotation by (pos * inv_freq) of the first two of three heads' pairs (i, i + S/2),
// against rotate_half written out; the third head untouched (in place); the inverse
// undoes it; threads do not change a bit.
TEST_P(CpuOpsTest, RopeRotatesPairsAsRotateHalf) {
  const int64_t half = GetParam(), size = 2 * half, rows = 5, heads = 3, rotated = 2;
  const auto x = randomVector(16, rows * heads * size);
  const std::vector<int32_t> pos = {0, 3, 4, 100, 2047};
  std::vector<float> freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    freq[static_cast<size_t>(i)] = std::pow(500000.0f, -2.0f * static_cast<float>(i) / size);
  std::vector<float> outs[2];
  int which = 0;
  for (cpu::CpuBackend* be : {&one_, &three_}) {
    Tensor y = toDevice(*be, {rows, heads, size}, x);
    be->rope(y, toDeviceI32(*be, {rows}, pos), toDevice(*be, {half}, freq), rotated, false, y);
    outs[which++] = toHost(y);
  }
  EXPECT_EQ(outs[0], outs[1]);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double a =
            h < rotated ? static_cast<float>(pos[static_cast<size_t>(r)]) * freq[i] : 0;
        const int64_t at = (r * heads + h) * size + i;
        EXPECT_NEAR(outs[0][at], x[at] * std::cos(a) - x[at + half] * std::sin(a), 1e-5);
        EXPECT_NEAR(outs[0][at + half], x[at + half] * std::cos(a) + x[at] * std::sin(a), 1e-5);
      }
  Tensor y = toDevice(one_, {rows, heads, size}, outs[0]);
  one_.rope(y, toDeviceI32(one_, {rows}, pos), toDevice(one_, {half}, freq), rotated, true, y);
  const auto back = toHost(y);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-5);
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        one_.rope(one_.empty({rows, heads, size + 1}), toDeviceI32(one_, {rows}, pos),
                  toDevice(one_, {half}, freq), 1, false, one_.empty({rows, heads, size + 1}));
      },
      {"cpu rope", "rows of heads of"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        one_.rope(y, toDeviceI32(one_, {rows}, pos), toDevice(one_, {half}, freq), 4, false, y);
      },
      {"cpu rope", "cannot rotate 4 of 3 heads"});
}

TEST_P(CpuOpsTest, EmbeddingGathersAndScatters) {
  const int64_t d = GetParam(), vocab = 5;
  const auto table = randomVector(16, vocab * d);
  const std::vector<int32_t> ids = {3, 0, 3, 4};
  Tensor idt = toDeviceI32(one_, {4}, ids), y = one_.empty({4, d});
  one_.embedding(idt, toDevice(one_, {vocab, d}, table), y);
  const auto yv = toHost(y);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t j = 0; j < d; ++j) ASSERT_EQ(yv[i * d + j], table[ids[i] * d + j]);
  Tensor dt = one_.zeros({vocab, d});
  const auto dy = randomVector(17, 4 * d);
  one_.embeddingBackward(idt, toDevice(one_, {4, d}, dy), dt);
  const auto g = toHost(dt);
  for (int64_t j = 0; j < d; ++j) {
    EXPECT_FLOAT_EQ(g[3 * d + j], dy[0 * d + j] + dy[2 * d + j]);
    EXPECT_FLOAT_EQ(g[0 * d + j], dy[1 * d + j]);
    EXPECT_FLOAT_EQ(g[1 * d + j], 0.0f);
  }
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        one_.embedding(toDeviceI32(one_, {1}, {5}), toDevice(one_, {vocab, d}, table),
                       one_.empty({1, d}));
      },
      {"embedding id 5", "[0, 5)"});
}

TEST_P(CpuOpsTest, SgdAndAdamWMatchScalarFormulas) {
  const int64_t n = GetParam();
  const auto w0 = randomVector(18, n), g = randomVector(19, n);
  // SGD, Nesterov, weight decay: two steps.
  Tensor w = toDevice(one_, {n}, w0), gt = toDevice(one_, {n}, g), v = one_.zeros({n});
  const SgdStep s{0.1f, 0.9f, 0.01f, true};
  one_.sgdStep(w, gt, v, s);
  one_.sgdStep(w, gt, v, s);
  const auto wv = toHost(w);
  for (int64_t i = 0; i < n; ++i) {
    float wi = w0[i], vi = 0;
    for (int k = 0; k < 2; ++k) {
      const float d = g[i] + 0.01f * wi;
      vi = 0.9f * vi + d;
      wi -= 0.1f * (d + 0.9f * vi);
    }
    EXPECT_NEAR(wv[i], wi, 1e-6);
  }
  // Plain momentum, no decay: v = 0.9 v + g; w -= 0.1 v.
  Tensor wm = toDevice(one_, {n}, w0), vm = one_.zeros({n});
  for (int k = 0; k < 2; ++k) one_.sgdStep(wm, gt, vm, SgdStep{0.1f, 0.9f, 0.0f, false});
  const auto wmv = toHost(wm);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(wmv[i], w0[i] - 0.1f * g[i] - 0.1f * 1.9f * g[i], 1e-6);
  // No momentum: no velocity tensor needed.
  Tensor wp = toDevice(one_, {n}, w0);
  one_.sgdStep(wp, gt, Tensor(), SgdStep{0.5f, 0.0f, 0.0f, false});
  const auto wpv = toHost(wp);
  for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(wpv[i], w0[i] - 0.5f * g[i]);
  // AdamW: three steps.
  Tensor w2 = toDevice(one_, {n}, w0), m = one_.zeros({n}), vv = one_.zeros({n});
  for (int64_t step = 1; step <= 3; ++step)
    one_.adamwStep(w2, gt, m, vv, AdamWStep{0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, step});
  const auto a = toHost(w2);
  for (int64_t i = 0; i < n; ++i) {
    double wi = w0[i], mi = 0, vi = 0;
    for (int step = 1; step <= 3; ++step) {
      wi -= 0.01 * 0.1 * wi;
      mi = 0.9 * mi + 0.1 * g[i];
      vi = 0.999 * vi + 0.001 * g[i] * g[i];
      wi -= 0.01 * (mi / (1 - std::pow(0.9, step))) /
            (std::sqrt(vi / (1 - std::pow(0.999, step))) + 1e-8);
    }
    EXPECT_NEAR(a[i], wi, 1e-5);
  }
}

TEST_P(CpuOpsTest, ConvertRoundTripsThroughHalfBFloatAndInt) {
  const int64_t n = GetParam();
  const auto x = randomVector(20, n, -100, 100);
  Tensor xt = toDevice(one_, {n}, x);
  for (DType t : {DType::kF16, DType::kBF16}) {
    Tensor h = one_.empty({n}, t), back = one_.empty({n});
    one_.convert(xt, h);
    one_.convert(h, back);
    const auto b = toHost(back);
    const float rel = t == DType::kF16 ? 1.0f / 2048 : 1.0f / 256;  // half an ulp
    for (int64_t i = 0; i < n; ++i) EXPECT_LE(std::abs(b[i] - x[i]), rel * std::abs(x[i])) << i;
  }
  Tensor it = one_.empty({n}, DType::kI32);
  one_.convert(xt, it);
  const auto iv = toHostI32(it);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(iv[i], static_cast<int32_t>(std::lrint(x[i])));
  EXPECT_THROW(one_.convert(xt, one_.empty({n}, DType::kI8)), Unsupported);
}

TEST(CpuBackendTest, InfoDescribesTheHost) {
  cpu::CpuBackend be(cpu::CpuOptions{2});
  const DeviceInfo d = be.info();
  EXPECT_EQ(d.name, "cpu");
  EXPECT_GT(d.memory_bytes, 0);
  EXPECT_GT(d.compute_units, 0);
  EXPECT_EQ(be.threads(), 2);
  EXPECT_THROW(cpu::CpuBackend(cpu::CpuOptions{0}), InvalidArgument);
}

TEST(CpuBackendTest, FreedBuffersAreReused) {
  cpu::CpuBackend be;
  const void* first = be.data(be.empty({1000}));
  const void* second = be.data(be.empty({1000}));
  EXPECT_EQ(first, second);
}

}  // namespace
}  // namespace tandem
