// Planning time and plan quality on synthetic clusters (partitioner/random_problem.h):
//   - exact search, 200 layers x 16 devices (4 kinds x 4): time beside the 1 s target;
//   - heuristic, 1000 layers x 64 devices (4 kinds x 16): time beside the 5 s target;
//   - heuristic / exact objective on instances where exact is computable (1.00 = optimal,
//     target <= 1.05);
//   - the plan's predicted speed beside the equal-layer baseline's;
//   - device selection (choosePlan): its time, and its predicted step beside the search's.
// Times are the median of a few runs; the machine is shared, so only the ratios count.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "partitioner/random_problem.h"
#include "partitioner/search.h"

using namespace tandem::partitioner;

namespace {

double medianSeconds(const std::function<void()>& f, int runs) {
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

RandomProblemOptions instance(int layers, int devices, int kinds, int nodes, uint64_t seed) {
  RandomProblemOptions o;
  o.layers = layers;
  o.devices = devices;
  o.kinds = kinds;
  o.nodes = nodes;
  o.seed = seed;
  o.memory_min = 0.2;  // many devices: some cannot hold the model alone
  o.memory_max = 1.0;
  o.cost.microbatches = 8;
  return o;
}

void timed(const char* what, const RandomProblemOptions& o, double target_s, bool exact) {
  const CostModel cost(randomProblem(o));
  Plan plan;
  const double s = medianSeconds(
      [&] {
        if (exact) {
          plan = exactPlan(cost);
        } else {
          plan = heuristicPlan(cost);
        }
      },
      3);
  const Plan equal = baselinePlans(cost)[0];
  std::printf(
      "%-44s %9.3f s   target %.0f s   target/ours %6.1fx   %zu stages, %.3f ms/micro"
      " (equal layers %s)\n",
      what, s, target_s, target_s / s, plan.stages.size(), plan.seconds * 1e3,
      equal.infeasible.empty()
          ? (std::to_string(equal.seconds / plan.seconds).substr(0, 4) + "x slower").c_str()
          : "does not fit");
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::printf("planning time (median of 3)\n");
  timed("exact, 200 layers x 16 devices (4 kinds)", instance(200, 16, 4, 4, 1), 1.0, true);
  timed("heuristic, 1000 layers x 64 devices (4 kinds)", instance(1000, 64, 4, 4, 2), 5.0, false);

  std::printf("\nheuristic / exact objective where exact is computable\n");
  struct Size {
    int layers, devices, kinds;
  };
  for (const Size& z : {Size{40, 8, 3}, Size{100, 12, 3}, Size{200, 16, 4}}) {
    double worst = 1, sum = 0;
    const int n = 5;
    for (int i = 0; i < n; ++i) {
      const CostModel cost(randomProblem(instance(z.layers, z.devices, z.kinds, 2, 10 + i)));
      const double r = heuristicPlan(cost).seconds / exactPlan(cost).seconds;
      worst = std::max(worst, r);
      sum += r;
    }
    std::printf(
        "%4d layers x %2d devices (%d kinds), %d instances: mean %.4f, worst %.4f "
        "(target <= 1.05)\n",
        z.layers, z.devices, z.kinds, n, sum / n, worst);
  }

  // Device selection prices splits by their step (refineByStep) and searches again for
  // each device it tries to leave out (at most 64 searches).
  std::printf(
      "\ndevice selection (choosePlan), median of 3; both steps are the cost model's "
      "predictions for the same problem in this run (no measured peer)\n");
  for (const Size& z : {Size{40, 8, 3}, Size{200, 16, 4}}) {
    const CostModel cost(randomProblem(instance(z.layers, z.devices, z.kinds, 4, 1)));
    const Plan searched = bestPlan(cost);
    Plan chosen;
    const double s = medianSeconds([&] { chosen = choosePlan(cost); }, 3);
    size_t used = 0;
    for (const PlanStage& st : chosen.stages) used += st.at.devices.size();
    std::printf(
        "%4d layers x %2d devices (%d kinds): %7.3f s, %zu of %d devices, predicted step "
        "%.4f s, the search's split %.4f s (ours %.2fx shorter)\n",
        z.layers, z.devices, z.kinds, s, used, z.devices, chosen.step_s, searched.step_s,
        searched.step_s / chosen.step_s);
  }
  return 0;
}
