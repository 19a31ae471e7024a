// choosePlan (search.h): the search's split, then which devices to use at all, by the
// predicted training step.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>

#include "core/error.h"
#include "partitioner/search.h"

namespace tandem::partitioner {

namespace {

// Searches of the greedy removal at most: a plan stays quick and its result independent
// of the machine's speed.
constexpr int kMaxSelectionSearches = 64;

// The problem with only the devices `keep` marks; `map` receives each kept device's index
// in the full problem.
Problem keeping(const Problem& full, const std::vector<bool>& keep, std::vector<int>& map) {
  Problem p = full;
  p.devices.clear();
  map.clear();
  for (size_t d = 0; d < full.devices.size(); ++d)
    if (keep[d]) {
      p.devices.push_back(full.devices[d]);
      map.push_back(static_cast<int>(d));
    }
  return p;
}

// A plan over a sub-problem's devices as a plan over the full problem's, priced there.
Plan lift(const CostModel& full, const Plan& sub, const std::vector<int>& map) {
  std::vector<Assignment> stages;
  for (const PlanStage& s : sub.stages) {
    Assignment a = s.at;
    for (int& d : a.devices) d = map[static_cast<size_t>(d)];
    stages.push_back(std::move(a));
  }
  return evaluate(full, stages, sub.algorithm);
}

std::set<int> devicesOf(const Plan& p) {
  std::set<int> used;
  for (const PlanStage& s : p.stages) used.insert(s.at.devices.begin(), s.at.devices.end());
  return used;
}

std::string ms(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", seconds * 1e3);
  return buf;
}

// Why a plan predicted slower than one using a device is kept: the gain is within the
// margin. Empty when the plan without the device is predicted no slower.
std::string marginNote(double with_s, double without_s) {
  if (!(without_s > with_s * (1 + 1e-6))) return "";
  char buf[96];
  std::snprintf(buf, sizeof buf, " (a gain of %.0f%%, within the %.0f%% a device must bring)",
                100 * (without_s / with_s - 1), 100 * kSelectionMargin);
  return buf;
}

std::vector<Assignment> assignments(const Plan& p) {
  std::vector<Assignment> out;
  for (const PlanStage& s : p.stages) out.push_back(s.at);
  return out;
}

// The options' codecs on every link, and where the options choose, the most compressing
// candidate instead: the split the search finds for links at their cheapest.
CostModel cheapestLinks(const CostModel& cost) {
  Problem p = cost.problem();
  CostOptions& o = p.options;
  for (const CodecChoice& c : o.codecs) {
    if (o.choose_activation_codec && c.ratio < o.activation_ratio) {
      o.activation_ratio = c.ratio;
      o.activation_codec = c.name;
    }
    if (o.choose_gradient_codec && c.ratio < o.gradient_ratio) {
      o.gradient_ratio = c.ratio;
      o.gradient_codec = c.name;
    }
  }
  return CostModel(std::move(p));
}

// Device selection (the greedy removal, then every single device) for `cost`'s options.
Plan selectDevices(const CostModel& cost, const SearchOptions& o);

}  // namespace

Plan chooseCodecs(const CostModel& cost, const Plan& plan) {
  const CostOptions& o = cost.options();
  if (!cost.training() || plan.stages.size() < 2 ||
      !(o.choose_activation_codec || o.choose_gradient_codec) || o.codecs.empty())
    return plan;
  // Each direction's candidates: the options' own codec when it is not chosen.
  const std::vector<CodecChoice> fixed_act = {{o.activation_codec, o.activation_ratio}};
  const std::vector<CodecChoice> fixed_grad = {{o.gradient_codec, o.gradient_ratio}};
  const std::vector<CodecChoice>& acts = o.choose_activation_codec ? o.codecs : fixed_act;
  const std::vector<CodecChoice>& grads = o.choose_gradient_codec ? o.codecs : fixed_grad;
  const std::vector<Assignment> stages = assignments(plan);
  // The links between stages; an interleaved plan's chunks cross p of them (stage s to
  // s + 1, the last to the first), each carrying its chunks' messages with one codec:
  // chunk k's link to chunk k + 1 is link k % p.
  const size_t n = plan.stages.size();
  const size_t p = n / static_cast<size_t>(plan.chunks);
  auto chunkLinks = [&](const std::vector<LinkCodec>& between) {
    std::vector<LinkCodec> out;
    for (size_t k = 0; k + 1 < n; ++k) out.push_back(between[plan.chunks > 1 ? k % p : k]);
    return out;
  };
  auto price = [&](const std::vector<LinkCodec>& between) {
    return evaluate(cost, stages, plan.algorithm, chunkLinks(between), plan.chunks);
  };
  // Every link from the most exact codecs, then each in turn to the most exact choice within
  // kCodecTolerance of its fastest; twice, as a link's choice moves the others' bottleneck.
  std::vector<LinkCodec> links(
      plan.chunks > 1 ? p : n - 1,
      LinkCodec{acts.front().name, grads.front().name, acts.front().ratio, grads.front().ratio});
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < links.size(); ++i) {
      struct Option {
        LinkCodec codec;
        double step;
        size_t rank;  // how inexact: the sum of both directions' places in the lists
      };
      std::vector<Option> options;
      double fastest = 0;
      for (size_t a = 0; a < acts.size(); ++a)
        for (size_t g = 0; g < grads.size(); ++g) {
          std::vector<LinkCodec> trial = links;
          trial[i] = {acts[a].name, grads[g].name, acts[a].ratio, grads[g].ratio};
          const double step = price(trial).step_s;
          options.push_back({trial[i], step, a + g});
          if (fastest == 0 || step < fastest) fastest = step;
        }
      const Option* pick = nullptr;
      for (const Option& x : options)
        if (x.step <= fastest * (1 + kCodecTolerance) &&
            (!pick || x.rank < pick->rank || (x.rank == pick->rank && x.step < pick->step)))
          pick = &x;
      links[i] = pick->codec;
    }
  Plan best = price(links);
  best.left_out = plan.left_out;
  return best;
}

