// Generation plans (generation.h): a token's price on one device and over stages against
// hand-worked figures, and the choice of fewest stages within the margin.
#include <gtest/gtest.h>

#include "core/error.h"
#include "partitioner/generation.h"
#include "partitioner/search.h"
#include "tests/test_util.h"

namespace tandem::partitioner {
namespace {

using testing::expectThrowWith;

// `layers` layers decoding in `one` seconds a token for one sequence and `four` for four
// at once, on `devices` devices, each on its own node (or all on one with `one_node`),
// links of `latency` seconds and 1 GB/s, every message costing each node `message_s`
// (both ends together).
Problem decodingProblem(size_t layers, int devices, double one, double four, double latency,
                        double message_s = 0, bool one_node = false, double cores = 0) {
  Problem p;
  for (size_t l = 0; l < layers; ++l) p.layers.push_back({"transformer", 100000, 4000, 4000});
  p.input_bytes = 1000;
  const int nodes = one_node ? 1 : devices;
  for (int n = 0; n < nodes; ++n)
    p.node_names.push_back(std::string("n").append(std::to_string(n)));
  for (int d = 0; d < devices; ++d) {
    DeviceCosts c;
    c.name = std::string(p.node_names[static_cast<size_t>(one_node ? 0 : d)])
                 .append("/cpu")
                 .append(std::to_string(d));
    c.node = one_node ? 0 : d;
    c.memory_bytes = int64_t{1} << 30;
    c.forward_s.assign(layers, 0.001);
    c.backward_s.assign(layers, 0.002);
    c.decode_s.assign(layers, one);
    c.decode_batch_s.assign(layers, four);
    c.decode_batch = 4;
    c.cache_bytes.assign(layers, 0);
    c.host_threads = 1;
    p.devices.push_back(c);
  }
  p.links.assign(static_cast<size_t>(nodes), std::vector<LinkCosts>(static_cast<size_t>(nodes)));
  for (auto& row : p.links)
    for (LinkCosts& l : row) l = {1e9, latency};
  p.node_message_cpu.assign(static_cast<size_t>(nodes), {message_s, 0});
  p.node_cores.assign(static_cast<size_t>(nodes), cores);
  p.options.objective = Objective::kInferThroughput;
  return p;
}

GenerationOptions optionsFor(size_t layers, int64_t in_flight, int64_t bytes = 1000) {
  return {in_flight, std::vector<int64_t>(layers, bytes)};
}

TEST(GenerationTest, DecodingScalesOnTheLineThroughTheProfilesTwoPoints) {
  const CostModel cost(decodingProblem(4, 1, 0.001, 0.0025, 0));
  EXPECT_DOUBLE_EQ(decodeSeconds(cost, 0, 0, 4, 1), 0.004);
  EXPECT_DOUBLE_EQ(decodeSeconds(cost, 0, 0, 4, 4), 0.010);
  EXPECT_DOUBLE_EQ(decodeSeconds(cost, 0, 1, 3, 8), 2 * (0.001 + 7 * 0.0005));
  Problem p = decodingProblem(4, 1, 0.001, 0.0025, 0);
  p.devices[0].decode_s.clear();
  p.devices[0].decode_batch_s.clear();
  p.devices[0].decode_batch = 0;
  const CostModel none(std::move(p));
  expectThrowWith<InvalidArgument>([&] { (void)decodeSeconds(none, 0, 0, 4, 1); },
                                   {"device n0/cpu0 has no decoding times"});
}

TEST(GenerationTest, OneStageDecodesItsSequencesAsOneBatch) {
  // 4 layers of 1 ms (one sequence) and 2.5 ms (four): a step of four sequences takes
  // 10 ms plus four reports of half a 0.1 ms message: 4 / 10.2 ms.
  const CostModel cost(decodingProblem(4, 1, 0.001, 0.0025, 0, 0.0001));
  const GenerationCost c = priceGeneration(cost, {{0, 4, {0}}}, optionsFor(4, 4));
  EXPECT_NEAR(c.tokens_per_s, 4 / 0.0102, 1e-6);
  EXPECT_EQ(c.paced_by, "stage 0 decode");
}

TEST(GenerationTest, StagesArePacedByTheBusiestOrByTheRing) {
  // Two stages of 2 layers, messages free of CPU; a layer decodes k sequences at once in
  // 1 + (k - 1) x 0.5 ms. Far apart (10 ms each way), 2 sequences travel as batches of
  // one: a token's ring is 2 + 10 + 2 + 10 ms (and the bytes' 1 us and 4 ns).
  const CostModel far(decodingProblem(4, 2, 0.001, 0.0025, 0.010));
  const std::vector<Assignment> halves = {{0, 2, {0}}, {2, 4, {1}}};
  const double ring = 0.004 + 2 * 0.010 + 1e-6 + 4e-9;
  const GenerationCost two = priceGeneration(far, halves, optionsFor(4, 2));
  EXPECT_NEAR(two.tokens_per_s, 2 / ring, 1e-6);
  EXPECT_EQ(two.paced_by, "the ring");
  // 16 in flight travel as 2 batches of 8: a stage's pass over a batch is 2 x 4.5 ms, a
  // batch's ring 9 + 10 + 9 + 10 ms and 8 x the bytes: 16 tokens a ring.
  const GenerationCost many = priceGeneration(far, halves, optionsFor(4, 16));
  EXPECT_NEAR(many.tokens_per_s, 16 / (0.038 + 8e-6 + 32e-9), 1e-6);
  EXPECT_EQ(many.paced_by, "the ring");
  // Near (no latency), cut 3 | 1: stage 0's pass of 8 takes 13.5 ms, the ring 18, so
  // stage 0 paces at 8 tokens a pass.
  const CostModel near(decodingProblem(4, 2, 0.001, 0.0025, 0));
  const GenerationCost uneven =
      priceGeneration(near, {{0, 3, {0}}, {3, 4, {1}}}, optionsFor(4, 16));
  EXPECT_NEAR(uneven.tokens_per_s, 8 / 0.0135, 1e-6);
  EXPECT_EQ(uneven.paced_by, "stage 0 decode");
  // Each message costs each end half of 0.2 ms; cut 1 | 3: stage 1 receives a batch and
  // sends its tokens back (0.1 ms each) and reports its 8 tokens (0.1 ms each), so its
  // pass is 13.5 + 0.2 + 0.8 ms.
  const CostModel costly(decodingProblem(4, 2, 0.001, 0.0025, 0, 0.0002));
  const GenerationCost paid =
      priceGeneration(costly, {{0, 1, {0}}, {1, 4, {1}}}, optionsFor(4, 16));
  EXPECT_NEAR(paid.tokens_per_s, 8 / 0.0145, 1e-6);
  EXPECT_EQ(paid.paced_by, "stage 1 decode");
  // Both stages on one node of one core: it does both stages' work for every token,
  // 2 x 9 ms for 8 tokens.
  const CostModel shared(decodingProblem(4, 2, 0.001, 0.0025, 0, 0, true, 1));
  const GenerationCost one_core = priceGeneration(shared, halves, optionsFor(4, 16));
  EXPECT_NEAR(one_core.tokens_per_s, 8 / 0.018, 1e-6);
  EXPECT_EQ(one_core.paced_by, "node n0's cores");
}

TEST(GenerationTest, OneDeviceUnlessASplitBeatsItByTheMargin) {
  // Two equal devices far apart (5 ms each way): with one sequence the ring's trips make
  // any split slower than one device, which decodes the eight layers in 8 ms.
  {
    const CostModel cost(decodingProblem(8, 2, 0.001, 0.0025, 0.005));
    const GenerationPlan g = planGeneration(cost, optionsFor(8, 1));
    ASSERT_EQ(g.plan.stages.size(), 1u);
    EXPECT_NEAR(g.predicted.tokens_per_s, 125, 1e-9);
    EXPECT_NEAR(g.plan.samples_per_s, 125, 1e-9);
    EXPECT_LT(g.best_split.tokens_per_s, g.best_single.tokens_per_s);
  }
  // Decoding many at once is cheap (four at once cost 1.5 x one): with 16 in flight one
  // device takes 8 x 3.5 ms a step of 16 (571 tokens/s); two stages of 4 layers, 5 ms
  // apart, pass a batch of 8 in 4 x 2.17 ms and its ring takes 2 x 8.67 + 10 ms (585):
  // not beyond the margin, so one device.
  {
    const CostModel cost(decodingProblem(8, 2, 0.001, 0.0015, 0.005));
    const GenerationPlan g = planGeneration(cost, optionsFor(8, 16));
    EXPECT_EQ(g.plan.stages.size(), 1u);
    EXPECT_NEAR(g.best_single.tokens_per_s, 16 / 0.028, 1e-6);
    EXPECT_NEAR(g.best_split.tokens_per_s, 16 / (2 * 0.026 / 3 + 0.010 + 8e-6 + 32e-9), 1e-6);
  }
  // Near (no latency) the same split's ring is 17.3 ms: 923 tokens/s, the plan splits.
  {
    const CostModel cost(decodingProblem(8, 2, 0.001, 0.0015, 0));
    const GenerationPlan g = planGeneration(cost, optionsFor(8, 16));
    ASSERT_EQ(g.plan.stages.size(), 2u);
    EXPECT_EQ(g.plan.stages[0].at.end, 4u);
    EXPECT_NEAR(g.predicted.tokens_per_s, 16 / (2 * 0.026 / 3 + 8e-6 + 32e-9), 1e-6);
    EXPECT_NEAR(g.best_single.tokens_per_s, 16 / 0.028, 1e-6);
    EXPECT_EQ(g.plan.bottleneck, g.predicted.paced_by);
  }
}

TEST(GenerationTest, CutsGiveTheSlowerDeviceFewerLayersAndSkipWhatCannotHoldThem) {
  // Device 1 decodes three times slower than device 0: of 8 layers it gets 2.
  Problem p = decodingProblem(8, 2, 0.001, 0.004, 0);
  for (double& t : p.devices[1].decode_s) t *= 3;
  for (double& t : p.devices[1].decode_batch_s) t *= 3;
  {
    const CostModel cost(p);
    const GenerationPlan g = planGeneration(cost, optionsFor(8, 16));
    ASSERT_EQ(g.plan.stages.size(), 2u);
    const auto& a = g.plan.stages[0].at;
    const auto& b = g.plan.stages[1].at;
    const size_t slow = a.devices[0] == 1 ? a.end - a.begin : b.end - b.begin;
    EXPECT_EQ(slow, 2u);
  }
  // Neither device holds the model alone, each holds half of it: the plan splits.
  p = decodingProblem(8, 2, 0.001, 0.0025, 0.005);
  const int64_t half =
      evaluate(CostModel(p), {{0, 4, {0}}, {4, 8, {1}}}, "halves").stages[0].memory_bytes;
  p.devices[0].memory_bytes = p.devices[1].memory_bytes = half;
  const CostModel tight(std::move(p));
  const GenerationPlan g = planGeneration(tight, optionsFor(8, 1));
  EXPECT_GE(g.plan.stages.size(), 2u);
  EXPECT_EQ(g.best_single.tokens_per_s, 0);
  // The sequences' caches count: 10 kB a layer each, so one device holds the model and
  // one sequence's caches with room for no more, and 8 in flight need two devices.
  p = decodingProblem(8, 2, 0.001, 0.0025, 0.005);
  const int64_t whole = evaluate(CostModel(p), {{0, 8, {0}}}, "whole").stages[0].memory_bytes;
  p.devices[0].memory_bytes = p.devices[1].memory_bytes = whole + 8 * 10000;
  for (DeviceCosts& d : p.devices) d.cache_bytes.assign(8, 10000);
  const CostModel caches(p);
  EXPECT_EQ(planGeneration(caches, optionsFor(8, 1)).plan.stages.size(), 1u);
  const GenerationPlan eight = planGeneration(caches, optionsFor(8, 8));
  ASSERT_EQ(eight.plan.stages.size(), 2u);
  EXPECT_EQ(eight.best_single.tokens_per_s, 0);
  for (const PlanStage& st : eight.plan.stages)
    EXPECT_GE(st.memory_bytes, 8 * 10000 * static_cast<int64_t>(st.at.end - st.at.begin));
  p = decodingProblem(8, 1, 0.001, 0.0025, 0);
  p.devices[0].memory_bytes = half;
  const CostModel none(std::move(p));
  expectThrowWith<InvalidArgument>([&] { (void)planGeneration(none, optionsFor(8, 1)); },
                                   {"generation: no device, nor any split"});
}

TEST(GenerationTest, DevicesWithoutDecodingTimesAreLeftOut) {
  // Device 1 (an OpenCL device that cannot decode the model, say) has no decoding times:
  // the plan is device 0's alone, and with no device timed the error says so.
  Problem p = decodingProblem(8, 2, 0.001, 0.004, 0);
  p.devices[1].decode_s.clear();
  p.devices[1].decode_batch_s.clear();
  p.devices[1].cache_bytes.clear();
  p.devices[1].decode_batch = 0;
  const GenerationPlan g = planGeneration(CostModel(p), optionsFor(8, 16));
  ASSERT_EQ(g.plan.stages.size(), 1u);
  EXPECT_EQ(g.plan.stages[0].at.devices, std::vector<int>{0});
  EXPECT_EQ(g.best_split.tokens_per_s, 0);
  Problem none = decodingProblem(8, 1, 0.001, 0.004, 0);
  none.devices[0].decode_s.clear();
  none.devices[0].decode_batch_s.clear();
  none.devices[0].cache_bytes.clear();
  none.devices[0].decode_batch = 0;
  expectThrowWith<InvalidArgument>(
      [&] { (void)planGeneration(CostModel(none), optionsFor(8, 1)); },
      {"generation: no device has decoding times in its profile", "n0/cpu0's has none"});
}

}  // namespace
}  // namespace tandem::partitioner
