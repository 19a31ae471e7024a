// refineByStep (search.h): a split's cuts moved, and neighbouring stages' devices swapped,
// while the predicted training step gets shorter.
#include <algorithm>
#include <utility>

#include "partitioner/search.h"

namespace tandem::partitioner {

namespace {

// Plans priced per refinement at most: a plan stays quick on a model of a thousand layers,
// and its result does not depend on the machine's speed.
constexpr int kMaxRefineEvaluations = 512;

// The offsets a cut is tried at: every one up to 8 layers away, then each half again as far
// (12, 18, 27, ...), so a long stage's cut can travel far in a few tries.
std::vector<long> offsets(long span) {
  std::vector<long> out;
  for (long d = 1; d <= span; d = d < 8 ? d + 1 : d + d / 2) {
    out.push_back(d);
    out.push_back(-d);
  }
  return out;
}

}  // namespace

Plan refineByStep(const CostModel& cost, const Plan& plan) {
  if (!cost.training() || plan.chunks > 1 || plan.stages.size() < 2 || !fits(plan)) return plan;
  std::vector<Assignment> stages;
  for (const PlanStage& s : plan.stages) stages.push_back(s.at);
  Plan best = plan;
  int evaluations = 0;
  // Prices `trial`; true (and `best`, `stages` updated) when its step is shorter.
  auto take = [&](std::vector<Assignment>& trial) {
    ++evaluations;
    for (Assignment& a : trial)
      if (!a.shares.empty())
        a.shares = cost.balancedShares(cost.typesOf(a.devices), a.begin, a.end);
    for (const Assignment& a : trial)
      for (const int d : a.devices)
        if (!cost.runs(cost.typesOf({d}).front(), a.begin, a.end)) return false;
    Plan priced = evaluate(cost, trial, plan.algorithm);
    if (!shorterStep(priced, best)) return false;
    best = std::move(priced);
    stages = trial;
    return true;
  };
  bool moved = true;
  while (moved && evaluations < kMaxRefineEvaluations) {
    moved = false;
    // Each cut in turn to the place (among its offsets) with the shortest step.
    for (size_t c = 1; c < stages.size() && evaluations < kMaxRefineEvaluations; ++c) {
      const long lo = static_cast<long>(stages[c - 1].begin) + 1;
      const long hi = static_cast<long>(stages[c].end) - 1;
      const long at = static_cast<long>(stages[c].begin);
      std::vector<Assignment> base = stages;
      for (const long d : offsets(std::max(at - lo, hi - at))) {
        if (at + d < lo || at + d > hi || evaluations >= kMaxRefineEvaluations) continue;
        std::vector<Assignment> trial = base;
        trial[c - 1].end = trial[c].begin = static_cast<size_t>(at + d);
        moved = take(trial) || moved;
      }
    }
    // Neighbouring stages' devices swapped (their layers kept).
    for (size_t c = 1; c < stages.size() && evaluations < kMaxRefineEvaluations; ++c) {
      if (stages[c - 1].devices == stages[c].devices) continue;
      std::vector<Assignment> trial = stages;
      std::swap(trial[c - 1].devices, trial[c].devices);
      std::swap(trial[c - 1].shares, trial[c].shares);
      std::swap(trial[c - 1].tensor, trial[c].tensor);
      moved = take(trial) || moved;
    }
  }
  if (shorterStep(best, plan)) best.algorithm = plan.algorithm + " + step";
  best.left_out = plan.left_out;
  return best;
}

}  // namespace tandem::partitioner
