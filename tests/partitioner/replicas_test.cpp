// Unequal replicas (Assignment::shares): a stage replicated over a fast and a slow device,
// each taking its share of every step — priced at the slowest replica's part of a round,
// its memory per replica, chosen by choosePlan where it beats every pipeline and single
// device, and carried through plan files.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "partitioner/search.h"
#include "partitioner/simulate.h"
#include "tests/test_util.h"

namespace tandem::partitioner {
namespace {

// Ten layers, one microbatch taking `f` forward and 2f backward on the fast node's device
// and `slow` times that on the other node's; each layer holds `params` bytes.
Problem fastAndSlow(double slow, int64_t params = 0, double f = 0.001) {
  Problem p;
  for (int l = 0; l < 10; ++l) p.layers.push_back({"linear", params, 4000, 4000});
  p.input_bytes = 4000;
  p.node_names = {"fast", "slow"};
  p.devices.push_back({"fast/cpu", 0, int64_t{1} << 30, std::vector<double>(10, f),
                       std::vector<double>(10, 2 * f)});
  p.devices.push_back({"slow/cpu", 1, int64_t{1} << 30, std::vector<double>(10, slow * f),
                       std::vector<double>(10, 2 * slow * f)});
  p.links = {{{1e10, 0}, {1e8, 1e-4}}, {{1e8, 1e-4}, {1e10, 0}}};
  p.options.microbatches = 2;
  p.options.microbatch_size = 32;
  return p;
}

TEST(ReplicasTest, UnequalReplicasArePricedAtTheSlowestPartOfARound) {
  const CostModel cost(fastAndSlow(4));
  // Balanced: the slow replica takes a fifth of the work.
  const std::vector<double> shares = cost.balancedShares({0, 1}, 0, 10);
  ASSERT_EQ(shares.size(), 2u);
  EXPECT_DOUBLE_EQ(shares[0], 1);
  EXPECT_DOUBLE_EQ(shares[1], 0.25);
  const Plan plan = evaluate(cost, {{0, 10, {0, 1}, shares}}, "test");
  ASSERT_TRUE(plan.infeasible.empty()) << plan.infeasible;
  // A microbatch takes 30 ms on the fast device; a round of two (one each) of 1.6 and
  // 0.4 times the mean size takes 48 ms on either: 24 ms a microbatch, and the step's
  // allreduce (no parameters: its ring's two latencies, 0.2 ms) spread over the two.
  EXPECT_NEAR(plan.stages[0].allreduce_s, 2e-4, 1e-12);
  EXPECT_NEAR(plan.stages[0].compute_s, 0.024 + 1e-4, 1e-9);
  EXPECT_NEAR(plan.step_s, 0.048 + 2e-4, 1e-6);
  // Equal shares: the slow replica's half paces the round (120 ms a microbatch, 60 each).
  const Plan equal = evaluate(cost, {{0, 10, {0, 1}, {1, 1}}}, "test");
  EXPECT_NEAR(equal.stages[0].compute_s, 0.060 + 1e-4, 1e-9);
  // The fast device alone: 30 ms a microbatch, two of them.
  const Plan alone = evaluate(cost, {{0, 10, {0}}}, "test");
  EXPECT_NEAR(alone.step_s, 0.060, 1e-9);
}

TEST(ReplicasTest, TheirGradientsCrossTheSlowestLinkOrTheLeastCpu) {
  Problem p = fastAndSlow(4, 100000);  // 1 MB of parameters
  p.options.max_replicas = 2;
  const CostModel wire(p);
  // 2 (k - 1) / k of the bytes over 1e8 bytes/s, plus 2 (k - 1) latencies.
  EXPECT_NEAR(wire.allreduce({0, 1}, 0, 10), 1e6 / 1e8 + 2e-4, 1e-12);
  // A quarter-core node whose messages cost 1 ns of CPU a byte: 1 MB takes 4 ms of its
  // quota, less than the wire's 10 ms; at 10 ns a byte, 40 ms.
  p.node_cores = {1, 0.25};
  p.node_message_cpu = {MessageCpuCost{}, MessageCpuCost{0, 1e-9}};
  EXPECT_NEAR(CostModel(p).allreduce({0, 1}, 0, 10), 1e6 / 1e8 + 2e-4, 1e-12);
  p.node_message_cpu[1].per_byte_s = 1e-8;
  EXPECT_NEAR(CostModel(p).allreduce({0, 1}, 0, 10), 0.04, 1e-12);
}

TEST(ReplicasTest, EachReplicaNeedsTheMemoryOfItsOwnShare) {
  Problem p = fastAndSlow(4);
  const CostModel roomy(p);
  const Plan plan = evaluate(roomy, {{0, 10, {0, 1}, {1, 0.25}}}, "test");
  // The fast replica's microbatches are 1.6 times the mean: so is its stash.
  const int64_t mean = roomy.memory(0, 10, 1, 2, 1);
  EXPECT_GT(plan.stages[0].memory_bytes, mean);
  EXPECT_EQ(plan.stages[0].memory_bytes, roomy.memory(0, 10, 1, 2, 1, 1.6));
  p.devices[0].memory_bytes = mean;  // enough for a mean microbatch, not for its share
  const CostModel tight(p);
  const Plan short_of = evaluate(tight, {{0, 10, {0, 1}, {1, 0.25}}}, "test");
  EXPECT_NE(short_of.infeasible.find("replica 0"), std::string::npos) << short_of.infeasible;
  EXPECT_NE(short_of.infeasible.find("fast/cpu"), std::string::npos) << short_of.infeasible;
}

TEST(ReplicasTest, MixedDevicesNeedShares) {
  const CostModel cost(fastAndSlow(4));
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        evaluate(cost, {{0, 10, {0, 1}}}, "test");
      },
      {"stage 0 replicates over devices of different kinds", "without shares"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        evaluate(cost, {{0, 10, {0, 1}, {1}}}, "test");
      },
      {"1 shares for 2 replicas"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        evaluate(cost, {{0, 10, {0, 1}, {1, 0}}}, "test");
      },
      {"a replica's share of 0"});
}

