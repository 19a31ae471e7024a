// The split algorithms against brute force over every contiguous split, device order and
// (with replication) replica set, on seeded random instances; every plan checked to cover
// the model once and to fit in memory.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "core/error.h"
#include "partitioner/random_problem.h"
#include "partitioner/search.h"
#include "tests/test_util.h"

namespace tandem::partitioner {
namespace {

using tandem::testing::expectThrowWith;

// Every layer in exactly one stage, in order; no device twice; within memory.
void expectSound(const CostModel& cost, const Plan& plan) {
  ASSERT_FALSE(plan.stages.empty());
  EXPECT_TRUE(plan.infeasible.empty()) << plan.algorithm << ": " << plan.infeasible;
  std::vector<int> layer_seen(cost.layers(), 0), device_seen(cost.problem().devices.size(), 0);
  size_t expect = 0;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    EXPECT_EQ(st.at.begin, expect) << plan.algorithm << " stage " << s;
    expect = st.at.end;
    for (size_t l = st.at.begin; l < st.at.end && l < cost.layers(); ++l) ++layer_seen[l];
    for (int d : st.at.devices) {
      ++device_seen[static_cast<size_t>(d)];
      EXPECT_LE(st.memory_bytes, cost.problem().devices[static_cast<size_t>(d)].memory_bytes)
          << plan.algorithm << " stage " << s;
    }
  }
  EXPECT_EQ(expect, cost.layers()) << plan.algorithm;
  for (size_t l = 0; l < layer_seen.size(); ++l)
    EXPECT_EQ(layer_seen[l], 1) << plan.algorithm << ": layer " << l;
  for (size_t d = 0; d < device_seen.size(); ++d)
    EXPECT_LE(device_seen[d], 1) << plan.algorithm << ": device " << d;
}

// The best objective over every plan: every end of every stage, every sequence of
// distinct devices and, when replicating, every set of same-type devices for a stage.
double bruteForce(const CostModel& cost) {
  const size_t L = cost.layers();
  const int D = static_cast<int>(cost.problem().devices.size());
  const int max_k = cost.training() ? cost.options().max_replicas : 1;
  double best = std::numeric_limits<double>::infinity();
  std::vector<Assignment> stages;
  std::function<void(size_t, unsigned)> extend = [&](size_t begin, unsigned used) {
    for (size_t end = begin + 1; end <= L; ++end)
      for (unsigned set = 1; set < (1u << D); ++set) {
        if (set & used) continue;
        std::vector<int> devs;
        for (int d = 0; d < D; ++d)
          if (set & (1u << d)) devs.push_back(d);
        if (static_cast<int>(devs.size()) > max_k) continue;
        bool one_type = true;
        for (int d : devs) one_type = one_type && cost.typeOf(d) == cost.typeOf(devs[0]);
        if (!one_type) continue;
        stages.push_back({begin, end, devs});
        if (end == L) {
          const Plan p = evaluate(cost, stages, "brute-force");
          if (p.infeasible.empty()) best = std::min(best, p.seconds);
        } else {
          extend(end, used | set);
        }
        stages.pop_back();
      }
  };
  extend(0, 0);
  return best;
}

struct Instance {
  RandomProblemOptions options;
  std::string name;
};

std::vector<Instance> instances(Objective objective, int max_replicas) {
  std::vector<Instance> out;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    RandomProblemOptions o;
    o.seed = seed;
    o.layers = 2 + static_cast<int>(seed % 11);      // 2..12
    o.devices = 1 + static_cast<int>(seed % 4);      // 1..4
    o.kinds = 1 + static_cast<int>((seed / 4) % 3);  // 1..3: some devices identical
    o.nodes = 1 + static_cast<int>((seed / 2) % 3);
    o.memory_min = seed % 3 == 0 ? 0.15 : 0.4;  // a third tight: the model must be split
    o.cost.objective = objective;
    o.cost.schedule = seed % 2 ? ScheduleKind::k1F1B : ScheduleKind::kGPipe;
    o.cost.recompute = seed % 5 == 0;
    o.cost.microbatches = 1 + static_cast<int64_t>(seed % 6);
    o.cost.max_replicas = max_replicas;
    if (objective == Objective::kInferLatency && seed % 2) o.cost.source = 0;
    out.push_back({o, "seed " + std::to_string(seed)});
  }
  return out;
}

