// The CPU backend's exp and erf (backends/cpu/fast_math.h) against libm in double, over
// their whole range: the bounds fast_math.h states.
#include "backends/cpu/fast_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace tandem::cpu {
namespace {

TEST(FastMathTest, ExpIsWithinItsStatedRelativeErrorOverItsRange) {
  double worst = 0;
  float at = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.0007f) {
    const double want = std::exp(static_cast<double>(x));
    const double err = std::fabs(expApprox(x) - want) / want;
    if (err > worst) {
      worst = err;
      at = x;
    }
  }
  EXPECT_LE(worst, 2e-7) << "at x = " << at;
  EXPECT_EQ(expApprox(0.0f), 1.0f);
  // Beyond the range it is clamped, never infinite, zero or NaN.
  EXPECT_EQ(expApprox(-1000.0f), expApprox(-87.0f));
  EXPECT_EQ(expApprox(1000.0f), expApprox(88.0f));
  EXPECT_TRUE(std::isfinite(expApprox(std::numeric_limits<float>::infinity())));
  EXPECT_GT(expApprox(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(expApprox(std::nanf("")), expApprox(-87.0f));
}

TEST(FastMathTest, ErfIsWithinItsStatedAbsoluteErrorAndOdd) {
  double worst = 0;
  float at = 0;
  for (float x = -12.0f; x <= 12.0f; x += 0.0001f) {
    const double err = std::fabs(erfApprox(x) - std::erf(static_cast<double>(x)));
    if (err > worst) {
      worst = err;
      at = x;
    }
    ASSERT_EQ(erfApprox(-x), -erfApprox(x)) << x;
  }
  EXPECT_LE(worst, 4e-7) << "at x = " << at;
  EXPECT_EQ(erfApprox(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(erfApprox(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_EQ(erfApprox(1e30f), 1.0f);
  EXPECT_TRUE(std::isnan(erfApprox(std::nanf(""))));
}

TEST(FastMathTest, AGeluFromItIsWithinItsBoundOfTheExactOne) {
  double worst = 0;
  float at = 0;
  for (float x = -12.0f; x <= 12.0f; x += 0.0001f) {
    const double want = 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    const float got = 0.5f * x * (1.0f + erfApprox(x * 0.70710678118654752f));
    const double err = std::fabs(got - want) / std::fmax(1.0, std::fabs(x));
    if (err > worst) {
      worst = err;
      at = x;
    }
  }
  EXPECT_LE(worst, 2e-7) << "at x = " << at;
}

}  // namespace
}  // namespace tandem::cpu
