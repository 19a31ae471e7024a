// Splitting a batch into microbatches (or replicas' shares), and each microbatch's dropout
// seed. Single-device gradient accumulation (Trainer) and the pipeline share these, and
// must: a pipeline is bitwise equal to accumulation only if both cut and seed
// microbatches the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/random.h"

namespace tandem {

struct MicrobatchSlice {
  int64_t offset = 0, count = 0;  // samples of the batch
};

// Consecutive slices of these sizes, from sample 0.
inline std::vector<MicrobatchSlice> slicesOf(const std::vector<int64_t>& counts) {
  std::vector<MicrobatchSlice> out;
  int64_t offset = 0;
  for (const int64_t count : counts) {
    out.push_back({offset, count});
    offset += count;
  }
  return out;
}

// n samples into min(m, n) microbatches whose sizes differ by at most one, larger first.
inline std::vector<MicrobatchSlice> splitBatch(int64_t n, int64_t m) {
  const int64_t parts = std::max<int64_t>(1, std::min(m, n));
  std::vector<int64_t> counts;
  for (int64_t k = 0; k < parts; ++k) counts.push_back(n / parts + (k < n % parts ? 1 : 0));
  return slicesOf(counts);
}

// Samples of an n-sample batch per replica: in proportion to `shares` (largest
// remainders get the leftover samples, lower replica first on ties), or equal when
// `shares` is empty (splitBatch's sizes). Sums to n.
std::vector<int64_t> shareBatch(int64_t n, size_t replicas, const std::vector<double>& shares);

// n samples into min(m, n) microbatches for a pipeline stage whose R = shares.size()
// replicas take the microbatches in turn (global microbatch g runs on replica g mod R,
// StageExecutor): the step's samples go to the replicas in proportion to their shares,
// each replica's part in equal microbatches (microbatch k, global number first + k, is
// replica (first + k) mod R's; shareBatch over the microbatches, each at least one
// sample), so an unequal replica's work is its share of every step. Empty `shares`:
// splitBatch(n, m). InvalidArgument for a share that is negative, not finite, or all zero.
std::vector<MicrobatchSlice> splitBatch(int64_t n, int64_t m, const std::vector<double>& shares,
                                        int64_t first);

// Unequal replicas' shares as one step measured them: each replica's samples in `slices`
// (microbatch k, global number first + k, is replica (first + k) mod R's, R =
// seconds.size()) over its `seconds` of forward and backward in that step, as fractions
// that sum to 1 — the shares under which the replicas would have taken equally long, were
// each one's time in proportion to its samples. Empty when a replica took no sample or
// no time: nothing can be compared.
std::vector<double> measuredShares(const std::vector<MicrobatchSlice>& slices, int64_t first,
                                   const std::vector<double>& seconds);

// Several steps' measured shares (each as measuredShares gives them, as many replicas
// each) as one: each replica's median over the steps, the medians scaled to sum to 1. A
// step whose time a quota period or another process stretched moves none of them.
std::vector<double> medianShares(const std::vector<std::vector<double>>& steps);

// The forward seed of microbatch k in global step `step` (dropout masks).
inline uint64_t microbatchSeed(uint64_t seed, int64_t step, int64_t k) {
  return combineSeeds(combineSeeds(seed, static_cast<uint64_t>(step)), static_cast<uint64_t>(k));
}

}  // namespace tandem
