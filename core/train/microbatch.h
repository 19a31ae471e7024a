// Splitting a batch into microbatches, and each microbatch's dropout seed. Single-device
// gradient accumulation (Trainer) and the pipeline share these, and must: a pipeline is
// bitwise equal to accumulation only if both cut and seed microbatches the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/random.h"

namespace tandem {

struct MicrobatchSlice {
  int64_t offset = 0, count = 0;  // samples of the batch
};

// n samples into min(m, n) microbatches whose sizes differ by at most one, larger first.
inline std::vector<MicrobatchSlice> splitBatch(int64_t n, int64_t m) {
  const int64_t parts = std::max<int64_t>(1, std::min(m, n));
  std::vector<MicrobatchSlice> out;
  int64_t offset = 0;
  for (int64_t k = 0; k < parts; ++k) {
    const int64_t count = n / parts + (k < n % parts ? 1 : 0);
    out.push_back({offset, count});
    offset += count;
  }
  return out;
}

// The forward seed of microbatch k in global step `step` (dropout masks).
inline uint64_t microbatchSeed(uint64_t seed, int64_t step, int64_t k) {
  return combineSeeds(combineSeeds(seed, static_cast<uint64_t>(step)), static_cast<uint64_t>(k));
}

}  // namespace tandem
