// Helpers shared by the tests: seeded random data and a CPU backend.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/random.h"

namespace tandem::testing {

inline std::vector<float> randomVector(uint64_t seed, int64_t n, float lo = -1.0f,
                                       float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}

// Expects that `fn` throws ErrorType whose message contains every one of `parts`.
template <typename ErrorType, typename Fn>
void expectThrowWith(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an exception";
  } catch (const ErrorType& e) {
    const std::string what = e.what();
    for (const auto& p : parts)
      EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

}  // namespace tandem::testing