namespace {

// stepPlan from the search's plan `found`.
Plan stepPlanFrom(const CostModel& cost, const Plan& found) {
  Plan best = refineByStep(cost, found);
  if (!cost.training()) return best;
  for (const Plan& b : baselinePlans(cost)) {
    if (!fits(b)) continue;
    Plan moved = refineByStep(cost, b);
    if (shorterStep(moved, best)) best = std::move(moved);
  }
  return best;
}

}  // namespace

Plan stepPlan(const CostModel& cost, const SearchOptions& o) {
  return stepPlanFrom(cost, bestPlan(cost, o));
}

int pickAcrossOptions(const std::vector<const Plan*>& plans) {
  double fastest = 0;
  for (const Plan* p : plans)
    if (fits(*p)) fastest = std::max(fastest, p->samples_per_s);
  auto devices = [](const Plan& p) {
    size_t n = 0;
    for (const PlanStage& s : p.stages) n += s.at.devices.size();
    return n;
  };
  int best = -1;
  for (size_t i = 0; i < plans.size(); ++i) {
    const Plan& p = *plans[i];
    if (!fits(p) || p.samples_per_s * (1 + kSelectionMargin) < fastest) continue;
    const Plan* b = best < 0 ? nullptr : plans[static_cast<size_t>(best)];
    if (!b || devices(p) < devices(*b) ||
        (devices(p) == devices(*b) && p.samples_per_s > b->samples_per_s))
      best = static_cast<int>(i);
  }
  return best;
}

Plan choosePlan(const CostModel& cost, const SearchOptions& o) {
  const CostOptions& opt = cost.options();
  if (!cost.training() || !(opt.choose_activation_codec || opt.choose_gradient_codec))
    return selectDevices(cost, o);
  // Links chosen per link: the split found with the links at the options' codecs and the
  // one found with them at their cheapest, each given its links' codecs; the faster wins.
  // (The options' codecs on every link stay the answer unless a choice is faster: a
  // link's pick may give up kCodecTolerance for exactness.)
  const Plan plain = selectDevices(cost, o);
  const Plan exact = chooseCodecs(cost, plain);
  const CostModel cheap = cheapestLinks(cost);
  const Plan cheap_plan = selectDevices(cheap, o);
  Plan lifted = evaluate(cost, assignments(cheap_plan), cheap_plan.algorithm);
  lifted.left_out = cheap_plan.left_out;
  const Plan compressed = chooseCodecs(cost, lifted);
  const Plan& chosen = shorterStep(compressed, exact) ? compressed : exact;
  return shorterStep(chosen, plain) ? chosen : plain;
}

