// Splits priced by their step (refineByStep, search.h): a cut moves to where fewer bytes
// cross when that shortens the step though the slowest stage grows; refinement never
// lengthens a step, never breaks memory or what a device runs; device selection applies
// its margin to every device it leaves out.
#include <gtest/gtest.h>

#include <set>

#include "partitioner/random_problem.h"
#include "partitioner/search.h"

namespace tandem::partitioner {
namespace {

// A CNN's shape in four layers on two nodes 1 GB/s apart: a small conv, a big conv whose
// 1 MB output the next layer (a pool) shrinks to 250 kB, and a classifier as long as the
// big conv. Times in ms, forward + backward: 0.6 | 10 | 0.2 | 9.
Problem poolAfterTheBigConv() {
  Problem p;
  p.layers = {{"conv2d", 0, 1000000, 1000000},
              {"conv2d", 0, 1000000, 1000000},
              {"maxpool2d", 0, 250000, 250000},
              {"linear", 0, 1000, 1000}};
  p.input_bytes = 1000;
  const std::vector<double> f = {2e-4, 3e-3, 1e-4, 3e-3}, b = {4e-4, 7e-3, 1e-4, 6e-3};
  for (int d = 0; d < 2; ++d) {
    const std::string node = d == 0 ? "n0" : "n1";
    p.node_names.push_back(node);
    p.devices.push_back({node + "/cpu", d, int64_t{1} << 40, f, b});
  }
  p.links = {{{1e12, 0}, {1e9, 0}}, {{1e9, 0}, {1e12, 0}}};
  p.options.microbatches = 4;
  return p;
}

std::vector<Assignment> assignments(const Plan& p) {
  std::vector<Assignment> out;
  for (const PlanStage& s : p.stages) out.push_back(s.at);
  return out;
}

TEST(RefineTest, ACutMovesToWhereFewerBytesCrossWhenThatShortensTheStep) {
  const CostModel cost(poolAfterTheBigConv());
  // The search paces the slowest stage: the cut after the big conv (10.6 ms against 10.8
  // after the pool), though its 1 MB crosses the link both ways in the fill and drain.
  const Plan searched = bestPlan(cost);
  ASSERT_EQ(searched.stages.size(), 2u);
  ASSERT_EQ(searched.stages[0].at.end, 2u) << planToYaml(cost, searched);
  const Plan refined = refineByStep(cost, searched);
  ASSERT_EQ(refined.stages.size(), 2u);
  EXPECT_EQ(refined.stages[0].at.end, 3u) << planToYaml(cost, refined);
  EXPECT_GT(refined.seconds, searched.seconds);
  EXPECT_LT(refined.step_s, searched.step_s * 0.99);
  EXPECT_EQ(refined.algorithm, searched.algorithm + " + step");
  // No two-stage split is shorter: every cut, both device orders.
  for (size_t cut = 1; cut < cost.layers(); ++cut)
    for (const std::vector<int>& order : {std::vector<int>{0, 1}, std::vector<int>{1, 0}}) {
      const Plan other =
          evaluate(cost, {{0, cut, {order[0]}}, {cut, cost.layers(), {order[1]}}}, "brute");
      EXPECT_GE(other.step_s, refined.step_s * (1 - 1e-9)) << "cut " << cut;
    }
  // choosePlan runs it: the plan and its file say so.
  const Plan chosen = choosePlan(cost);
  EXPECT_EQ(chosen.stages[0].at.end, 3u) << planToYaml(cost, chosen);
  EXPECT_NE(planToYaml(cost, chosen).find("algorithm: exact + step"), std::string::npos);
  // With one microbatch nothing overlaps: one device wins, named by the search that
  // priced it, not as a moved split.
  Problem one = poolAfterTheBigConv();
  one.options.microbatches = 1;
  const CostModel single(one);
  ASSERT_EQ(refineByStep(single, bestPlan(single)).algorithm, "exact + step");
  const Plan alone_chosen = choosePlan(single);
  ASSERT_EQ(alone_chosen.stages.size(), 1u) << planToYaml(single, alone_chosen);
  EXPECT_EQ(alone_chosen.algorithm, "exact");
  // A plan that cannot move is returned as it is.
  const Plan alone = evaluate(cost, {{0, cost.layers(), {0}}}, "alone");
  EXPECT_EQ(refineByStep(cost, alone).algorithm, "alone");
  EXPECT_EQ(refineByStep(cost, refined).algorithm, refined.algorithm);
}

TEST(RefineTest, MemoryAndWhatADeviceRunsBoundTheCut) {
  // The pool and classifier's layers do not fit beside the big conv on n0: the cut stays.
  Problem p = poolAfterTheBigConv();
  p.layers[2].param_bytes = p.layers[3].param_bytes = 1000000;
  p.devices[0].memory_bytes = CostModel(p).memory(0, 2, 2, 1) + 1000;
  const CostModel small(p);
  const Plan searched = evaluate(small, {{0, 2, {0}}, {2, 4, {1}}}, "exact");
  ASSERT_TRUE(searched.infeasible.empty()) << searched.infeasible;
  const Plan refined = refineByStep(small, searched);
  EXPECT_TRUE(refined.infeasible.empty()) << planToYaml(small, refined);
  EXPECT_EQ(refined.stages[0].at.end, 2u) << planToYaml(small, refined);
  // n0 lacks the pool's op: the cut cannot take it there either.
  Problem q = poolAfterTheBigConv();
  q.devices[0].lacks = {"", "", "lacks maxpool2d", ""};
  const CostModel lacking(q);
  const Plan refined_q =
      refineByStep(lacking, evaluate(lacking, {{0, 2, {0}}, {2, 4, {1}}}, "exact"));
  for (const PlanStage& s : refined_q.stages)
    if (s.at.devices[0] == 0) {
      EXPECT_LE(s.at.end, 2u) << planToYaml(lacking, refined_q);
    }
}

TEST(RefineTest, NeverLengthensAStepAndTheChoiceIsNeverSlowerThanABaseline) {
  // Devices on three nodes, or all on one node of two cores (stages then share them). Among
  // these, seeds 61 (three nodes) and 64, 72 (one node) have a baseline predicted faster
  // than the search's split moved by refineByStep.
  for (const int nodes : {3, 1})
    for (uint64_t seed = 55; seed <= 74; ++seed) {
      RandomProblemOptions o;
      o.layers = seed % 2 ? 8 : 12;
      o.devices = 4;
      o.kinds = 3;
      o.nodes = nodes;
      o.memory_min = 0.5;
      o.memory_max = 2;
      o.seed = seed;
      o.cost.microbatches = static_cast<int64_t>(1 + seed % 8);
      o.cost.max_replicas = nodes == 3 && seed % 3 == 0 ? 2 : 1;
      Problem problem = randomProblem(o);
      if (nodes == 1) problem.node_cores = {2.0};
      const CostModel cost(problem);
      const Plan searched = bestPlan(cost);
      const Plan refined = refineByStep(cost, searched);
      EXPECT_TRUE(refined.infeasible.empty()) << "seed " << seed;
      EXPECT_LE(refined.step_s, searched.step_s) << "seed " << seed;
      // The same stages, priced again, give the same figures (shares included).
      const Plan again = evaluate(cost, assignments(refined), "again");
      EXPECT_EQ(again.step_s, refined.step_s) << "seed " << seed;
      // Every baseline that fits is priced too: stepPlan is never slower than one, and the
      // chosen plan at most the selection margin slower (it may use fewer devices within it).
      const Plan step = stepPlan(cost), chosen = choosePlan(cost);
      EXPECT_LE(step.step_s, refined.step_s) << "seed " << seed;
      for (const Plan& b : baselinePlans(cost)) {
        if (!b.infeasible.empty()) continue;
        EXPECT_LE(step.step_s, b.step_s * (1 + 1e-9)) << "seed " << seed << " " << b.algorithm;
        EXPECT_LE(chosen.step_s, b.step_s * (1 + kSelectionMargin) * (1 + 1e-9))
            << "seed " << seed << " " << b.algorithm;
      }
    }
}

TEST(RefineTest, EveryDeviceLeftOutGainedLessThanTheMargin) {
  // Two equal devices and a third three times slower, 16 microbatches: the third shortens
  // the step by about 3%, less than the 15% a device must bring, so it is left out, saying
  // so. Before, a device was left out only when its absence was faster outright.
  Problem p;
  for (size_t l = 0; l < 24; ++l) p.layers.push_back({"relu", 0, 1000, 1000});
  p.input_bytes = 1000;
  for (int d = 0; d < 3; ++d) {
    // Appended: GCC 12 at -O3 warns falsely (-Wrestrict) on a literal plus a string.
    const std::string node = std::string("n").append(std::to_string(d));
    const double slow = d == 2 ? 3 : 1;
    p.node_names.push_back(node);
    p.devices.push_back({std::string(node).append("/cpu"), d, int64_t{1} << 40,
                         std::vector<double>(24, 1e-3 * slow),
                         std::vector<double>(24, 2e-3 * slow)});
  }
  p.links.assign(3, std::vector<LinkCosts>(3, LinkCosts{1e12, 0}));
  p.options.microbatches = 16;
  const CostModel cost(p);
  const Plan all = refineByStep(cost, bestPlan(cost));
  std::set<int> used_all;
  for (const PlanStage& s : all.stages) used_all.insert(s.at.devices.begin(), s.at.devices.end());
  ASSERT_EQ(used_all.size(), 3u) << planToYaml(cost, all);
  const Plan chosen = choosePlan(cost);
  ASSERT_EQ(chosen.stages.size(), 2u) << planToYaml(cost, chosen);
  EXPECT_GT(chosen.step_s, all.step_s);
  EXPECT_LE(chosen.step_s, all.step_s * (1 + kSelectionMargin));
  ASSERT_EQ(chosen.left_out.size(), 1u);
  EXPECT_EQ(chosen.left_out[0].device, 2);
  EXPECT_NE(chosen.left_out[0].reason.find("within the 15% a device must bring"), std::string::npos)
      << chosen.left_out[0].reason;
}

}  // namespace
}  // namespace tandem::partitioner
