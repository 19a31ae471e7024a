// The heuristic search (search.h): the best split for a fixed sequence of stage types,
// inside a local search over sequences.
#include <algorithm>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "partitioner/search.h"

namespace tandem::partitioner {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A stage: its type and devices of it, replicas or (`tensor`) one worker's tensor ranks.
struct Slot {
  int type = 0, replicas = 1;
  bool tensor = false;
  bool operator==(const Slot&) const = default;
};
using Sequence = std::vector<Slot>;

// The best split of every layer over `seq` (each stage non-empty), or kInf when none
// beats `bound` or fits. `ends` receives each stage's end layer.
class SplitSolver {
 public:
  explicit SplitSolver(const CostModel& cost) : cost_(cost) {}

  double solve(const Sequence& seq, double bound, std::vector<size_t>* ends) {
    const size_t L = cost_.layers(), p = seq.size();
    if (p == 0 || p > L) return kInf;
    const bool latency = cost_.options().objective == Objective::kInferLatency;
    // g[q][i]: the best for layers [i, L) on stages q..p-1; choice[q][i]: stage q's end.
    // Reused across calls: the local search solves thousands of sequences.
    g_.resize(p);
    choice_.resize(p);
    for (size_t q = 0; q < p; ++q) {
      g_[q].assign(L + 1, kInf);
      choice_[q].assign(L + 1, 0);
    }
    const double head = latency ? cost_.sourceLink(seq[0].type) : 0;
    for (size_t q1 = p; q1-- > 0;) {
      const Slot& s = seq[q1];
      const int64_t memory = cost_.types()[static_cast<size_t>(s.type)].memory_bytes;
      const int to_end = static_cast<int>(p - q1);
      // Stage q1 starts at layer q1 at the earliest and leaves a layer per later stage.
      const size_t i_lo = q1, i_hi = L - (p - q1);
      for (size_t i = (q1 == 0 ? 0 : i_lo); i <= (q1 == 0 ? 0 : i_hi); ++i) {
        double best = kInf;
        size_t arg = 0;
        const size_t j_hi = q1 + 1 == p ? L : L - (p - q1 - 1);
        const size_t j_lo = q1 + 1 == p ? L : i + 1;
        const std::vector<double>* links =
            q1 + 1 < p ? &linkRow(s.type, seq[q1 + 1].type) : nullptr;
        for (size_t j = i + 1; j <= j_hi; ++j) {
          const double limit = std::min(best, bound - head);
          // Longer stages only cost more; a tensor-split one at least its compute on one
          // device over its ranks (a range that completes a pair may split and cost less).
          if (s.tensor && cost_.compute(s.type, i, j) / s.replicas >= limit) break;
          const double st = s.tensor ? cost_.stage(s.type, i, j, 1, s.replicas)
                                     : cost_.stage(s.type, i, j, s.replicas);
          if (st >= limit) {
            if (s.tensor) continue;
            break;
          }
          if (j < j_lo) continue;
          double cand = st;
          if (j < L) {
            const double ln = (*links)[j];
            const double after = g_[q1 + 1][j];
            cand = latency ? st + ln + after : std::max({st, ln, after});
          }
          // The memory check last: it costs the most.
          if (cand >= best ||
              (s.tensor ? cost_.memory(i, j, to_end, 1, static_cast<int>(p), 1, s.replicas)
                        : cost_.memory(i, j, to_end, s.replicas, static_cast<int>(p))) > memory)
            continue;
          best = cand;
          arg = j;
        }
        g_[q1][i] = best;
        choice_[q1][i] = arg;
      }
    }
    const double total = head + g_[0][0];
    if (!(total < bound)) return kInf;
    if (ends) {
      ends->clear();
      for (size_t q = 0, i = 0; q < p; ++q) {
        i = choice_[q][i];
        ends->push_back(i);
      }
    }
    return total;
  }

 private:
  // The link after each layer from type `from`'s node to type `to`'s, built on first use
  // for each pair of nodes (a link's cost depends only on the nodes).
  const std::vector<double>& linkRow(int from, int to) {
    const size_t nodes = cost_.problem().links.size();
    const auto a = static_cast<size_t>(cost_.types()[static_cast<size_t>(from)].node);
    const auto b = static_cast<size_t>(cost_.types()[static_cast<size_t>(to)].node);
    if (link_rows_.empty()) link_rows_.resize(nodes * nodes);
    std::vector<double>& row = link_rows_[a * nodes + b];
    if (row.empty()) {
      row.assign(cost_.layers() + 1, 0.0);
      for (size_t j = 1; j < cost_.layers(); ++j) row[j] = cost_.link(j, from, to);
    }
    return row;
  }

