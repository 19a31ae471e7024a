// gemmQ8 on the CPU against a naive product with the weights dequantized, on odd shapes:
// 1 to 5 rows (the direct kernel's 4-, 2- and 1-row blocks), 15 to 33 (around the panel
// path's start), inputs of 7, 13, 127 and 256 with groups that divide them (vector
// tails inside groups), 1 and 3 threads bitwise equal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/quantize.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::expectThrowWith;
using testing::randomVector;

struct Q8Case {
  int64_t m, n, k, group;
};

// y = x dequant(w)^T in double.
std::vector<double> naive(const std::vector<float>& x, const QuantizedRows& q, int64_t m) {
  const std::vector<float> w = dequantizeRows(q);
  std::vector<double> y(static_cast<size_t>(m * q.rows));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < q.rows; ++j) {
      double s = 0;
      for (int64_t p = 0; p < q.cols; ++p)
        s += static_cast<double>(x[static_cast<size_t>(i * q.cols + p)]) *
             w[static_cast<size_t>(j * q.cols + p)];
      y[static_cast<size_t>(i * q.rows + j)] = s;
    }
  return y;
}

std::vector<float> run(cpu::CpuBackend& be, const std::vector<float>& x, const QuantizedRows& q,
                       int64_t m) {
  Tensor xt = toDevice(be, {m, q.cols}, x);
  Tensor wt = be.empty({q.rows, q.cols}, DType::kI8);
  be.upload(wt, q.values.data());
  Tensor st = toDevice(be, {q.rows, q.cols / q.group}, q.scales);
  Tensor yt = toDevice(be, {m, q.rows}, randomVector(9, m * q.rows));  // overwritten
  be.gemmQ8(xt, wt, st, yt);
  return toHost(yt);
}

TEST(CpuQuantizedTest, GemmQ8MatchesTheDequantizedProduct) {
  cpu::CpuBackend one{cpu::CpuOptions{1}};
  cpu::CpuBackend three{cpu::CpuOptions{3}};
  const std::vector<Q8Case> cases = {{1, 1, 7, 7},      {1, 13, 13, 13},    {2, 7, 127, 127},
                                     {3, 5, 256, 64},   {4, 9, 256, 16},    {5, 13, 256, 8},
                                     {15, 7, 127, 127}, {16, 33, 64, 32},   {17, 40, 256, 256},
                                     {33, 70, 13, 13},  {5, 130, 1024, 128}};
  for (const Q8Case& c : cases) {
    SCOPED_TRACE("m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " k " +
                 std::to_string(c.k) + " group " + std::to_string(c.group));
    const QuantizedRows q =
        quantizeRows(randomVector(1, c.n * c.k), c.n, c.k, c.group, "test weights");
    const std::vector<float> x = randomVector(2, c.m * c.k);
    const std::vector<double> want = naive(x, q, c.m);
    const std::vector<float> got = run(one, x, q, c.m);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]) + std::sqrt(c.k))) << i;
    EXPECT_EQ(run(three, x, q, c.m), got);  // each output summed whole by one thread
  }
}

TEST(CpuQuantizedTest, GemmQ8RefusesMismatchedOperands) {
  cpu::CpuBackend be;
  Tensor x = be.zeros({2, 8});
  Tensor w = be.empty({3, 8}, DType::kI8);
  Tensor y = be.zeros({2, 3});
  expectThrowWith<InvalidArgument>(
      [&] {
        be.gemmQ8(x, w, be.zeros({3, 3}), y);
      },
      {"cpu gemmQ8", "scales [3, 3]", "scales [N, K / group]"});
  expectThrowWith<InvalidArgument>(
      [&] {
        be.gemmQ8(x, be.zeros({3, 8}), be.zeros({3, 1}), y);
      },
      {"cpu gemmQ8", "expects x f32, w i8", "got f32, f32"});
  expectThrowWith<InvalidArgument>(
      [&] {
        be.gemmQ8(x, w, be.zeros({3, 2}), be.zeros({2, 4}));
      },
      {"y [2, 4]"});
  EXPECT_TRUE(be.supports(Op::kGemmQ8, DType::kI8));
  EXPECT_FALSE(be.supports(Op::kGemmQ8, DType::kF32));
}

TEST(QuantizeTest, RowsRoundToTheirGroupsScale) {
  // Group [0.5, -1.27, 0, 0.01]: scale 0.01, so -1.27 is -127 and 0.5 is 50.
  const std::vector<float> w = {0.5f, -1.27f, 0.0f, 0.01f, 0.0f, 0.0f, 0.0f, 0.0f};
  const QuantizedRows q = quantizeRows(w, 2, 4, 4, "w");
  EXPECT_EQ(q.values, (std::vector<int8_t>{50, -127, 0, 1, 0, 0, 0, 0}));
  ASSERT_EQ(q.scales.size(), 2u);
  EXPECT_FLOAT_EQ(q.scales[0], 0.01f);
  EXPECT_EQ(q.scales[1], 0.0f);  // a group of zeros stays zeros
  // Every value within half a step of its group's scale.
  const std::vector<float> big = randomVector(3, 6 * 64, -3.0f, 3.0f);
  const QuantizedRows g = quantizeRows(big, 6, 64, 16, "big");
  const std::vector<float> back = dequantizeRows(g);
  for (size_t i = 0; i < big.size(); ++i)
    EXPECT_LE(std::abs(back[i] - big[i]), 0.5f * g.scales[i / 16] * 1.0001f) << i;
  expectThrowWith<InvalidArgument>([&] { quantizeRows(big, 6, 64, 24, "big"); },
                                   {"big", "group of 24 does not divide its 64 inputs"});
  std::vector<float> nan = w;
  nan[5] = std::nanf("");
  expectThrowWith<InvalidArgument>([&] { quantizeRows(nan, 2, 4, 2, "w"); },
                                   {"w: weight [1, 1] is nan"});
}

}  // namespace
}  // namespace tandem
