// The exact search (search.h): memoised recursion over
//   F(i, c, u, r) = the best objective for layers [i, L) on exactly the devices counted
//                   by c (per type), whose first stage runs on type u, in r stages.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "partitioner/search.h"

namespace tandem::partitioner {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

class Exact {
 public:
  Exact(const CostModel& cost, double bound) : cost_(cost), bound_(bound) {
    const auto& types = cost.types();
    T_ = static_cast<int>(types.size());
    L_ = cost.layers();
    D_ = static_cast<int>(cost.problem().devices.size());
    replicate_ = cost.options().max_replicas > 1 && cost.training();
    tensor_ =
        cost.options().max_tensor > 1 && cost.training() && !cost.problem().tensor_roles.empty();
    latency_ = cost.options().objective == Objective::kInferLatency;
    radix_.resize(static_cast<size_t>(T_));
    combos_ = 1;
    for (int t = 0; t < T_; ++t) {
      radix_[static_cast<size_t>(t)] = combos_;
      combos_ *= types[static_cast<size_t>(t)].devices.size() + 1;
    }
    r_dim_ = replicate_ || tensor_ ? static_cast<size_t>(D_) : 1;
    memo_.assign(L_ * combos_ * static_cast<size_t>(T_) * r_dim_, Entry{});
  }

  Plan solve() {
    double best = bound_;
    struct Top {
      size_t c = 0;
      int u = -1, r = 0;
    } top;
    std::vector<int> count(static_cast<size_t>(T_), 0);
    for (size_t c = 1; c < combos_; ++c) {
      decode(c, count);
      const int devices = std::accumulate(count.begin(), count.end(), 0);
      for (int u = 0; u < T_; ++u) {
        if (count[static_cast<size_t>(u)] == 0) continue;
        // A stage on several devices (replicas, tensor ranks) makes fewer stages than devices.
        const int r_lo = replicate_ || tensor_ ? 1 : devices, r_hi = devices;
        for (int r = r_lo; r <= r_hi; ++r) {
          const double head = latency_ ? cost_.sourceLink(u) : 0;
          if (head >= best) continue;
          const double v = head + value(0, c, u, r);
          if (v < best) {
            best = v;
            top = {c, u, r};
          }
        }
      }
    }
    Plan plan;
    if (top.u < 0) return plan;  // nothing beats the bound (or nothing fits)
    // Follow the choices, taking devices of each type in index order.
    std::vector<size_t> next_device(static_cast<size_t>(T_), 0);
    std::vector<Assignment> stages;
    size_t i = 0, c = top.c;
    int u = top.u, r = top.r;
    while (true) {
      const Entry& e = memo_[index(i, c, u, r)];
      Assignment a;
      a.begin = i;
      a.end = e.end;
      const auto& devs = cost_.types()[static_cast<size_t>(u)].devices;
      for (int k = 0; k < e.replicas; ++k)
        a.devices.push_back(devs[next_device[static_cast<size_t>(u)]++]);
      a.tensor = e.tensor;
      stages.push_back(std::move(a));
      if (e.end == L_) break;
      c -= static_cast<size_t>(e.replicas) * radix_[static_cast<size_t>(u)];
      i = e.end;
      u = e.next;
      r -= 1;
    }
    return evaluate(cost_, stages, "exact");
  }

 private:
  struct Entry {
    double value = std::numeric_limits<double>::quiet_NaN();
    uint32_t end = 0;
    int16_t replicas = 0, next = -1;  // replicas: the stage's devices (tensor ranks)
    bool tensor = false;
  };

  void decode(size_t c, std::vector<int>& count) const {
    for (int t = T_ - 1; t >= 0; --t) {
      count[static_cast<size_t>(t)] = static_cast<int>(c / radix_[static_cast<size_t>(t)]);
      c %= radix_[static_cast<size_t>(t)];
    }
  }
  int countOf(size_t c, int t) const {
    const size_t n = cost_.types()[static_cast<size_t>(t)].devices.size() + 1;
    return static_cast<int>(c / radix_[static_cast<size_t>(t)] % n);
  }
  size_t index(size_t i, size_t c, int u, int r) const {
    const size_t ri = replicate_ || tensor_ ? static_cast<size_t>(r - 1) : 0;
    return ((i * combos_ + c) * static_cast<size_t>(T_) + static_cast<size_t>(u)) * r_dim_ + ri;
  }

