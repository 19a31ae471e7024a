#include "core/train/microbatch.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace tandem {

std::vector<int64_t> shareBatch(int64_t n, size_t replicas, const std::vector<double>& shares) {
  TANDEM_CHECK_MSG(replicas >= 1, InvalidArgument, "data parallel needs a replica");
  TANDEM_CHECK_MSG(shares.empty() || shares.size() == replicas, InvalidArgument,
                   shares.size() << " shares for " << replicas << " replicas");
  std::vector<int64_t> counts(replicas, 0);
  if (shares.empty()) {
    for (size_t r = 0; r < replicas; ++r)
      counts[r] = n / static_cast<int64_t>(replicas) +
                  (static_cast<int64_t>(r) < n % static_cast<int64_t>(replicas) ? 1 : 0);
    return counts;
  }
  double largest = 0;
  for (double s : shares) {
    TANDEM_CHECK_MSG(s >= 0 && std::isfinite(s), InvalidArgument,
                     "a replica's share must be a non-negative number, got " << s);
    largest = std::max(largest, s);
  }
  TANDEM_CHECK_MSG(largest > 0, InvalidArgument, "the replicas' shares add up to 0");
  // As fractions of the largest, so that neither their sum nor n times one overflows
  // (shares of 1e308 each are as good as shares of 1).
  double total = 0;
  for (double s : shares) total += s / largest;
  std::vector<double> remainder(replicas);
  int64_t given = 0;
  for (size_t r = 0; r < replicas; ++r) {
    const double exact = static_cast<double>(n) * (shares[r] / largest / total);
    counts[r] = static_cast<int64_t>(exact);
    remainder[r] = exact - static_cast<double>(counts[r]);
    given += counts[r];
  }
  std::vector<size_t> order(replicas);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return remainder[a] > remainder[b]; });
  for (size_t i = 0; given < n; ++i, ++given) ++counts[order[i % replicas]];
  return counts;
}

std::vector<MicrobatchSlice> splitBatch(int64_t n, int64_t m, const std::vector<double>& shares,
                                        int64_t first) {
  if (shares.empty()) return splitBatch(n, m);
  TANDEM_CHECK_MSG(first >= 0, InvalidArgument, "microbatch " << first << " is negative");
  const int64_t parts = std::max<int64_t>(1, std::min(m, n));
  const auto replicas = static_cast<int64_t>(shares.size());
  // Each replica's share of the step, over as many microbatches as it takes this step.
  std::vector<int64_t> taken(shares.size(), 0);
  for (int64_t k = 0; k < parts; ++k) ++taken[static_cast<size_t>((first + k) % replicas)];
  std::vector<double> weights;
  for (int64_t k = 0; k < parts; ++k) {
    const auto r = static_cast<size_t>((first + k) % replicas);
    weights.push_back(shares[r] / static_cast<double>(taken[r]));
  }
  std::vector<int64_t> counts = shareBatch(n, static_cast<size_t>(parts), weights);
  // A share so small that its microbatch got no sample takes one from the largest (n >=
  // parts, so there is one to give).
  for (int64_t& c : counts)
    if (c == 0) {
      --*std::max_element(counts.begin(), counts.end());
      c = 1;
    }
  return slicesOf(counts);
}

std::vector<double> measuredShares(const std::vector<MicrobatchSlice>& slices, int64_t first,
                                   const std::vector<double>& seconds) {
  const auto replicas = static_cast<int64_t>(seconds.size());
  TANDEM_CHECK_MSG(replicas >= 1 && first >= 0, InvalidArgument,
                   "measured shares need a replica's time and microbatch " << first << " >= 0");
  std::vector<double> samples(seconds.size(), 0);
  for (size_t k = 0; k < slices.size(); ++k)
    samples[static_cast<size_t>((first + static_cast<int64_t>(k)) % replicas)] +=
        static_cast<double>(slices[k].count);
  std::vector<double> rates;
  double total = 0;
  for (size_t r = 0; r < seconds.size(); ++r) {
    if (!(samples[r] > 0 && seconds[r] > 0 && std::isfinite(seconds[r]))) return {};
    rates.push_back(samples[r] / seconds[r]);
    total += rates.back();
  }
  for (double& x : rates) x /= total;
  return rates;
}

std::vector<double> medianShares(const std::vector<std::vector<double>>& steps) {
  TANDEM_CHECK_MSG(!steps.empty(), InvalidArgument, "the median of no step's shares");
  const size_t replicas = steps.front().size();
  std::vector<double> out;
  double total = 0;
  for (size_t r = 0; r < replicas; ++r) {
    std::vector<double> v;
    for (const std::vector<double>& s : steps) {
      TANDEM_CHECK_MSG(s.size() == replicas, InvalidArgument,
                       "measured shares for " << s.size() << " and " << replicas << " replicas");
      v.push_back(s[r]);
    }
    std::sort(v.begin(), v.end());
    const size_t h = v.size() / 2;
    out.push_back(v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2);
    total += out.back();
  }
  for (double& x : out) x /= total;
  return out;
}

}  // namespace tandem