void checkAgainstBruteForce(Objective objective, int max_replicas) {
  int solved = 0, infeasible = 0;
  for (const Instance& in : instances(objective, max_replicas)) {
    SCOPED_TRACE(in.name);
    const CostModel cost(randomProblem(in.options));
    const double brute = bruteForce(cost);
    if (std::isinf(brute)) {
      EXPECT_THROW(exactPlan(cost), InvalidArgument);
      ++infeasible;
      continue;
    }
    const Plan exact = exactPlan(cost);
    expectSound(cost, exact);
    if (objective == Objective::kInferLatency) {
      // A sum taken in another order may differ in the last bit.
      EXPECT_NEAR(exact.seconds, brute, 1e-12 * brute);
    } else {
      EXPECT_EQ(exact.seconds, brute);
    }
    const Plan heuristic = heuristicPlan(cost);
    expectSound(cost, heuristic);
    EXPECT_GE(heuristic.seconds, exact.seconds * (1 - 1e-12));
    // Seeded with the heuristic's plan as a bound, the exact search returns the same.
    EXPECT_EQ(exactPlan(cost, &heuristic).seconds, exact.seconds);
    ++solved;
  }
  EXPECT_GE(solved, 25) << "too few feasible instances to mean anything";
  EXPECT_GE(infeasible + solved, 40);
}

TEST(SearchTest, ExactEqualsBruteForceForTrainingThroughput) {
  checkAgainstBruteForce(Objective::kTrainThroughput, 1);
}

TEST(SearchTest, ExactEqualsBruteForceWithReplicatedStages) {
  checkAgainstBruteForce(Objective::kTrainThroughput, 3);
}

TEST(SearchTest, ExactEqualsBruteForceForInferenceThroughput) {
  checkAgainstBruteForce(Objective::kInferThroughput, 1);
}

TEST(SearchTest, ExactEqualsBruteForceForLatency) {
  checkAgainstBruteForce(Objective::kInferLatency, 1);
}

TEST(SearchTest, HeuristicWithinFivePercentOfExactOnLargerInstances) {
  double worst = 1;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    RandomProblemOptions o;
    o.seed = 100 + seed;
    o.layers = 40;
    o.devices = 8;
    o.kinds = 3;
    o.nodes = 2;
    o.cost.max_replicas = seed % 3 == 0 ? 2 : 1;
    const CostModel cost(randomProblem(o));
    const Plan exact = exactPlan(cost), heuristic = heuristicPlan(cost);
    expectSound(cost, exact);
    expectSound(cost, heuristic);
    EXPECT_LE(heuristic.seconds, 1.05 * exact.seconds) << "seed " << o.seed;
    worst = std::max(worst, heuristic.seconds / exact.seconds);
  }
  std::printf("heuristic / exact, worst of 12: %.4f\n", worst);
}

TEST(SearchTest, TightMemoryForcesAnUnevenSplit) {
  // Two equal devices; layer 0 holds most of the weights. Compute favours cutting in the
  // middle, but with weights, gradients and momentum (3 x 44 MiB for layers [0, 3)) only
  // a stage with layer 0 alone fits in 125 MiB.
  Problem p;
  p.node_names = {"n"};
  p.links = {{LinkCosts{1e9, 1e-5}}};
  for (int l = 0; l < 6; ++l)
    p.layers.push_back({"l", l == 0 ? int64_t{40} << 20 : int64_t{2} << 20, 1 << 10});
  p.input_bytes = 1 << 10;
  for (int d = 0; d < 2; ++d)
    p.devices.push_back({"n/d" + std::to_string(d), 0, int64_t{125} << 20,
                         std::vector<double>(6, 1e-3), std::vector<double>(6, 2e-3)});
  p.options.microbatches = 2;
  const CostModel cost(p);
  const Plan plan = exactPlan(cost);
  expectSound(cost, plan);
  ASSERT_EQ(plan.stages.size(), 2u);
  EXPECT_EQ(plan.stages[0].at.end, 1u);  // the heavy layer alone
  // Without the memory limit the split would be even.
  p.devices[0].memory_bytes = p.devices[1].memory_bytes = int64_t{1} << 40;
  const CostModel roomy(p);
  EXPECT_EQ(exactPlan(roomy).stages[0].at.end, 3u);
}