  const CostModel& cost_;
  std::vector<std::vector<double>> g_;
  std::vector<std::vector<size_t>> choice_;
  std::vector<std::vector<double>> link_rows_;  // by from-node x nodes + to-node
};

class LocalSearch {
 public:
  LocalSearch(const CostModel& cost, int max_passes)
      : cost_(cost), solver_(cost), max_passes_(max_passes) {
    const auto& types = cost.types();
    for (const DeviceType& t : types) available_.push_back(static_cast<int>(t.devices.size()));
    by_speed_.resize(types.size());
    std::iota(by_speed_.begin(), by_speed_.end(), 0);
    const size_t L = cost.layers();
    std::stable_sort(by_speed_.begin(), by_speed_.end(),
                     [&](int a, int b) { return cost.compute(a, 0, L) < cost.compute(b, 0, L); });
    replicate_ = cost.options().max_replicas > 1 && cost.training();
    tensor_ =
        cost.options().max_tensor > 1 && cost.training() && !cost.problem().tensor_roles.empty();
  }

  Plan run() {
    // Starts: for every p, the p fastest devices in speed order and grouped by node, and
    // the p with the most memory (which fits when little else does).
    const size_t D = cost_.problem().devices.size();
    const size_t p_max = std::min(D, cost_.layers());
    std::vector<int> fastest;
    for (int t : by_speed_)
      for (int k = 0; k < available_[static_cast<size_t>(t)]; ++k) fastest.push_back(t);
    std::vector<int> by_memory = fastest;
    std::stable_sort(by_memory.begin(), by_memory.end(), [&](int a, int b) {
      return cost_.types()[static_cast<size_t>(a)].memory_bytes >
             cost_.types()[static_cast<size_t>(b)].memory_bytes;
    });
    for (size_t p = p_max; p >= 1; --p) {
      Sequence seq;
      for (size_t q = 0; q < p; ++q) seq.push_back({fastest[q], 1});
      consider(seq);
      std::stable_sort(seq.begin(), seq.end(), [&](const Slot& a, const Slot& b) {
        return cost_.types()[static_cast<size_t>(a.type)].node <
               cost_.types()[static_cast<size_t>(b.type)].node;
      });
      consider(seq);
      Sequence roomy;
      for (size_t q = 0; q < p; ++q) roomy.push_back({by_memory[q], 1});
      consider(roomy);
    }
    for (int pass = 0; pass < max_passes_ && !best_.empty(); ++pass)
      if (!improve()) break;
    if (best_.empty()) return {};
    std::vector<size_t> ends;
    solver_.solve(best_, kInf, &ends);
    std::vector<size_t> next(cost_.types().size(), 0);
    std::vector<Assignment> stages;
    size_t begin = 0;
    for (size_t q = 0; q < best_.size(); ++q) {
      Assignment a;
      a.begin = begin;
      a.end = ends[q];
      const auto& devs = cost_.types()[static_cast<size_t>(best_[q].type)].devices;
      for (int k = 0; k < best_[q].replicas; ++k)
        a.devices.push_back(devs[next[static_cast<size_t>(best_[q].type)]++]);
      a.tensor = best_[q].tensor;
      begin = a.end;
      stages.push_back(std::move(a));
    }
    return evaluate(cost_, stages, "heuristic");
  }

 private:
  bool fits(const Sequence& seq) const {
    std::vector<int> used(available_.size(), 0);
    for (const Slot& s : seq)
      if ((used[static_cast<size_t>(s.type)] += s.replicas) >
          available_[static_cast<size_t>(s.type)])
        return false;
    return true;
  }

  // Keeps seq if it beats the best so far.
  bool consider(const Sequence& seq) {
    if (seq.empty() || !fits(seq)) return false;
    const double v = solver_.solve(seq, best_value_, nullptr);
    if (!(v < best_value_)) return false;
    best_value_ = v;
    best_ = seq;
    return true;
  }