// A node four times slower shortens the step by a fifth as a replica, where a pipeline
// over the two would fill and drain at the slow node's pace: choosePlan takes the
// replicas, when the job allows replicas at all.
TEST(ReplicasTest, ChoosePlanTakesUnequalReplicasWhereThePipelineLoses) {
  Problem p = fastAndSlow(4);
  p.options.max_replicas = 2;
  const CostModel cost(p);
  const Plan plan = choosePlan(cost);
  ASSERT_EQ(plan.stages.size(), 1u) << planToYaml(cost, plan);
  EXPECT_EQ(plan.stages[0].at.devices, (std::vector<int>{0, 1})) << planToYaml(cost, plan);
  EXPECT_EQ(plan.stages[0].at.shares, (std::vector<double>{1, 0.25}));
  EXPECT_TRUE(plan.left_out.empty());
  EXPECT_NE(plan.algorithm.find("unequal replicas"), std::string::npos);
  // Not without max_replicas; and not where the slow node brings less than the margin.
  p.options.max_replicas = 1;
  const Plan single = choosePlan(CostModel(p));
  for (const PlanStage& s : single.stages) EXPECT_TRUE(s.at.shares.empty());
  Problem slower = fastAndSlow(20);
  slower.options.max_replicas = 2;
  const CostModel slower_cost(slower);
  const Plan without = choosePlan(slower_cost);
  ASSERT_EQ(without.stages.size(), 1u) << planToYaml(slower_cost, without);
  EXPECT_EQ(without.stages[0].at.devices, (std::vector<int>{0}));
  ASSERT_EQ(without.left_out.size(), 1u);
  EXPECT_NE(without.left_out[0].reason.find("unequal replicas with it are predicted"),
            std::string::npos)
      << without.left_out[0].reason;
  // Three microbatches do not divide between two replicas: none priced.
  p.options.max_replicas = 2;
  p.options.microbatches = 3;
  for (const PlanStage& s : choosePlan(CostModel(p)).stages) EXPECT_TRUE(s.at.shares.empty());
}

TEST(ReplicasTest, APlanFileCarriesTheShares) {
  Problem p = fastAndSlow(4);
  p.options.max_replicas = 2;
  const CostModel cost(p);
  const std::string yaml = planToYaml(cost, choosePlan(cost));
  EXPECT_NE(yaml.find("shares: [1, 0.25]"), std::string::npos) << yaml;
  const std::vector<PlanStageSpec> specs = parsePlan(yaml, "plan.yaml");
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs[0].shares, (std::vector<double>{1, 0.25}));
  EXPECT_EQ(specs[0].devices, (std::vector<std::string>{"fast/cpu", "slow/cpu"}));
  const std::string bad =
      "stages:\n  - {layers: [0, 10], devices: [fast/cpu, slow/cpu], backend: cpu, "
      "shares: [1, 2, 3]}\n";
  testing::expectThrowWith<InvalidArgument>([&] { parsePlan(bad, "bad.yaml"); },
                                            {"bad.yaml:2:", "3 shares for the stage's 2 replicas"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        parsePlan(
            "stages:\n  - {layers: [0, 10], devices: [a, b], backend: cpu, "
            "shares: [1, -1]}\n",
            "neg.yaml");
      },
      {"neg.yaml:2:", "share must be in (0, 1e9]"});
}

}  // namespace
}  // namespace tandem::partitioner