TEST(SearchTest, SlowDeviceGetsFewerLayers) {
  Problem p;
  p.node_names = {"n"};
  p.links = {{LinkCosts{1e10, 1e-6}}};
  for (int l = 0; l < 10; ++l) p.layers.push_back({"l", 1000, 1000});
  p.input_bytes = 1000;
  p.devices.push_back({"n/fast", 0, int64_t{1} << 30, std::vector<double>(10, 1e-3),
                       std::vector<double>(10, 2e-3)});
  p.devices.push_back({"n/slow", 0, int64_t{1} << 30, std::vector<double>(10, 4e-3),
                       std::vector<double>(10, 8e-3)});
  const CostModel cost(p);
  const Plan plan = bestPlan(cost);
  expectSound(cost, plan);
  ASSERT_EQ(plan.stages.size(), 2u);
  for (const PlanStage& st : plan.stages) {
    const size_t n = st.at.end - st.at.begin;
    // 8 x 3 ms on the fast one beside 2 x 12 ms on the slow one.
    EXPECT_EQ(n, st.at.devices[0] == 0 ? 8u : 2u);
  }
  const std::vector<Plan> base = baselinePlans(cost);
  ASSERT_EQ(base.size(), 3u);
  for (const Plan& b : base) {
    expectSound(cost, b);
    EXPECT_GT(b.seconds, plan.seconds) << b.algorithm;
  }
  EXPECT_EQ(base[0].algorithm, "equal-layers");
  EXPECT_EQ(base[0].stages[0].at.end, 5u);
}

TEST(SearchTest, LatencyKeepsASlowLinkOutOfTheChain) {
  // Edge (source, slow) and cloud (fast) across a link so slow that shipping the raw
  // input costs more than running everything on the edge: latency runs it all there.
  Problem p;
  p.node_names = {"edge", "cloud"};
  p.links = {{LinkCosts{1e9, 1e-6}, LinkCosts{1e5, 5e-2}},
             {LinkCosts{1e5, 5e-2}, LinkCosts{1e9, 1e-6}}};
  for (int l = 0; l < 4; ++l) p.layers.push_back({"l", 1000, 100000 >> l});
  p.input_bytes = 200000;
  p.devices.push_back(
      {"edge/cpu", 0, int64_t{1} << 30, std::vector<double>(4, 1e-2), std::vector<double>(4, 0)});
  p.devices.push_back(
      {"cloud/gpu", 1, int64_t{1} << 30, std::vector<double>(4, 1e-4), std::vector<double>(4, 0)});
  p.options.objective = Objective::kInferLatency;
  p.options.source = 0;
  const Plan plan = exactPlan(CostModel(p));
  ASSERT_EQ(plan.stages.size(), 1u);
  EXPECT_EQ(plan.stages[0].at.devices, std::vector<int>{0});
  EXPECT_NEAR(plan.seconds, 4e-2, 1e-12);
  // A fast link: send the input to the cloud and run everything there.
  p.links[0][1] = p.links[1][0] = LinkCosts{1e10, 1e-6};
  const Plan fast = exactPlan(CostModel(p));
  ASSERT_EQ(fast.stages.size(), 1u);
  EXPECT_EQ(fast.stages[0].at.devices, std::vector<int>{1});
}

// A training stage's memory, by hand: weights with their gradients and optimizer state;
// the microbatches in flight but the one whose backward runs, whole stashes; that one,
// at its peak layer, the stash of the layers up to it, its input and output gradients and
// its scratch (a convolution's columns); then the transport buffers.
TEST(SearchTest, AStagesMemoryPeaksInTheBackwardOfItsWidestLayer) {
  Problem p;
  // (type, params, output, stash, scratch)
  p.layers = {{"conv2d", 400, 2000, 100, 300},
              {"relu", 0, 2000, 2000, 0},
              {"maxpool2d", 0, 500, 500, 0},
              {"linear", 800, 40, 500, 0}};
  p.input_bytes = 100;
  p.node_names = {"n"};
  p.devices.push_back(
      {"n/cpu", 0, int64_t{1} << 30, std::vector<double>(4, 1e-3), std::vector<double>(4, 2e-3)});
  p.links = {{{1e9, 0}}};
  p.options.microbatches = 4;
  p.options.optimizer_state_per_param = 1;
  const CostModel cost(p);
  const int64_t state = 3 * 1200;  // weights, gradients, momentum
  // The relu's backward: the stash through it (100 + 2000), its input and output (2000
  // each); more than the convolution's (100 + 100 + 2000 + 300) or the pool's.
  const int64_t peak = 2100 + 4000;
  const int64_t whole = 3100;  // every layer's stash
  // One stage alone: one microbatch in flight.
  EXPECT_EQ(cost.memory(0, 4, 1, 1), state + peak);
  // Three stages from this one to the last, 1F1B: three in flight, two of them whole.
  EXPECT_EQ(cost.memory(0, 4, 3, 1), state + 2 * whole + peak);
  // From the pool on, its input from a stage before: the pool's backward (its stash 500,
  // input 2000, output 500) is the peak, more than the linear's (1000 + 500 + 40); two
  // transport buffers of the input each way.
  EXPECT_EQ(cost.memory(2, 4, 1, 1), 3 * 800 + 3000 + 2 * 2 * 2000);
}

