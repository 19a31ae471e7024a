// Interleaved plans (Plan::chunks, interleavedPlan): their validation, their predicted
// step against interleaved 1F1B's own unit-time run, their memory, and the DP's cuts
// against every other cut.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "core/pipeline/schedule.h"
#include "partitioner/search.h"
#include "partitioner/simulate.h"
#include "tests/test_util.h"

namespace tandem::partitioner {
namespace {

using tandem::testing::expectThrowWith;

// `layers` parameterless layers, each `f` forward and `2f` backward times `slow[d]` on
// device d, one node each, free links.
Problem chainProblem(size_t layers, const std::vector<double>& slow, double f = 0.001) {
  Problem p;
  for (size_t l = 0; l < layers; ++l) p.layers.push_back({"relu", 0, 1000, 1000});
  p.input_bytes = 1000;
  const auto n = static_cast<int>(slow.size());
  for (int d = 0; d < n; ++d) {
    const std::string node = std::string("n").append(std::to_string(d));
    p.node_names.push_back(node);
    const double k = slow[static_cast<size_t>(d)];
    p.devices.push_back({std::string(node).append("/cpu"), d, int64_t{1} << 40,
                         std::vector<double>(layers, f * k),
                         std::vector<double>(layers, 2 * f * k)});
  }
  p.links.assign(slow.size(), std::vector<LinkCosts>(slow.size(), LinkCosts{1e15, 0}));
  return p;
}

// p x v equal chunks, chunk k on device k % p.
std::vector<Assignment> evenChunks(size_t layers, int p, int v) {
  std::vector<Assignment> out;
  const size_t per = layers / static_cast<size_t>(p * v);
  for (int k = 0; k < p * v; ++k)
    out.push_back({static_cast<size_t>(k) * per, static_cast<size_t>(k + 1) * per, {k % p}});
  return out;
}

TEST(InterleaveTest, EqualChunksTakeTheScheduleMakespan) {
  // Free links and equal chunks: a step is interleaved 1F1B's unit-time makespan, a
  // chunk's forward one tick and its backward two, and shorter than 1F1B's over the same
  // stages when the microbatches come in whole groups of p (otherwise its last group
  // leaves stages idle: with p = 3 and m = 4 it is 3% longer, which the planner prices).
  const size_t layers = 72;
  for (const int p : {2, 3, 4})
    for (const int v : {2, 3})
      for (const int64_t m : {2, 3, 4, 6, 8}) {
        Problem problem = chainProblem(layers, std::vector<double>(static_cast<size_t>(p), 1));
        problem.options.microbatches = m;
        problem.options.schedule = ScheduleKind::kInterleaved1F1B;
        const CostModel cost(problem);
        const Plan plan = evaluate(cost, evenChunks(layers, p, v), "even", {}, v);
        ASSERT_EQ(plan.chunks, v);
        const StepPrediction r = predictStep(cost, plan);
        const ScheduleReport unit =
            validateSchedule(scheduleActions(ScheduleKind::kInterleaved1F1B, p, m, v), m, true, 2);
        const double tick = 0.001 * static_cast<double>(layers) / (p * v);
        const std::string what =
            "p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m);
        EXPECT_NEAR(r.step_s, static_cast<double>(unit.makespan) * tick, 1e-9) << what;
        EXPECT_NEAR(r.bubble, unit.bubble, 1e-9) << what;
        ASSERT_EQ(r.busy_s.size(), static_cast<size_t>(p)) << what;
        // The same stages, one range each, under 1F1B.
        Problem flat = problem;
        flat.options.schedule = ScheduleKind::k1F1B;
        const CostModel one(flat);
        const Plan whole = evaluate(one, evenChunks(layers, p, 1), "even");
        if (m % p == 0) {
          EXPECT_LT(r.step_s, whole.step_s - 1e-9) << what;
        }
        // The slowest stage paces both: its chunks' compute summed.
        EXPECT_NEAR(plan.seconds, whole.seconds, 1e-9) << what;
      }
}

TEST(InterleaveTest, AStagesMemoryIsItsChunksWithTheScheduleStash) {
  const size_t layers = 8;
  Problem problem = chainProblem(layers, {1, 1});
  for (LayerBytes& l : problem.layers) l.stash_bytes = 100;  // a microbatch's, each layer
  problem.options.microbatches = 8;
  problem.options.schedule = ScheduleKind::kInterleaved1F1B;
  const CostModel cost(problem);
  const Plan plan = evaluate(cost, evenChunks(layers, 2, 2), "even", {}, 2);
  ASSERT_TRUE(plan.infeasible.empty()) << plan.infeasible;
  for (int k = 0; k < 4; ++k) {
    const int s = k % 2;
    const auto held = static_cast<int>(std::min<int64_t>(interleavedWarmup(s, 2, 2) + 1, 16));
    const Assignment& a = plan.stages[static_cast<size_t>(k)].at;
    EXPECT_EQ(plan.stages[static_cast<size_t>(k)].memory_bytes,
              cost.memory(a.begin, a.end, held, 1, 2))
        << "chunk " << k;
  }
  // A device holding less than its stage's chunks together: named, with the chunks.
  Problem small = problem;
  small.devices[0].memory_bytes = plan.stages[0].memory_bytes + plan.stages[2].memory_bytes - 1;
  const CostModel tight(small);
  const Plan refused = evaluate(tight, evenChunks(layers, 2, 2), "even", {}, 2);
  EXPECT_NE(refused.infeasible.find("stage 0 (layers [0, 6) in 2 chunks) needs"), std::string::npos)
      << refused.infeasible;
}

TEST(InterleaveTest, ChunksOffTheirStagesDeviceOrReplicatedAreRefused) {
  Problem problem = chainProblem(8, {1, 1, 1});
  problem.options.microbatches = 4;
  problem.options.schedule = ScheduleKind::kInterleaved1F1B;
  const CostModel cost(problem);
  std::vector<Assignment> wrong = evenChunks(8, 2, 2);
  wrong[3].devices = {2};
  expectThrowWith<InvalidArgument>([&] { evaluate(cost, wrong, "x", {}, 2); },
                                   {"chunk 3 is not on stage 1's device"});
  std::vector<Assignment> replicated = evenChunks(8, 2, 2);
  replicated[1].devices = replicated[3].devices = {1, 2};
  expectThrowWith<InvalidArgument>([&] { evaluate(cost, replicated, "x", {}, 2); },
                                   {"interleaved stages cannot have replicas"});
  expectThrowWith<InvalidArgument>([&] { evaluate(cost, evenChunks(8, 1, 2), "x", {}, 2); },
                                   {"interleaved chunks need 2 stages or more"});
  expectThrowWith<InvalidArgument>([&] { evaluate(cost, evenChunks(8, 3, 1), "x", {}, 2); },
                                   {"3 model chunks are not 2 per stage"});
  const Plan one = evaluate(cost, {{0, 8, {0}}}, "one");
  expectThrowWith<InvalidArgument>([&] { interleavedPlan(cost, one, 2); },
                                   {"interleaving needs 2 stages or more"});
}

TEST(InterleaveTest, TheCutsMakeTheSlowestChunkAsShortAsAnyOther) {
  // Two devices, the second three times slower: the DP's slowest chunk is the shortest
  // of every cut of 12 layers into 4 chunks, and the fast device holds more layers.
  const size_t layers = 12;
  Problem problem = chainProblem(layers, {1, 3});
  problem.options.microbatches = 4;
  problem.options.schedule = ScheduleKind::kInterleaved1F1B;
  const CostModel cost(problem);
  const Plan base = evaluate(cost, {{0, 8, {0}}, {8, 12, {1}}}, "exact");
  const Plan plan = interleavedPlan(cost, base, 2);
  ASSERT_EQ(plan.chunks, 2);
  ASSERT_EQ(plan.stages.size(), 4u);
  EXPECT_EQ(plan.algorithm, "exact");
  auto slowest = [&](const std::vector<Assignment>& st) {
    double worst = 0;
    for (size_t k = 0; k < st.size(); ++k)
      worst = std::max(worst, cost.stage(cost.typeOf(st[k].devices[0]), st[k].begin, st[k].end, 1));
    return worst;
  };
  std::vector<Assignment> got;
  size_t fast = 0;
  for (size_t k = 0; k < 4; ++k) {
    got.push_back(plan.stages[k].at);
    EXPECT_EQ(plan.stages[k].at.devices, std::vector<int>{static_cast<int>(k % 2)}) << k;
    if (k % 2 == 0) fast += plan.stages[k].at.end - plan.stages[k].at.begin;
  }
  EXPECT_GT(fast, layers / 2);
  for (size_t a = 1; a < layers; ++a)
    for (size_t b = a + 1; b < layers; ++b)
      for (size_t c = b + 1; c < layers; ++c) {
        const std::vector<Assignment> other{
            {0, a, {0}}, {a, b, {1}}, {b, c, {0}}, {c, layers, {1}}};
        EXPECT_LE(slowest(got), slowest(other) + 1e-12) << a << " " << b << " " << c;
      }
}

// A plan file states an interleaved plan's chunks (`chunks:`) and lists them in layer
// order; read back, they are the plan's, and a `chunks:` its stages cannot hold is refused
// naming the line.
// Codecs chosen per link (codec: auto): an interleaved plan's chunks cross the links
// between its stages, the last stage's to the first too, each one codec pair for all its
// chunks — a slow link compressed, the fast ones exact, and the step shorter than with
// every link exact.
TEST(InterleaveTest, EachLinkBetweenStagesGetsItsCodecs) {
  Problem problem = chainProblem(12, {1, 1, 1});
  // n1 <-> n2 at 100 kB/s (10 ms a 1000-byte message, against 1 ms a layer); the others free.
  problem.links[1][2] = problem.links[2][1] = LinkCosts{1e5, 0};
  problem.options.microbatches = 4;
  problem.options.schedule = ScheduleKind::kInterleaved1F1B;
  problem.options.choose_activation_codec = problem.options.choose_gradient_codec = true;
  problem.options.codecs = {{"fp32", 1}, {"fp16", 0.5}, {"bf16", 0.5}, {"int8", 0.26}};
  const CostModel cost(problem);
  const Plan base = evaluate(cost, {{0, 4, {0}}, {4, 8, {1}}, {8, 12, {2}}}, "given");
  const Plan plan = interleavedPlan(cost, base, 2);
  ASSERT_EQ(plan.stages.size(), 6u);
  // Chunk k's link to chunk k + 1 is link k % 3: 0 -> 1, 1 -> 2 (slow), 2 -> 0.
  for (const size_t k : {0u, 2u, 3u}) {
    EXPECT_EQ(plan.stages[k].next.activations, "fp32") << "chunk " << k;
    EXPECT_EQ(plan.stages[k].next.gradients, "fp32") << "chunk " << k;
  }
  EXPECT_NE(plan.stages[1].next.activations, "fp32");
  EXPECT_NE(plan.stages[1].next.gradients, "fp32");
  EXPECT_EQ(plan.stages[4].next, plan.stages[1].next);  // the same link
  std::vector<Assignment> chunks;
  for (const PlanStage& st : plan.stages) chunks.push_back(st.at);
  const Plan exact = evaluate(cost, chunks, "exact links", {}, 2);
  EXPECT_LT(plan.step_s, exact.step_s);
}

TEST(InterleaveTest, PlanFilesCarryTheirChunks) {
  Problem problem = chainProblem(12, {1, 2});
  problem.options.microbatches = 4;
  problem.options.schedule = ScheduleKind::kInterleaved1F1B;
  const CostModel cost(problem);
  const Plan plan = interleavedPlan(cost, evaluate(cost, {{0, 8, {0}}, {8, 12, {1}}}, "exact"), 2);
  const std::string yaml = planToYaml(cost, plan);
  int chunks = 0;
  const std::vector<PlanStageSpec> read = parsePlan(yaml, "plan.yaml", &chunks);
  EXPECT_EQ(chunks, 2) << yaml;
  ASSERT_EQ(read.size(), 4u) << yaml;
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(read[k].begin, plan.stages[k].at.begin) << k;
    EXPECT_EQ(read[k].end, plan.stages[k].at.end) << k;
    EXPECT_EQ(read[k].devices, std::vector<std::string>{k % 2 == 0 ? "n0/cpu" : "n1/cpu"}) << k;
  }
  int none = 0;
  parsePlan("stages:\n  - {layers: [0, 12], devices: [n0/cpu], backend: cpu}\n", "p.yaml", &none);
  EXPECT_EQ(none, 1);
  expectThrowWith<InvalidArgument>(
      [&] {
        parsePlan(
            "chunks: 2\nstages:\n  - {layers: [0, 6], devices: [a], backend: cpu}\n"
            "  - {layers: [6, 12], devices: [b], backend: cpu}\n",
            "p.yaml");
      },
      {"p.yaml:1:9", "lists 2 stages, not 2 chunks for each of 2 stages or more"});
  expectThrowWith<InvalidArgument>(
      [&] {
        parsePlan("chunks: 1\nstages:\n  - {layers: [0, 6], devices: [a], backend: cpu}\n",
                  "p.yaml");
      },
      {"p.yaml:1:9", "'chunks' must be from 2 to 64"});
}

}  // namespace
}  // namespace tandem::partitioner
