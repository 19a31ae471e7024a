// The predicted training step (simulate.h) against the schedule's own unit-time run and
// hand-worked cases, and device selection (choosePlan): slow devices left out with a
// reason, never predicted slower than the best single device.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/error.h"
#include "core/pipeline/schedule.h"
#include "partitioner/random_problem.h"
#include "partitioner/search.h"
#include "partitioner/simulate.h"
#include "tests/test_util.h"

namespace tandem::partitioner {
namespace {

// `layers` layers without parameters (so no weight-gradient split), each taking `f` forward
// and `b` backward on every one of `devices` devices, one node each, links of `bandwidth`
// and `latency` between nodes.
Problem uniformProblem(size_t layers, int devices, double f, double b, double bandwidth = 1e15,
                       double latency = 0) {
  Problem p;
  for (size_t l = 0; l < layers; ++l) p.layers.push_back({"relu", 0, 1000, 1000});
  p.input_bytes = 1000;
  for (int d = 0; d < devices; ++d) {
    // Appended: GCC 12 at -O3 warns falsely (-Wrestrict) on a literal plus a string.
    const std::string node = std::string("n").append(std::to_string(d));
    p.node_names.push_back(node);
    p.devices.push_back({std::string(node).append("/cpu"), d, int64_t{1} << 40,
                         std::vector<double>(layers, f), std::vector<double>(layers, b)});
  }
  p.links.assign(static_cast<size_t>(devices), std::vector<LinkCosts>(static_cast<size_t>(devices)));
  for (int a = 0; a < devices; ++a)
    for (int z = 0; z < devices; ++z)
      p.links[static_cast<size_t>(a)][static_cast<size_t>(z)] = {bandwidth, a == z ? 0 : latency};
  return p;
}

// Stage s of p on device s, the layers split evenly.
Plan evenPlan(const CostModel& cost, int p) {
  std::vector<Assignment> stages;
  const size_t per = cost.layers() / static_cast<size_t>(p);
  for (int s = 0; s < p; ++s)
    stages.push_back({static_cast<size_t>(s) * per,
                      s + 1 == p ? cost.layers() : static_cast<size_t>(s + 1) * per,
                      {s}});
  return evaluate(cost, stages, "even");
}

TEST(SimulateTest, EqualStagesTakeTheScheduleMakespan) {
  // Free links and equal stages: a step is the schedule's unit-time makespan with a
  // forward as one tick and a backward as two.
  for (const ScheduleKind kind : {ScheduleKind::k1F1B, ScheduleKind::kGPipe})
    for (const int p : {1, 2, 3, 4})
      for (const int64_t m : {1, 2, 4, 7, 8}) {
        Problem problem = uniformProblem(12, p, 0.001, 0.002);
        problem.options.microbatches = m;
        problem.options.schedule = kind;
        const CostModel cost(problem);
        const StepPrediction r = predictStep(cost, evenPlan(cost, p));
        const ScheduleReport unit =
            validateSchedule(scheduleActions(kind, p, m), m, true, /*backward_ticks=*/2);
        const double tick = 0.001 * 12 / p;
        EXPECT_NEAR(r.step_s, static_cast<double>(unit.makespan) * tick, 1e-9)
            << scheduleName(kind) << " p=" << p << " m=" << m;
        EXPECT_NEAR(r.step_s, (m + p - 1) * 3 * tick, 1e-9);
        EXPECT_NEAR(r.bubble, static_cast<double>(p - 1) / static_cast<double>(m + p - 1), 1e-9);
        EXPECT_NEAR(r.samples_per_s, m * 16 / r.step_s, 1e-6);
        ASSERT_EQ(r.busy_s.size(), static_cast<size_t>(p));
      }
}

TEST(SimulateTest, MessagesCrossLinksWithTheirLatencyAndBytes) {
  // One microbatch on two stages: forward, over, forward, backward, back, backward.
  Problem problem = uniformProblem(4, 2, 0.001, 0.002, /*bandwidth=*/1e6, /*latency=*/0.005);
  problem.options.microbatches = 1;
  const CostModel cost(problem);
  const StepPrediction r = predictStep(cost, evenPlan(cost, 2));
  const double f = 0.002, b = 0.004, message = 1000 / 1e6 + 0.005;
  EXPECT_NEAR(r.step_s, 2 * f + 2 * b + 2 * message, 1e-12);
  // A codec's smaller messages cross sooner.
  problem.options.activation_ratio = problem.options.gradient_ratio = 0.5;
  const CostModel halved(problem);
  EXPECT_NEAR(predictStep(halved, evenPlan(halved, 2)).step_s,
              2 * f + 2 * b + 2 * (500 / 1e6 + 0.005), 1e-12);
}

TEST(SimulateTest, ALinkCarriesOneMessageAtATime) {
  // GPipe's forwards on a link slower than the stages: the messages queue on the wire, and
  // the last one arrives (m) transfer times after the first forward.
  Problem problem = uniformProblem(2, 2, 0.001, 0.001, /*bandwidth=*/1e5);
  problem.options.microbatches = 4;
  problem.options.schedule = ScheduleKind::kGPipe;
  const CostModel cost(problem);
  const StepPrediction r = predictStep(cost, evenPlan(cost, 2));
  const double transfer = 1000 / 1e5;  // 10 ms, ten times a stage's forward
  // Stage 1's forwards wait for each message; its backwards send gradients back on the
  // other direction, which stage 0's backwards wait for in turn.
  EXPECT_GT(r.step_s, 4 * transfer + 0.001);
  EXPECT_NEAR(r.step_s, 0.001 + 4 * transfer + 0.001 + 0.001 + 4 * transfer + 0.001, 1e-9);
}

TEST(SimulateTest, AQuotaNodeBurstsWhileIdleButNotWhenKeptBusy) {
  // One stage alone is never idle: it runs at the sustained rate.
  Problem alone = uniformProblem(4, 1, 0.001, 0.001);
  alone.devices[0].burst_ratio = 0.25;
  alone.devices[0].burst_budget_s = 0.025;
  alone.options.microbatches = 4;
  const CostModel busy(alone);
  EXPECT_NEAR(predictStep(busy, evenPlan(busy, 1)).step_s, 4 * 0.008, 1e-12);
  // In front of a stage four times slower, the quota stage idles most of each step: its
  // budget refills and it runs the first forward and the last backward — the pipeline's
  // fill and drain, on the critical path — at full speed (a quarter of its sustained time).
  Problem two = uniformProblem(4, 2, 0.001, 0.001);
  two.devices[1].forward_s.assign(4, 0.004);
  two.devices[1].backward_s.assign(4, 0.004);
  two.devices[0].burst_ratio = 0.25;
  two.devices[0].burst_budget_s = 0.025;
  two.options.microbatches = 8;
  const CostModel pipeline(two);
  EXPECT_NEAR(predictStep(pipeline, evenPlan(pipeline, 2)).step_s, 0.0005 + 8 * 0.016 + 0.0005,
              1e-9);
  Problem no_burst = two;
  no_burst.devices[0].burst_ratio = 1;
  no_burst.devices[0].burst_budget_s = 0;
  const CostModel sustained(no_burst);
  EXPECT_NEAR(predictStep(sustained, evenPlan(sustained, 2)).step_s, 0.002 + 8 * 0.016 + 0.002,
              1e-9);
}

TEST(SimulateTest, StagesOnOneNodeShareItsCores) {
  // A CPU stage (one thread) and an OpenCL CPU device's stage (two compute units) on one
  // node of two cores: both busy, they ask for three, and each computes slower.
  Problem problem = uniformProblem(8, 2, 0.001, 0.002);
  problem.node_names = {"host"};
  problem.links = {{LinkCosts{1e15, 0}}};
  for (DeviceCosts& d : problem.devices) d.node = 0;
  problem.devices[0].host_threads = 1;
  problem.devices[1].host_threads = 2;
  problem.options.microbatches = 8;
  const CostModel unknown(problem);  // no cores known: nothing shared
  const double alone = predictStep(unknown, evenPlan(unknown, 2)).step_s;
  problem.node_cores = {2};
  const CostModel shared(problem);
  const StepPrediction r = predictStep(shared, evenPlan(shared, 2));
  EXPECT_GT(r.step_s, alone * 1.2);
  EXPECT_LT(r.step_s, alone * 1.6);  // at most the 3/2 of everything busy all the time
  // Threads within the cores share nothing.
  problem.devices[1].host_threads = 1;
  const CostModel fits(problem);
  EXPECT_NEAR(predictStep(fits, evenPlan(fits, 2)).step_s, alone, 1e-12);
  // Nor do stages on different nodes.
  Problem two = uniformProblem(8, 2, 0.001, 0.002);
  two.devices[0].host_threads = two.devices[1].host_threads = 2;
  two.node_cores = {2, 2};
  two.options.microbatches = 8;
  const CostModel apart(two);
  EXPECT_NEAR(predictStep(apart, evenPlan(apart, 2)).step_s, alone, 1e-9);
  // The planner then keeps the model on one of them when sharing makes the split slower:
  // an OpenCL CPU device three times slower than the CPU's one thread. Split two layers
  // to one, the stages would balance at 18 ms a microbatch (162 ms a step) alone, but
  // together they keep 2.67 threads busy on two cores: 216 ms, against 192 on the CPU.
  problem.devices[1].host_threads = 2;
  for (double& t : problem.devices[1].forward_s) t *= 3;
  for (double& t : problem.devices[1].backward_s) t *= 3;
  const Plan plan = choosePlan(CostModel(problem));
  EXPECT_EQ(plan.stages.size(), 1u);
  EXPECT_EQ(plan.stages[0].at.devices, std::vector<int>{0});
}

TEST(SimulateTest, ServingObjectivesAreRefused) {
  Problem problem = uniformProblem(4, 1, 0.001, 0.001);
  problem.options.objective = Objective::kInferThroughput;
  const CostModel cost(problem);
  tandem::testing::expectThrowWith<InvalidArgument>(
      [&] { predictStep(cost, evenPlan(cost, 1)); }, {"training objective"});
}

TEST(SelectTest, ADeviceTwentyTimesSlowerIsLeftOutWithTheReason) {
  // Three equal devices and one 20x slower. Its share of the slowest stage is small, but a
  // stage on it fills and drains the pipeline slowly: the plan leaves it out.
  Problem problem = uniformProblem(24, 4, 0.001, 0.002, 1e9, 1e-4);
  for (double& t : problem.devices[3].forward_s) t *= 20;
  for (double& t : problem.devices[3].backward_s) t *= 20;
  problem.options.microbatches = 4;
  const CostModel cost(problem);
  const Plan plan = choosePlan(cost);
  std::set<int> used;
  for (const PlanStage& s : plan.stages) used.insert(s.at.devices.begin(), s.at.devices.end());
  EXPECT_EQ(used.count(3), 0u) << planToYaml(cost, plan);
  ASSERT_EQ(plan.left_out.size(), 4 - used.size());
  bool named = false;
  for (const LeftOut& l : plan.left_out) {
    EXPECT_FALSE(l.reason.empty());
    if (l.device == 3) named = true;
  }
  EXPECT_TRUE(named);
  EXPECT_NE(planToYaml(cost, plan).find("left_out:\n  - {device: n3/cpu, reason: \""),
            std::string::npos)
      << planToYaml(cost, plan);
  // The fast devices share the layers.
  EXPECT_EQ(used.size(), 3u);
}

TEST(SelectTest, NeverPredictedSlowerThanTheBestSingleDevice) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    RandomProblemOptions o;
    o.layers = 10;
    o.devices = 4;
    o.kinds = 3;
    o.nodes = 3;
    o.memory_min = 1.2;  // every device holds the whole model
    o.memory_max = 3;
    o.seed = seed;
    o.cost.microbatches = static_cast<int64_t>(1 + seed % 8);
    const CostModel cost(randomProblem(o));
    const Plan plan = choosePlan(cost);
    EXPECT_TRUE(plan.infeasible.empty());
    for (size_t d = 0; d < cost.problem().devices.size(); ++d) {
      const Plan alone =
          evaluate(cost, {Assignment{0, cost.layers(), {static_cast<int>(d)}}}, "alone");
      EXPECT_LE(plan.step_s, alone.step_s * (1 + 1e-9)) << "seed " << seed << " device " << d;
    }
    // And never slower than the search's split, by the same prediction.
    EXPECT_LE(plan.step_s, bestPlan(cost).step_s * (1 + 1e-9)) << "seed " << seed;
    std::set<int> used;
    for (const PlanStage& s : plan.stages) used.insert(s.at.devices.begin(), s.at.devices.end());
    EXPECT_EQ(used.size() + plan.left_out.size(), cost.problem().devices.size());
  }
}

TEST(SelectTest, ServingPlansAreTheSearchs) {
  RandomProblemOptions o;
  o.cost.objective = Objective::kInferThroughput;
  const CostModel cost(randomProblem(o));
  const Plan chosen = choosePlan(cost), searched = bestPlan(cost);
  EXPECT_EQ(chosen.seconds, searched.seconds);
  EXPECT_EQ(chosen.step_s, 0);
  EXPECT_TRUE(chosen.left_out.empty());
}

}  // namespace
}  // namespace tandem::partitioner