TEST(SearchTest, ALayerThatFitsNowhereIsNamed) {
  Problem p;
  p.node_names = {"n"};
  p.links = {{LinkCosts{1e9, 1e-5}}};
  p.layers = {{"conv2d", 1000, 1000}, {"linear", int64_t{1} << 30, 100}};
  p.input_bytes = 100;
  p.devices.push_back({"n/pi", 0, int64_t{512} << 20, {1e-3, 1e-3}, {1e-3, 1e-3}});
  p.devices.push_back({"n/jetson", 0, int64_t{1} << 30, {1e-3, 1e-3}, {1e-3, 1e-3}});
  const CostModel cost(p);
  for (const char* algorithm : {"exact", "heuristic", "auto"})
    expectThrowWith<InvalidArgument>(
        [&] { bestPlan(cost, {algorithm}); },
        {"layer 1 (linear)", "1073741824 bytes of weights", "3221225472 bytes with its gradients",
         "n/jetson", "has 1073741824 bytes"});
}

TEST(SearchTest, AModelLargerThanAllDevicesTogetherIsRefused) {
  Problem p;
  p.node_names = {"n"};
  p.links = {{LinkCosts{1e9, 1e-5}}};
  for (int l = 0; l < 4; ++l) p.layers.push_back({"linear", 100 << 20, 100});
  p.input_bytes = 100;
  for (int d = 0; d < 2; ++d)
    p.devices.push_back({"n/d" + std::to_string(d), 0, int64_t{500} << 20,
                         std::vector<double>(4, 1e-3), std::vector<double>(4, 1e-3)});
  const CostModel cost(p);
  // Named with what the model needs at least and what the devices have in all.
  const std::string needs = "the model needs more than " + std::to_string(cost.stateBytes(0, 4)) +
                            " bytes (its weights, 419430400 bytes, with their gradients";
  expectThrowWith<InvalidArgument>(
      [&] { exactPlan(cost); },
      {"the exact search found no split of the 4 layers over the 2 devices that fits in memory",
       needs, "the devices have 1048576000 in all"});
  expectThrowWith<InvalidArgument>(
      [&] { heuristicPlan(cost); },
      {"the heuristic search found no split", needs, "the devices have 1048576000 in all"});
}

TEST(SearchTest, EvaluateRefusesPlansThatDropOrRepeat) {
  RandomProblemOptions o;
  o.layers = 5;
  o.devices = 3;
  const CostModel cost(randomProblem(o));
  expectThrowWith<InvalidArgument>(
      [&] {
        evaluate(cost, {{0, 2, {0}}, {3, 5, {1}}}, "t");
      },
      {"stage 1 has layers [3, 5)", "should start at layer 2"});
  expectThrowWith<InvalidArgument>(
      [&] {
        evaluate(cost, {{0, 2, {0}}, {1, 5, {1}}}, "t");
      },
      {"should start at layer 2"});
  expectThrowWith<InvalidArgument>(
      [&] {
        evaluate(cost, {{0, 2, {0}}, {2, 4, {1}}}, "t");
      },
      {"end at layer 4 of 5"});
  expectThrowWith<InvalidArgument>(
      [&] {
        evaluate(cost, {{0, 2, {0}}, {2, 5, {0}}}, "t");
      },
      {"used twice"});
}

}  // namespace
}  // namespace tandem::partitioner
