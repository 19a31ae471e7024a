// Deterministic, platform-independent random numbers.
//
// std:: distributions differ between standard libraries, so seeded initialisation and
// shuffling use these instead: same seed, bitwise the same numbers everywhere. The
// counter-based form (hashUniform) lets every backend draw identical dropout masks.
#pragma once

#include <cmath>
#include <cstdint>

namespace tandem {

// SplitMix64 finaliser: a bijective 64-bit mix.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 24 bits, from a (seed, counter) pair.
inline float hashUniform(uint64_t seed, uint64_t counter) {
  return static_cast<float>(mix64(seed ^ mix64(counter)) >> 40) * (1.0f / 16777216.0f);
}

// Combines seeds, e.g. (run seed, step, microbatch) -> one seed.
inline uint64_t combineSeeds(uint64_t a, uint64_t b) {
  return mix64(a ^ (mix64(b) + 0x632be59bd9b4e019ull));
}

// Sequential generator (a SplitMix64 stream), enough for initialisation and shuffling.
class Rng {
 public:
  static constexpr uint64_t kStep = 0x9e3779b97f4a7c15ull;
  explicit Rng(uint64_t seed) : state_(seed) {}
  // The seed whose generator draws what Rng(seed) draws after `draws` calls of next():
  // a stream taken up where it was (a sampled sequence resumed on other workers).
  static uint64_t seedAfter(uint64_t seed, uint64_t draws) { return seed + draws * kStep; }
  uint64_t next() {
    state_ += kStep;
    return mix64(state_);
  }
  // Uniform in [0, 1) with 24 bits of mantissa.
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n), n > 0 (modulo bias below 2^-40 for n < 2^24).
  uint64_t below(uint64_t n) { return next() % n; }
  // Standard normal by Box-Muller, computed in double for platform stability.
  float normal() {
    double u1 = (static_cast<double>(next() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  uint64_t state_;
};

}  // namespace tandem
