// Helpers shared by the tests: seeded random data and a CPU backend.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <functional>
#include <stdexcept>
#include <thread>

#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/data/dataset.h"
#include "core/random.h"

namespace tandem::testing {

inline std::vector<float> randomVector(uint64_t seed, int64_t n, float lo = -1.0f,
                                       float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}

// n token ids in [0, vocab), seeded.
inline std::vector<int32_t> randomTokens(int64_t n, uint64_t seed, int64_t vocab = 256) {
  std::vector<int32_t> out;
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i)
    out.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
  return out;
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

// Runs fn(rank) on one thread per rank; returns each rank's exception (or null).
inline std::vector<std::exception_ptr> onThreads(int ranks, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  return errors;
}

// Fails the test with each rank's error, named by rank.
inline void expectNoErrors(const std::vector<std::exception_ptr>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  }
}

// Logits of decoding with the key/value cache against those of recomputing the whole
// prefix: the same to within 1e-5 (relative above 1). Not bitwise in general: the cached
// step multiplies one row per sequence where the recomputation multiplies the whole
// prefix, and OpenBLAS rounds a row of a short product differently from the same row of a
// long one with some kernels (its Haswell sgemm kernels, which OPENBLAS_CORETYPE=Haswell
// selects on any AVX2 machine). Tokens are compared apart.
inline void expectCloseLogits(const std::vector<float>& cached, const std::vector<float>& full,
                              const std::string& what) {
  ASSERT_EQ(cached.size(), full.size()) << what;
  for (size_t v = 0; v < full.size(); ++v)
    ASSERT_NEAR(cached[v], full[v], 1e-5 * std::max(1.0f, std::abs(full[v])))
        << what << ", logit " << v;
}

// Every element of `got` within tol * (1 + |want|) of `want`'s, sizes equal; `what` names
// the tensor in a failure.
inline void expectCloseAll(const std::vector<float>& got, const std::vector<float>& want, float tol,
                           const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " element " << i;
}

// A new, empty directory under the test temp dir (mkdtemp): unique even when a later test
// process gets the same pid as an earlier one, whose files would still be there.
// Whether this test runs under qemu-user (a cross build's ctest sets TANDEM_TEST_EMULATED,
// tests/CMakeLists.txt): such a process cannot execute a program of its own architecture.
inline bool emulated() { return std::getenv("TANDEM_TEST_EMULATED") != nullptr; }

inline std::string freshDir(const std::string& prefix) {
  std::string path = ::testing::TempDir() + "/" + prefix + "-XXXXXX";
  if (!mkdtemp(path.data())) throw std::runtime_error("mkdtemp failed for " + path);
  return path;
}

// A small classifier for quadrants(): conv, pooling, dropout, GELU and LayerNorm, so
// every kind of stashed state is exercised (and crosses a pipeline cut).
inline constexpr const char* kTinyNet = R"(name: tiny
input: [1, 8, 8]
layers:
  - conv2d: {out: 4, kernel: 3, padding: 1}
  - relu
  - maxpool2d: {kernel: 2}
  - flatten
  - dropout: {p: 0.2}
  - linear: {out: 16}
  - gelu
  - layernorm
  - linear: {out: 4}
)";

// A synthetic 4-class problem: the class is the brightest quadrant of an 8x8 image.
inline Dataset quadrants(int64_t n, uint64_t seed) {
  Dataset d;
  d.name = "quadrants";
  d.sample_shape = Shape{1, 8, 8};
  d.classes = 4;
  d.mean = 0.5f;
  d.stddev = 0.3f;
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    const int c = static_cast<int>(rng.below(4));
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 8; ++x) {
        const bool hot = (y / 4) * 2 + (x / 4) == c;
        d.images.push_back(static_cast<uint8_t>(rng.below(128) + (hot ? 110 : 0)));
      }
    d.labels.push_back(c);
  }
  return d;
}

// A GPT small enough for unit tests: byte tokens, context 8, one block of width 16.
inline constexpr const char* kTinyGpt = R"(name: tiny-gpt
input: [8]
layers:
  - embedding: {vocab: 256, dim: 16}
  - positional: {context: 8}
  - transformer: {heads: 2, mlp: 32}
  - layernorm
  - linear: {out: 256}
)";

// Text as loadText makes it, in memory: n windows of `context` bytes of a repeating
// phrase at seeded starts, each token labelled with the next byte.
inline Dataset phrases(int64_t n, int64_t context, uint64_t seed) {
  const std::string text = "the cat sat on the mat. ";
  Dataset d;
  d.name = "phrases";
  d.sample_shape = Shape{context};
  d.labels_per_sample = context;
  d.tokens = true;
  d.classes = 256;
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    const auto start = static_cast<size_t>(rng.below(text.size()));
    for (int64_t j = 0; j < context; ++j) {
      d.ids.push_back(static_cast<unsigned char>(text[(start + j) % text.size()]));
      d.labels.push_back(static_cast<unsigned char>(text[(start + j + 1) % text.size()]));
    }
  }
  return d;
}

}  // namespace tandem::testing
