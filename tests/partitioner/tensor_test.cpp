// Tensor-split stages in the partitioner (Assignment::tensor, cost_model.h): what a split
// makes of a range's layers (the model's own split, from any first layer), a split stage
// priced as its ranks' parts with the group's all-reduces, the exact search choosing a
// split where it shortens the bottleneck and not where the all-reduces cost more than it
// saves, the ranks' threads on their node's cores, and plan files carrying the split.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/model_spec.h"
#include "partitioner/cluster.h"
#include "partitioner/search.h"
#include "partitioner/simulate.h"
#include "tests/test_util.h"

namespace tandem::partitioner {
namespace {

// A linear pair (0 column, 1 relu between, 2 row) and a linear after it.
constexpr const char* kPairNet = R"(name: pair
input: [16]
layers:
  - linear: {out: 32}
  - relu
  - linear: {out: 16}
  - linear: {out: 8}
)";

// kPairNet on one node's `devices` CPUs of one thread each, microbatches of 8; per
// microbatch layer l takes forward[l] and twice that backward.
Problem pairProblem(const std::vector<double>& forward, int devices = 2) {
  CostOptions o;
  o.microbatches = 4;
  o.microbatch_size = 8;
  o.max_tensor = 2;
  Problem p = modelProblem(Model(parseModelSpec(kPairNet)), o);
  p.node_names = {"n"};
  std::vector<double> backward;
  for (const double f : forward) backward.push_back(2 * f);
  for (int d = 0; d < devices; ++d) {
    DeviceCosts c{"n/cpu" + std::to_string(d), 0, int64_t{1} << 30, forward, backward};
    c.host_threads = 1;
    c.update_s_per_param_byte = 1e-9;
    p.devices.push_back(std::move(c));
  }
  p.links = {{LinkCosts{1e9, 5e-5}}};
  p.node_cores = {2};
  p.node_group_allreduce = {GroupAllreduceCost{1e-4, 1e-8}};
  return p;
}

std::vector<TensorKind> kinds(const std::vector<TensorRole>& roles) {
  std::vector<TensorKind> out;
  for (const TensorRole& r : roles) out.push_back(static_cast<TensorKind>(r.kind));
  return out;
}

TEST(TensorPlanTest, ARangesRolesAreTheModelsSplitOfThatRange) {
  // From every first layer to every end, on models with pairs of both kinds, pairs that
  // chain (linear, linear, linear) and blocks that split inside.
  for (const char* file : {"cnn.yaml", "mlp-deep.yaml", "resnet-mini.yaml", "gpt-mini.yaml"}) {
    const Model model(loadModelSpec(std::string(TANDEM_SOURCE_DIR) + "/examples/models/" + file));
    const CostModel cost([&] {
      Problem p = modelProblem(model, {});
      p.node_names = {"n"};
      p.devices.push_back({"n/cpu", 0, 1, std::vector<double>(model.size(), 1e-3),
                           std::vector<double>(model.size(), 2e-3)});
      p.links = {{LinkCosts{1e9, 0}}};
      return p;
    }());
    for (size_t b = 0; b < model.size(); ++b)
      for (size_t e = b + 1; e <= model.size(); ++e)
        ASSERT_EQ(cost.tensorRoles(b, e), kinds(model.tensorRoles(b, e)))
            << file << " [" << b << ", " << e << ")";
  }
  // The CNN's whole range: both convolutions a pair (the pooling between on slices), and
  // the classifier's linear pair.
  const Model cnn(loadModelSpec(TANDEM_SOURCE_DIR "/examples/models/cnn.yaml"));
  using K = TensorKind;
  EXPECT_EQ(kinds(cnn.tensorRoles(0, 10)),
            (std::vector<K>{K::kColumn, K::kSlice, K::kSlice, K::kRow, K::kWhole, K::kWhole,
                            K::kWhole, K::kColumn, K::kSlice, K::kRow}));
  // A block counts the all-reduces it runs: a transformer's attention and MLP, one each.
  const Model gpt(loadModelSpec(TANDEM_SOURCE_DIR "/examples/models/gpt-mini.yaml"));
  const Problem p = modelProblem(gpt, {});
  int blocks = 0;
  for (size_t l = 0; l < gpt.size(); ++l)
    if (p.layers[l].type == "transformer") {
      EXPECT_EQ(p.layers[l].tensor_allreduces, 2) << l;
      ++blocks;
    }
  EXPECT_GT(blocks, 0);
}

TEST(TensorPlanTest, ASplitStageIsPricedAsItsRanksPartsWithTheGroupsAllreduces) {
  const CostModel cost(pairProblem({0.004, 0.001, 0.004, 0.002}));
  auto allreduce = [](double bytes) { return 1e-4 + 1e-8 * bytes; };
  // [0, 4) over 2 ranks: the pair's three layers halved, the last whole; the row layer's
  // output (16 floats x 8) summed forward. Backward: layer 0 is the first stage's first
  // layer with parameters, which computes no input gradient, so its column part sums none.
  EXPECT_NEAR(cost.forward(0, 0, 4, 2), 0.002 + 0.0005 + 0.002 + 0.002 + allreduce(512), 1e-12);
  EXPECT_NEAR(cost.backward(0, 0, 4, 2), 0.004 + 0.001 + 0.004 + 0.004, 1e-12);
  EXPECT_NEAR(cost.tensorAllreduce(0, 0, 4, 2), allreduce(512), 1e-12);
  // [1, 4): relu whole, layers 2 and 3 the pair; the row's output (8 x 8 floats) forward,
  // the column's input gradient (32 x 8 floats) backward.
  EXPECT_NEAR(cost.forward(0, 1, 4, 2), 0.001 + 0.002 + 0.001 + allreduce(256), 1e-12);
  EXPECT_NEAR(cost.backward(0, 1, 4, 2), 0.002 + 0.004 + 0.002 + allreduce(1024), 1e-12);
  EXPECT_NEAR(cost.compute(0, 1, 4, 2), cost.forward(0, 1, 4, 2) + cost.backward(0, 1, 4, 2),
              1e-12);
  // Weight gradients: half of each layer with parameters' backward, over its ranks; the
  // first stage's first layer's whole backward, which 1F1B-split schedules run in place.
  EXPECT_NEAR(cost.weightGradient(0, 1, 4, 2), 0.002 + 0.001, 1e-12);
  EXPECT_NEAR(cost.weightGradient(0, 0, 4, 2), 0.004 + 0.002 + 0.002, 1e-12);
  EXPECT_NEAR(cost.deferredWeightGradient(0, 0, 4, 2), 0.002 + 0.002, 1e-12);
  // The update: the split layers' parameters (2176 + 2112 bytes) over the ranks, the last
  // layer's 544 whole. Memory: each rank holds half the split layers' weights, gradients
  // and (momentum) state.
  EXPECT_NEAR(cost.update(0, 0, 4, 2), (544 + 4288 / 2) * 1e-9, 1e-15);
  EXPECT_EQ(cost.memory(0, 4, 1, 1, 0, 1, 2), cost.memory(0, 4, 1, 1) - 3 * 4288 / 2);
  // Nothing splits in [3, 4), nor in [0, 2) (its pair's row lies past it).
  EXPECT_FALSE(cost.tensorSplits(3, 4));
  EXPECT_FALSE(cost.tensorSplits(0, 2));
  EXPECT_TRUE(std::isinf(cost.compute(0, 0, 2, 2)));
  // Not measured: the ring over the node's local link (2 (k - 1) / k bytes, 2 (k - 1)
  // latencies).
  Problem p = pairProblem({0.004, 0.001, 0.004, 0.002});
  p.node_group_allreduce.clear();
  EXPECT_NEAR(CostModel(p).groupAllreduce(0, 1e6, 2), 1e6 / 1e9 + 2 * 5e-5, 1e-12);
  EXPECT_NEAR(cost.groupAllreduce(0, 1e6, 3), 2 * 1e-4 + 1e-2, 1e-12);
}

TEST(TensorPlanTest, TheSearchSplitsTheBottleneckPairAndKeepsOutCostlyAllreduces) {
  // The pair's row layer is 30 ms: no cut balances two stages, a split halves it.
  const std::vector<double> times = {0.010, 0.0001, 0.030, 0.0001};
  const CostModel cost(pairProblem(times));
  const Plan plan = exactPlan(cost);
  ASSERT_EQ(plan.stages.size(), 1u) << planToYaml(cost, plan);
  EXPECT_TRUE(plan.stages[0].at.tensor);
  EXPECT_EQ(plan.stages[0].at.devices.size(), 2u);
  EXPECT_NEAR(plan.seconds, cost.stage(0, 0, 4, 1, 2), 1e-12);
  // The heuristic's local search finds it too (a stage made tensor-split).
  const Plan heuristic = heuristicPlan(cost);
  EXPECT_TRUE(splitsTensors(heuristic)) << planToYaml(cost, heuristic);
  EXPECT_NEAR(heuristic.seconds, plan.seconds, 1e-12);
  // Layer-wise only: two stages, the row layer's the bottleneck.
  Problem layers = pairProblem(times);
  layers.options.max_tensor = 1;
  const CostModel layer_cost(layers);
  const Plan layer_only = exactPlan(layer_cost);
  EXPECT_FALSE(splitsTensors(layer_only));
  EXPECT_GT(layer_only.seconds, 1.4 * plan.seconds);
  // choosePlan takes the split: its step is shorter by far more than the margin.
  EXPECT_TRUE(splitsTensors(choosePlan(cost)));
  EXPECT_GT(choosePlan(layer_cost).step_s, 1.4 * choosePlan(cost).step_s);
  // All-reduces of 100 ms each: never split.
  Problem costly = pairProblem(times);
  costly.node_group_allreduce = {GroupAllreduceCost{0.1, 0}};
  EXPECT_FALSE(splitsTensors(exactPlan(CostModel(costly))));
  EXPECT_FALSE(splitsTensors(heuristicPlan(CostModel(costly))));
  EXPECT_FALSE(splitsTensors(choosePlan(CostModel(costly))));
  // A problem without the model's roles (made by hand) splits nothing.
  Problem bare = pairProblem(times);
  bare.tensor_roles.clear();
  EXPECT_FALSE(splitsTensors(exactPlan(CostModel(bare))));
}

TEST(TensorPlanTest, TheRanksThreadsShareTheirNodesCores) {
  Problem p = pairProblem({0.010, 0.0001, 0.030, 0.0001});
  const Plan two_cores = evaluate(CostModel(p), {{0, 4, {0, 1}, {}, true}}, "test");
  p.node_cores = {1};
  const CostModel one_core(p);
  const Plan one = evaluate(one_core, {{0, 4, {0, 1}, {}, true}}, "test");
  // Two ranks of one thread on one core: each computes at half speed.
  EXPECT_GT(one.step_s, 1.8 * two_cores.step_s);
  // The whole model on one device of that core is then as fast or faster.
  const Plan alone = evaluate(one_core, {{0, 4, {0}}}, "test");
  EXPECT_LT(alone.step_s, one.step_s);
}

TEST(TensorPlanTest, BadSplitsAreRefusedOrNamedAndPlanFilesCarryThem) {
  const CostModel cost(pairProblem({0.004, 0.001, 0.004, 0.002}, 3));
  tandem::testing::expectThrowWith<InvalidArgument>(
      [&] {
        evaluate(cost, {{0, 4, {0}, {}, true}}, "test");
      },
      {"stage 0 is tensor-split: 2 ranks or more"});
  Problem two_nodes = pairProblem({0.004, 0.001, 0.004, 0.002});
  two_nodes.node_names = {"n", "m"};
  two_nodes.devices[1].node = 1;
  two_nodes.links = {{LinkCosts{1e9, 5e-5}, LinkCosts{1e8, 1e-4}},
                     {LinkCosts{1e8, 1e-4}, LinkCosts{1e9, 5e-5}}};
  two_nodes.node_cores = {2, 2};
  two_nodes.node_group_allreduce.assign(2, GroupAllreduceCost{1e-4, 1e-8});
  tandem::testing::expectThrowWith<InvalidArgument>(
      [&] {
        evaluate(CostModel(two_nodes), {{0, 4, {0, 1}, {}, true}}, "test");
      },
      {"stage 0 is tensor-split over devices of two nodes"});
  Problem kinds = pairProblem({0.004, 0.001, 0.004, 0.002});
  kinds.devices[1].forward_s[0] *= 2;
  tandem::testing::expectThrowWith<InvalidArgument>(
      [&] {
        evaluate(CostModel(kinds), {{0, 4, {0, 1}, {}, true}}, "test");
      },
      {"tensor-split over devices of different kinds without shares"});
  const Plan nothing = evaluate(cost, {{0, 3, {0}}, {3, 4, {1, 2}, {}, true}}, "test");
  EXPECT_EQ(nothing.infeasible, "stage 1 (layers [3, 4)) holds nothing to tensor-split");
  // A plan file says which stage is split over which ranks, and reads back so.
  const Plan plan = evaluate(cost, {{0, 3, {0, 1}, {}, true}, {3, 4, {2}}}, "test");
  ASSERT_TRUE(plan.infeasible.empty()) << plan.infeasible;
  EXPECT_GT(plan.stages[0].tensor_allreduce_s, 0);
  const std::string yaml = planToYaml(cost, plan);
  EXPECT_NE(yaml.find("tensor: true"), std::string::npos) << yaml;
  const std::vector<PlanStageSpec> specs = parsePlan(yaml, "plan.yaml");
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_TRUE(specs[0].tensor);
  EXPECT_EQ(specs[0].devices, (std::vector<std::string>{"n/cpu0", "n/cpu1"}));
  EXPECT_EQ(specs[0].backends, (std::vector<std::string>{"cpu", "cpu"}));
  EXPECT_FALSE(specs[1].tensor);
  tandem::testing::expectThrowWith<InvalidArgument>(
      [&] {
        parsePlan("stages:\n  - {layers: [0, 4], devices: [n/cpu0], backend: cpu, tensor: true}\n",
                  "p.yaml");
      },
      {"p.yaml:2:5", "a tensor-split stage names its 2 ranks or more in 'devices'"});
  // Unequal ranks' shares are the plan's too.
  const Plan unequal = evaluate(cost, {{0, 3, {0, 1}, {1, 0.5}, true}, {3, 4, {2}}}, "test");
  const std::vector<PlanStageSpec> read = parsePlan(planToYaml(cost, unequal), "plan.yaml");
  EXPECT_EQ(read[0].shares, (std::vector<double>{1, 0.5}));
  EXPECT_TRUE(read[0].tensor);
  tandem::testing::expectThrowWith<InvalidArgument>(
      [&] {
        parsePlan("stages:\n  - {layers: [0, 4], devices: [n/cpu0], backend: cpu, tensor: 3}\n",
                  "p.yaml");
      },
      {"p.yaml:2:63", "'tensor' must be true or false"});
}

// kPairNet on a fast CPU and a device `slow` times slower of one node (another kind).
Problem unequalProblem(double slow, const std::vector<double>& forward) {
  Problem p = pairProblem(forward);
  for (double& f : p.devices[1].forward_s) f *= slow;
  for (double& b : p.devices[1].backward_s) b *= slow;
  p.devices[1].name = "n/gpu";
  p.devices[1].backend = "opencl:0";
  return p;
}

TEST(TensorPlanTest, UnequalRanksTakeSharesByTheirSpeedAndEachLayerItsSlowestPart) {
  const std::vector<double> times = {0.004, 0.001, 0.004, 0.002};
  const CostModel cost(unequalProblem(3, times));
  ASSERT_NE(cost.typeOf(0), cost.typeOf(1));
  const std::vector<int> types = {cost.typeOf(0), cost.typeOf(1)};
  // In proportion to their speed: the slow device takes a quarter of each split layer.
  const std::vector<double> shares = cost.balancedTensorShares(types, 0, 4);
  ASSERT_EQ(shares.size(), 2u);
  EXPECT_DOUBLE_EQ(shares[0], 1);
  EXPECT_NEAR(shares[1], 1.0 / 3, 1e-12);
  const CostModel::TensorStage t = cost.tensorStage(types, shares, 0, 4);
  auto allreduce = [](double bytes) { return 1e-4 + 1e-8 * bytes; };
  // Split layers: 3/4 on the fast rank, 1/4 at 3 times the time on the slow: 3/4 of the
  // fast device's time each. The last layer, whole on both: the slow device's.
  EXPECT_NEAR(t.forward, 0.75 * (0.004 + 0.001 + 0.004) + 3 * 0.002 + allreduce(512), 1e-12);
  EXPECT_NEAR(t.backward, 0.75 * (0.008 + 0.002 + 0.008) + 3 * 0.004, 1e-12);
  // Each rank's memory against its own device: the fast one holds 3/4 of the split state.
  const Plan plan = evaluate(cost, {{0, 4, {0, 1}, shares, true}}, "test");
  ASSERT_TRUE(plan.infeasible.empty()) << plan.infeasible;
  EXPECT_EQ(plan.stages[0].memory_bytes,
            cost.memory(0, 4, 1, 1, 1) - static_cast<int64_t>(t.split_state * 0.25));
  EXPECT_NEAR(plan.stages[0].compute_s, t.compute(true) + t.update / 4, 1e-12);
  Problem small = unequalProblem(3, times);
  small.devices[0].memory_bytes = plan.stages[0].memory_bytes - 1;
  EXPECT_NE(evaluate(CostModel(small), {{0, 4, {0, 1}, shares, true}}, "test")
                .infeasible.find("rank 0 (layers [0, 4)) needs"),
            std::string::npos);
}

TEST(TensorPlanTest, TheWholeModelIsSplitOverUnequalRanksWhenThatBeatsTheMargin) {
  // Mostly split layers: a device 2x slower takes a third, the step about 2/3 of the fast
  // device's alone (beyond the 15% margin); one 10x slower would save under a tenth.
  const std::vector<double> times = {0.010, 0.0001, 0.010, 0.0001};
  const Plan gained = choosePlan(CostModel(unequalProblem(2, times)));
  ASSERT_EQ(gained.stages.size(), 1u);
  EXPECT_TRUE(gained.stages[0].at.tensor);
  EXPECT_EQ(gained.stages[0].at.devices.size(), 2u);
  EXPECT_NEAR(gained.stages[0].at.shares[1], 0.5, 1e-9);
  EXPECT_NE(gained.algorithm.find("unequal tensor ranks"), std::string::npos) << gained.algorithm;
  const Plan kept = choosePlan(CostModel(unequalProblem(10, times)));
  EXPECT_FALSE(splitsTensors(kept)) << kept.algorithm;
  Problem no_tensor = unequalProblem(2, times);
  no_tensor.options.max_tensor = 1;
  EXPECT_FALSE(splitsTensors(choosePlan(CostModel(no_tensor))));
}

}  // namespace
}  // namespace tandem::partitioner