  // F(i, c, u, r); values at or above the bound stand for "no better than the bound".
  double value(size_t i, size_t c, int u, int r) {
    Entry& memo = memo_[index(i, c, u, r)];
    if (!std::isnan(memo.value)) return memo.value;
    Entry best;
    best.value = kInf;
    const int have = countOf(c, u);
    const int64_t memory = cost_.types()[static_cast<size_t>(u)].memory_bytes;
    const int k_max = replicate_ ? std::min(have, cost_.options().max_replicas) : 1;
    // The stage on k devices of type u: k replicas (k_max at most), or k tensor ranks
    // (kinds past k_max, 2 to max_tensor).
    const int t_max = tensor_ ? std::min(have, cost_.options().max_tensor) : 1;
    for (int kind = 1; kind <= k_max + std::max(0, t_max - 1); ++kind) {
      const bool tensor = kind > k_max;
      const int k = tensor ? kind - k_max + 1 : kind;
      const size_t rest = c - static_cast<size_t>(k) * radix_[static_cast<size_t>(u)];
      // The last stage must use every device left; an inner one must leave some.
      for (size_t j = i + 1; j <= L_; ++j) {
        const double limit = std::min(best.value, bound_);
        // Longer stages only cost more; a tensor-split one at least its compute on one
        // device over its ranks (a range that completes a pair may split and cost less).
        if (tensor && cost_.compute(u, i, j) / k >= limit) break;
        const double st = tensor ? cost_.stage(u, i, j, 1, k) : cost_.stage(u, i, j, k);
        if (!tensor && st >= limit) break;
        if (st >= limit) continue;
        if (j == L_ ? (rest != 0 || r != 1) : (rest == 0 || r == 1)) continue;
        if (tensor ? cost_.memory(i, j, r, 1, 0, 1, k) > memory : cost_.memory(i, j, r, k) > memory)
          continue;
        if (j == L_) {
          best = {st, static_cast<uint32_t>(j), static_cast<int16_t>(k), -1, tensor};
          continue;
        }
        for (int v = 0; v < T_; ++v) {
          if (countOf(rest, v) == 0) continue;
          const double ln = cost_.link(j, u, v);
          const double lim = std::min(best.value, bound_);
          if ((latency_ ? st + ln : ln) >= lim) continue;
          const double after = value(j, rest, v, r - 1);
          const double cand = latency_ ? st + ln + after : std::max({st, ln, after});
          if (cand < best.value)
            best = {cand, static_cast<uint32_t>(j), static_cast<int16_t>(k),
                    static_cast<int16_t>(v), tensor};
        }
      }
    }
    memo_[index(i, c, u, r)] = best;
    return best.value;
  }

  const CostModel& cost_;
  double bound_;
  int T_ = 0, D_ = 0;
  size_t L_ = 0, combos_ = 0, r_dim_ = 1;
  bool replicate_ = false, tensor_ = false, latency_ = false;
  std::vector<size_t> radix_;
  std::vector<Entry> memo_;
};

}  // namespace

double exactStates(const CostModel& cost) {
  double combos = 1;
  for (const DeviceType& t : cost.types()) combos *= static_cast<double>(t.devices.size() + 1);
  const bool replicate =
      (cost.options().max_replicas > 1 || cost.options().max_tensor > 1) && cost.training();
  return static_cast<double>(cost.layers()) * static_cast<double>(cost.types().size()) * combos *
         (replicate ? static_cast<double>(cost.problem().devices.size()) : 1.0);
}

Plan exactPlan(const CostModel& cost, const Plan* bound) {
  checkEveryLayerFits(cost);
  const bool usable = bound && bound->infeasible.empty();
  Exact search(cost, usable ? bound->seconds : kInf);
  Plan plan = search.solve();
  if (!plan.stages.empty()) return plan;
  if (usable) {  // nothing strictly better: the bound's plan is optimal
    Plan same = *bound;
    same.algorithm = "exact";
    return same;
  }
  throw InvalidArgument(noSplitFits(cost, "exact"));
}

}  // namespace tandem::partitioner