namespace {

// Clusters of at most this many devices have every subset priced as unequal replicas.
constexpr size_t kMaxUnequalDevices = 12;

// The whole model replicated over unequal devices (Assignment::shares), each set of 2 to
// max_replicas devices in turn with shares that balance their speeds, when the step's
// microbatches divide among them (m a multiple of the set's size: each replica then takes
// the same count of microbatches every step, as the cost model prices): the fastest that
// fits, and per device the fastest that uses it (`with`). Empty (no stages) when none is
// priced. Data parallelism over a fast and a slow node needs no pipeline bubble, which is
// what lets a quarter-core node add to a full one (docs/partitioner.md).
Plan unequalReplicas(const CostModel& cost, const std::string& algorithm,
                     std::map<int, Plan>& with) {
  const size_t n = cost.problem().devices.size();
  const CostOptions& opt = cost.options();
  Plan best;
  if (n < 2 || n > kMaxUnequalDevices || opt.max_replicas < 2) return best;
  for (uint32_t set = 1; set < (uint32_t{1} << n); ++set) {
    const int size = std::popcount(set);
    if (size < 2 || size > opt.max_replicas || opt.microbatches % size != 0) continue;
    Assignment a{0, cost.layers(), {}};
    for (size_t d = 0; d < n; ++d)
      if (set & (uint32_t{1} << d)) a.devices.push_back(static_cast<int>(d));
    const std::vector<int> types = cost.typesOf(a.devices);
    if (!std::all_of(types.begin(), types.end(),
                     [&](int t) { return cost.runs(t, 0, cost.layers()); }))
      continue;
    a.shares = cost.balancedShares(types, 0, cost.layers());
    const Plan plan = evaluate(cost, {a}, algorithm + " + unequal replicas");
    if (shorterStep(plan, best)) best = plan;
    for (const int d : a.devices)
      if (shorterStep(plan, with[d])) with[d] = plan;
  }
  return best;
}

// The whole model as one tensor-split stage (Assignment::tensor) over devices of one node
// of different kinds (a CPU and an OpenCL device: sets of one kind are the exact search's),
// each set of 2 to max_tensor of them (clusters of up to 12 devices) with shares that
// balance their speeds on the split layers (CostModel::balancedTensorShares): the fastest
// that fits; no stages when none is priced.
Plan unequalTensor(const CostModel& cost, const std::string& algorithm) {
  const Problem& problem = cost.problem();
  const size_t n = problem.devices.size();
  Plan best;
  if (n < 2 || n > kMaxUnequalDevices || cost.options().max_tensor < 2 ||
      !cost.tensorSplits(0, cost.layers()))
    return best;
  for (uint32_t set = 1; set < (uint32_t{1} << n); ++set) {
    const int size = std::popcount(set);
    if (size < 2 || size > cost.options().max_tensor) continue;
    Assignment a{0, cost.layers(), {}, {}, true};
    for (size_t d = 0; d < n; ++d)
      if (set & (uint32_t{1} << d)) a.devices.push_back(static_cast<int>(d));
    const std::vector<int> types = cost.typesOf(a.devices);
    const bool one_node = std::all_of(a.devices.begin(), a.devices.end(), [&](int d) {
      return problem.devices[static_cast<size_t>(d)].node ==
             problem.devices[static_cast<size_t>(a.devices.front())].node;
    });
    const bool kinds =
        std::any_of(types.begin(), types.end(), [&](int t) { return t != types[0]; });
    if (!one_node || !kinds) continue;
    a.shares = cost.balancedTensorShares(types, 0, cost.layers());
    const Plan plan = evaluate(cost, {a}, algorithm + " + unequal tensor ranks");
    if (shorterStep(plan, best)) best = plan;
  }
  return best;
}

Plan selectDevices(const CostModel& cost, const SearchOptions& o) {
  if (!cost.training()) return bestPlan(cost, o);
  // The search's algorithm names the plans priced beside its split (one device, replicas).
  const Plan found = bestPlan(cost, o);
  const Plan searched = stepPlanFrom(cost, found);
  const Problem& problem = cost.problem();
  const size_t n = problem.devices.size();
  Plan best = searched;
  // The shortest step priced so far: a plan on fewer devices is taken when it is within
  // kSelectionMargin of it (measured against the fastest, so margins do not compound).
  double fastest = 0;
  auto priced = [&](const Plan& p) {
    if (fits(p) && (fastest == 0 || p.step_s < fastest)) fastest = p.step_s;
  };
  priced(searched);
  auto withinMargin = [&](const Plan& fewer) {
    if (!fits(fewer)) return false;
    if (!fits(best)) return true;
    return fewer.step_s <= fastest * (1 + kSelectionMargin);
  };
  std::vector<bool> keep(n, true);
  // Each device the greedy removal left out: the step with it and without it.
  std::map<int, std::pair<double, double>> removed;
  int searches = 0;
  for (;;) {
    const std::set<int> used = devicesOf(best);
    if (used.size() <= 1) break;
    Plan round;
    int dropped = -1;
    // Devices of one type are interchangeable (CostModel::types): leaving out any one of
    // them leaves the same problem, so one search per type, for its last device in use.
    std::set<int> types_tried;
    for (auto it = used.rbegin(); it != used.rend(); ++it) {
      const int d = *it;
      if (searches >= kMaxSelectionSearches) break;
      if (!types_tried.insert(cost.typesOf({d}).front()).second) continue;
      std::vector<bool> without = keep;
      without[static_cast<size_t>(d)] = false;
      std::vector<int> map;
      Problem sub = keeping(problem, without, map);
      if (sub.devices.empty()) continue;
      ++searches;
      try {
        const CostModel sub_cost(std::move(sub));
        const Plan candidate = lift(cost, refineByStep(sub_cost, bestPlan(sub_cost, o)), map);
        // The round's best removal; withinMargin decides whether it is taken.
        if (dropped < 0 ? fits(candidate) : shorterStep(candidate, round)) {
          round = candidate;
          dropped = d;
        }
      } catch (const InvalidArgument&) {
        // Nothing fits without it: it stays.
      }
    }
    if (dropped < 0 || !withinMargin(round)) break;
    priced(round);
    removed[dropped] = {best.step_s, round.step_s};
    keep[static_cast<size_t>(dropped)] = false;
    best = round;
  }
  // The whole model on one device, each in turn: the fastest of them, taken when within
  // the margin; so the plan is never predicted slower than the best single device.
  Plan best_alone;
  for (size_t d = 0; d < n; ++d) {
    const Plan alone =
        evaluate(cost, {Assignment{0, cost.layers(), {static_cast<int>(d)}}}, found.algorithm);
    if (shorterStep(alone, best_alone)) best_alone = alone;
  }
  priced(best_alone);
  if (devicesOf(best).size() > 1 ? withinMargin(best_alone) : shorterStep(best_alone, best))
    best = best_alone;
  // Unequal replicas of the whole model, and the whole model split over unequal tensor
  // ranks: each taken when faster than the plan so far, by more than the margin where it
  // uses more devices.
  auto consider = [&](const Plan& other) {
    if (!fits(other)) return;
    priced(other);
    const bool more = devicesOf(other).size() > devicesOf(best).size();
    if (more ? other.step_s * (1 + kSelectionMargin) < best.step_s : shorterStep(other, best))
      best = other;
  };
  std::map<int, Plan> replicas_with;
  consider(unequalReplicas(cost, found.algorithm, replicas_with));
  consider(unequalTensor(cost, found.algorithm));
  const std::set<int> used = devicesOf(best), searched_used = devicesOf(searched);
  for (size_t d = 0; d < n; ++d) {
    const int i = static_cast<int>(d);
    if (used.count(i)) continue;
    std::string why;
    if (const auto it = removed.find(i); it != removed.end()) {
      why = "left out: the step is predicted " + ms(it->second.first) + " with it, " +
            ms(it->second.second) + " without" + marginNote(it->second.first, it->second.second);
    } else if (searched_used.count(i)) {
      why = "left out: the fastest split using it is predicted " + ms(searched.step_s) +
            " per step, this plan " + ms(best.step_s) + marginNote(searched.step_s, best.step_s);
    } else {
      why = "not used: no split gains from it (the fastest split's slowest stage takes " +
            ms(searched.seconds) + " per microbatch without it)";
    }
    if (const auto it = replicas_with.find(i); it != replicas_with.end())
      why += "; the fastest unequal replicas with it are predicted " + ms(it->second.step_s) +
             " per step, this plan " + ms(best.step_s) + marginNote(it->second.step_s, best.step_s);
    best.left_out.push_back({i, why});
  }
  return best;
}

}  // namespace

}  // namespace tandem::partitioner