  // One pass of moves from the best sequence; true if one improved it.
  bool improve() {
    const Sequence base = best_;
    const size_t p = base.size();
    const int T = static_cast<int>(available_.size());
    // Swap two stages' devices, or move one stage elsewhere, within `window` positions
    // (all of them for short pipelines).
    const size_t window = p <= 16 ? p : 2;
    for (size_t a = 0; a < p; ++a)
      for (size_t b = a + 1; b < std::min(p, a + window + 1); ++b) {
        if (base[a] == base[b]) continue;
        Sequence s = base;
        std::swap(s[a], s[b]);
        if (consider(s)) return true;
      }
    for (size_t a = 0; a < p; ++a)
      for (size_t b = (a > window ? a - window : 0); b < std::min(p, a + window + 1); ++b) {
        if (b == a || b == a + 1) continue;
        Sequence s = base;
        const Slot moved = s[a];
        s.erase(s.begin() + static_cast<std::ptrdiff_t>(a));
        s.insert(s.begin() + static_cast<std::ptrdiff_t>(b > a ? b - 1 : b), moved);
        if (consider(s)) return true;
      }
    for (size_t a = 0; a < p; ++a)  // another type at a stage
      for (int t = 0; t < T; ++t) {
        if (t == base[a].type) continue;
        Sequence s = base;
        s[a] = {t, 1};
        if (consider(s)) return true;
      }
    for (size_t a = 0; a < p && p > 1; ++a) {  // drop a stage
      Sequence s = base;
      s.erase(s.begin() + static_cast<std::ptrdiff_t>(a));
      if (consider(s)) return true;
    }
    for (size_t a = 0; a <= p; ++a)  // insert a stage
      for (int t = 0; t < T; ++t) {
        Sequence s = base;
        s.insert(s.begin() + static_cast<std::ptrdiff_t>(a), Slot{t, 1});
        if (consider(s)) return true;
      }
    // A device more or fewer for a stage (a replica, or a tensor rank), and a stage made
    // tensor-split over 2 or more devices, or made whole again.
    for (size_t a = 0; a < p; ++a)
      for (int delta : {1, -1}) {
        Sequence s = base;
        s[a].replicas += delta;
        const int most = s[a].tensor ? cost_.options().max_tensor : cost_.options().max_replicas;
        if (!(s[a].tensor ? tensor_ : replicate_) || s[a].replicas < (s[a].tensor ? 2 : 1) ||
            s[a].replicas > most)
          continue;
        if (consider(s)) return true;
      }
    for (size_t a = 0; a < p && tensor_; ++a) {
      Sequence s = base;
      s[a].tensor = !s[a].tensor;
      s[a].replicas = s[a].tensor ? std::max(2, s[a].replicas) : 1;
      if (s[a].replicas > cost_.options().max_tensor) continue;
      if (consider(s)) return true;
    }
    // A stage tensor-split over its devices and another stage's of its type, that stage
    // dropped (with every device in use, a split needs one freed).
    for (size_t a = 0; a < p && tensor_; ++a)
      for (size_t b = 0; b < p; ++b) {
        if (b == a || base[b].type != base[a].type || base[b].tensor) continue;
        Sequence s = base;
        s[a].replicas += base[b].replicas;
        s[a].tensor = true;
        if (s[a].replicas > cost_.options().max_tensor) continue;
        s.erase(s.begin() + static_cast<std::ptrdiff_t>(b));
        if (consider(s)) return true;
      }
    return false;
  }

  const CostModel& cost_;
  SplitSolver solver_;
  int max_passes_;
  bool replicate_ = false, tensor_ = false;
  std::vector<int> available_, by_speed_;
  Sequence best_;
  double best_value_ = kInf;
};

}  // namespace

Plan heuristicPlan(const CostModel& cost, const SearchOptions& o) {
  checkEveryLayerFits(cost);
  Plan plan = LocalSearch(cost, o.max_passes).run();
  TANDEM_CHECK_MSG(!plan.stages.empty(), InvalidArgument, noSplitFits(cost, "heuristic"));
  return plan;
}

Plan bestPlan(const CostModel& cost, const SearchOptions& o) {
  TANDEM_CHECK_MSG(o.algorithm == "auto" || o.algorithm == "exact" || o.algorithm == "heuristic",
                   InvalidArgument,
                   "unknown algorithm '" << o.algorithm << "' (expected auto, exact or heuristic)");
  if (o.algorithm == "exact") return exactPlan(cost);
  Plan h = heuristicPlan(cost, o);
  if (o.algorithm == "heuristic" || exactStates(cost) > o.exact_state_limit) return h;
  return exactPlan(cost, &h);
}

}  // namespace tandem::partitioner
