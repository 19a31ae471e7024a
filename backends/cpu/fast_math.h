// exp and erf in plain float arithmetic that the compiler vectorises (no libm call per
// element), for the CPU backend's activations and softmax. Accuracy, checked over their
// whole range by tests/backends/cpu/fast_math_test.cpp: expApprox within 2e-7 relative
// (measured 1.0e-7), erfApprox within 4e-7 absolute (measured 3.1e-7; libm's erff is
// within about 1e-7), so a GELU from erfApprox is within 2e-7 max(1, |x|) of the exact one.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace tandem::cpu {

// e^x, x clamped to [-87, 88] (a NaN taken as -87): x = n ln2 + r with |r| <= ln2 / 2,
// e^r by its Taylor series to r^7 / 7!, and 2^n written into the exponent bits.
inline float expApprox(float x) {
  x = x > -87.0f ? x : -87.0f;  // (NaN fails the comparison: no NaN reaches the cast)
  x = x < 88.0f ? x : 88.0f;
  // n = round(x / ln 2): adding 1.5 * 2^23 leaves no bits below the units (std::floor
  // would not vectorise).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  // ln 2 in two parts: n * the first is exact, so r keeps its low bits.
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const auto exponent = static_cast<int32_t>(n) + 127;  // in [1, 254]: a normal power of 2
  return p * std::bit_cast<float>(static_cast<uint32_t>(exponent) << 23);
}

// erf(x) = sign(x) (1 - e^(-x^2) R(t)) with t = 1 / (1 + |x| / 2) and R(t) = sum c_k t^k
// (k = 1..7), its coefficients fitted by weighted least squares to erfc(x) e^(x^2) over
// [0, 12] (in double, for this file). A NaN stays NaN.
inline float erfApprox(float x) {
  const float a = std::fabs(x);
  const float t = 1.0f / (1.0f + 0.5f * a);
  float r = 6.296581775e-02f;
  r = r * t - 2.376824170e-01f;
  r = r * t + 1.597054154e-01f;
  r = r * t + 2.693778276e-01f;
  r = r * t + 1.526416689e-01f;
  r = r * t + 3.151429594e-01f;
  r = r * t + 2.778487504e-01f;
  r = r * t;
  return std::copysign(1.0f - r * expApprox(-a * a), x);
}

}  // namespace tandem::cpu
