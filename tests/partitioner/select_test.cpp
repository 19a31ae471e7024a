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
  p.links.assign(static_cast<size_t>(devices),
                 std::vector<LinkCosts>(static_cast<size_t>(devices)));
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

// A send holds its stage's thread (MessageCpuCost::send): the message leaves after it, and
// with two microbatches the first stage's second forward waits for its first send too.
TEST(SimulateTest, ASendHoldsTheSendingStagesThread) {
  Problem problem = uniformProblem(4, 2, 0.001, 0.002, /*bandwidth=*/1e6, /*latency=*/0.005);
  problem.options.microbatches = 1;
  const double fixed = 0.0003, per_byte = 1e-7;  // 1000 bytes: 0.0004 s a send
  problem.node_message_cpu.assign(2, MessageCpuCost{});
  for (MessageCpuCost& m : problem.node_message_cpu) {
    m.send_fixed_s = fixed;
    m.send_per_byte_s = per_byte;
  }
  const CostModel cost(problem);
  EXPECT_NEAR(cost.sendTime(1, 1000), 0.0004, 1e-15);
  const double f = 0.002, b = 0.004, message = 1000 / 1e6 + 0.005, send = 0.0004;
  EXPECT_NEAR(predictStep(cost, evenPlan(cost, 2)).step_s, 2 * f + 2 * b + 2 * (message + send),
              1e-12);
  // Not measured (0): free, as before.
  problem.node_message_cpu.assign(2, MessageCpuCost{});
  const CostModel free(problem);
  EXPECT_NEAR(predictStep(free, evenPlan(free, 2)).step_s, 2 * f + 2 * b + 2 * message, 1e-12);
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

TEST(SimulateTest, AQuotaNodesTimesAreNotSlowedByItsQuotaAgain) {
  // A node held to a quarter of a core: its times are what it sustains there, so one stage
  // on it, busy all the time, keeps exactly its quarter busy and runs at those times.
  Problem problem = uniformProblem(8, 2, 0.004, 0.004);
  problem.node_names = {"board"};
  problem.links = {{LinkCosts{1e15, 0}}};
  for (DeviceCosts& d : problem.devices) {
    d.node = 0;
    d.host_threads = 1;
  }
  problem.node_cores = {0.25};
  problem.options.microbatches = 4;
  const CostModel quota(problem);
  Problem one = problem;
  one.devices.pop_back();
  const CostModel alone_cost(one);
  EXPECT_NEAR(predictStep(alone_cost, evenPlan(alone_cost, 1)).step_s, 4 * 8 * 0.008, 1e-9);
  // Two stages on it share that quarter: the pipeline is no faster than one stage alone
  // (each computes at half its times while both are busy), never the 4x of counting the
  // quota twice.
  const double shared = predictStep(quota, evenPlan(quota, 2)).step_s;
  EXPECT_GT(shared, 4 * 8 * 0.008 * 0.95);
  EXPECT_LT(shared, 4 * 8 * 0.008 * 1.5);
}

TEST(SimulateTest, MessagesCostTheirNodesCoresWhereTheyAreShort) {
  // Two stages on two nodes, each message 1000 bytes, 8 microbatches: each node's stage
  // receives or sends one activation and one gradient per microbatch.
  Problem problem = uniformProblem(8, 2, 0.004, 0.004);
  problem.options.microbatches = 8;
  for (DeviceCosts& d : problem.devices) d.host_threads = 1;
  problem.node_cores = {0.25, 4};
  const CostModel plain(problem);
  const double without = predictStep(plain, evenPlan(plain, 2)).step_s;
  // 4 ms of CPU per message (both ends): 2 ms on each node per message, 4 ms per
  // microbatch on each.
  problem.node_message_cpu = {{0.002, 2e-6}, {0.002, 2e-6}};
  const CostModel cost(problem);
  EXPECT_NEAR(cost.messageCpu(0, 0, 1, 1000), 0.004, 1e-15);
  const double with = predictStep(cost, evenPlan(cost, 2)).step_s;
  // The quarter-core node computes 64 ms of CPU a step (256 ms at its quarter) and now
  // also 32 ms of messages: 96 ms of CPU, 384 ms at a quarter of a core at the least,
  // where its stage idled 32 of 288 ms before. Sharing stretches the stage's compute and
  // leaves the pipeline's fill and drain idle, so the step comes within 10% of that bound.
  EXPECT_GT(with, 0.384 * 0.9);
  EXPECT_LT(with, without + 0.128 + 1e-9);
  // A link whose bytes were measured to cost the hosts more than the node's loopback
  // messages do (a slow or shaped link's packets): its cost per byte, on top of the
  // node's fixed cost per message, and the quarter-core node's step grows by it.
  problem.links[0][1].cpu_s_per_byte = problem.links[1][0].cpu_s_per_byte = 6e-6;
  const CostModel costly(problem);
  EXPECT_NEAR(costly.messageCpu(0, 0, 1, 1000), 0.002 + 0.006, 1e-15);
  EXPECT_NEAR(costly.messageCpu(1, 1, 0, 1000), 0.002 + 0.006, 1e-15);
  EXPECT_NEAR(costly.messageCpu(0, 0, 0, 1000), 0.004, 1e-15);  // within a node: its own
  // 64 ms of compute and 64 ms of messages a step: 512 ms at a quarter of a core at least.
  EXPECT_GT(predictStep(costly, evenPlan(costly, 2)).step_s, 0.512 * 0.9);
  EXPECT_GT(predictStep(costly, evenPlan(costly, 2)).step_s, with + 0.1);
  // One measured below the node's own cost per byte changes nothing.
  problem.links[0][1].cpu_s_per_byte = problem.links[1][0].cpu_s_per_byte = 1e-7;
  const CostModel cheap(problem);
  EXPECT_NEAR(predictStep(cheap, evenPlan(cheap, 2)).step_s, with, 1e-12);
  problem.links[0][1].cpu_s_per_byte = problem.links[1][0].cpu_s_per_byte = 6e-6;
  // Each end is charged its own part of a link's cost (LinkCosts::sender_share), half
  // each where not measured. Where the quarter-core node's ends cost it 20% of each
  // message, its step shrinks; where they cost it 80%, it grows.
  const CostModel halves(problem);
  EXPECT_NEAR(halves.messageCpuAtEnd(0, 0, 1, 1000), 0.5 * halves.messageCpu(0, 0, 1, 1000), 1e-15);
  const double halved = predictStep(halves, evenPlan(halves, 2)).step_s;
  problem.links[0][1].sender_share = 0.2;  // node 0 sends the activations
  problem.links[1][0].sender_share = 0.8;  // node 1 sends the gradients
  const CostModel light(problem);
  EXPECT_NEAR(light.messageCpuAtEnd(0, 0, 1, 1000), 0.001 + 0.2 * 0.006, 1e-15);
  EXPECT_NEAR(light.messageCpuAtEnd(1, 0, 1, 1000), 0.001 + 0.8 * 0.006, 1e-15);
  EXPECT_NEAR(light.messageCpuAtEnd(0, 1, 0, 1000), 0.001 + 0.2 * 0.006, 1e-15);
  EXPECT_LT(predictStep(light, evenPlan(light, 2)).step_s, halved * 0.9);
  problem.links[0][1].sender_share = 0.8;
  problem.links[1][0].sender_share = 0.2;
  const CostModel heavy(problem);
  EXPECT_GT(predictStep(heavy, evenPlan(heavy, 2)).step_s, halved * 1.1);
  // An end's part never goes below its half of the node's own cost per byte (1e-6).
  problem.links[0][1].sender_share = 0.1;
  EXPECT_NEAR(CostModel(problem).messageCpuAtEnd(0, 0, 1, 1000), 0.001 + 0.001, 1e-15);
  problem.links[0][1].sender_share = 1.5;
  testing::expectThrowWith<InvalidArgument>([&] { CostModel bad(problem); },
                                            {"link n0 -> n1", "charges its sender 1.5"});
  problem.links[0][1].sender_share = problem.links[1][0].sender_share = 0.5;
  // With cores to spare on both nodes, messages cost the step nothing.
  problem.node_cores = {4, 4};
  const CostModel spare(problem);
  EXPECT_NEAR(predictStep(spare, evenPlan(spare, 2)).step_s, without, 1e-12);
  // Costs for some nodes only, or negative ones, are refused.
  problem.node_message_cpu.pop_back();
  testing::expectThrowWith<InvalidArgument>([&] { CostModel bad(problem); },
                                            {"message costs for 1 of 2"});
  problem.node_message_cpu = {{-1, 0}, {0, 0}};
  testing::expectThrowWith<InvalidArgument>([&] { CostModel bad(problem); },
                                            {"a message costing -1"});
  problem.node_message_cpu = {{0, 0}, {0, 0}};
  problem.links[1][0].cpu_s_per_byte = -1e-9;
  testing::expectThrowWith<InvalidArgument>([&] { CostModel bad(problem); },
                                            {"link", "costs -1e-09 s of CPU per byte"});
}

TEST(SimulateTest, EachStageUpdatesItsParametersOncePerStep) {
  // Layers with parameters: the optimizer's update, once per step, over each stage's
  // share of them, after its last backward.
  Problem problem = uniformProblem(4, 2, 0.001, 0.002);
  for (LayerBytes& l : problem.layers) l.param_bytes = 1000;
  problem.options.microbatches = 4;
  const CostModel none(problem);
  const double without = predictStep(none, evenPlan(none, 1)).step_s;
  EXPECT_NEAR(without, 4 * 4 * 0.003, 1e-12);
  for (DeviceCosts& d : problem.devices) d.update_s_per_param_byte = 1e-6;  // 1 ms per layer
  const CostModel cost(problem);
  EXPECT_NEAR(cost.update(0, 0, 4), 0.004, 1e-15);
  EXPECT_NEAR(cost.stage(0, 1, 3, 1), 2 * 0.003 + 0.002 / 4, 1e-15);
  EXPECT_NEAR(predictStep(cost, evenPlan(cost, 1)).step_s, without + 0.004, 1e-12);
  // Two stages: each updates its two layers once it is done; the first stage finishes
  // last (its final backward waits on the second's), so the step grows by its update.
  const double two_without = predictStep(none, evenPlan(none, 2)).step_s;
  EXPECT_NEAR(predictStep(cost, evenPlan(cost, 2)).step_s, two_without + 0.002, 1e-12);
  // Serving has no update.
  problem.options.objective = Objective::kInferThroughput;
  EXPECT_EQ(CostModel(problem).update(0, 0, 4), 0);
}

TEST(SimulateTest, TheFirstStageComputesNoInputGradientBelowItsFirstWeights) {
  // flatten | linear | relu | linear, one device: 1 ms forward each; backward 0.1, 4, 1
  // and 4 ms with the input gradient, the first linear 1.5 ms without it. A range from
  // layer 0 runs no flatten backward and the first linear without its input gradient, as
  // Sequence::backward does for the first stage; any other range runs them whole.
  Problem problem = uniformProblem(4, 1, 0.001, 0.002);
  problem.layers = {{"flatten", 0, 1000, 1000},
                    {"linear", 1000, 1000, 1000},
                    {"relu", 0, 1000, 1000},
                    {"linear", 1000, 1000, 1000}};
  DeviceCosts& d = problem.devices[0];
  d.backward_s = {0.0001, 0.004, 0.001, 0.004};
  d.first_backward_s = 0.0015;
  const CostModel cost(problem);
  EXPECT_EQ(cost.firstWhole(), 1u);
  EXPECT_NEAR(cost.compute(0, 0, 4), 0.004 + 0.0015 + 0.001 + 0.004, 1e-15);
  EXPECT_NEAR(cost.compute(0, 1, 4), 0.003 + 0.009, 1e-15);
  EXPECT_NEAR(cost.compute(0, 0, 1), 0.001, 1e-15);  // the flatten's forward only
  EXPECT_NEAR(cost.compute(0, 0, 2), 0.002 + 0.0015, 1e-15);
  EXPECT_NEAR(cost.backward(0, 0, 4), 0.0015 + 0.001 + 0.004, 1e-15);
  // Of that backward the first linear's is all weight gradient; the second's half.
  EXPECT_NEAR(cost.weightGradient(0, 0, 4), 0.0015 + 0.002, 1e-15);
  EXPECT_NEAR(cost.weightGradient(0, 1, 4), 0.002 + 0.002, 1e-15);
  // One stage, 4 microbatches: each its forward and that backward, under every schedule
  // (zero-bubble's weight-gradient work is the same work, later).
  problem.options.microbatches = 4;
  for (const ScheduleKind kind :
       {ScheduleKind::k1F1B, ScheduleKind::kGPipe, ScheduleKind::kZeroBubbleH1}) {
    problem.options.schedule = kind;
    const CostModel c(problem);
    EXPECT_NEAR(predictStep(c, evenPlan(c, 1)).step_s, 4 * 0.0105, 1e-12) << scheduleName(kind);
  }
  // Not measured: the first linear's backward without its input gradient is priced as its
  // weight-gradient half.
  d.first_backward_s = -1;
  EXPECT_NEAR(CostModel(problem).compute(0, 0, 4), 0.004 + 0.002 + 0.001 + 0.004, 1e-15);
  // A first layer with weights has no input gradient in its profile already.
  problem.layers[0].param_bytes = 1000;
  const CostModel first(problem);
  EXPECT_EQ(first.firstWhole(), 0u);
  EXPECT_NEAR(first.compute(0, 0, 4), 0.004 + 0.0091, 1e-15);
  // A model without parameters trains nothing: priced as its profile times it.
  for (LayerBytes& l : problem.layers) l.param_bytes = 0;
  EXPECT_NEAR(CostModel(problem).compute(0, 0, 4), 0.004 + 0.0091, 1e-15);
  // Serving runs no backward at all.
  problem.options.objective = Objective::kInferThroughput;
  EXPECT_NEAR(CostModel(problem).compute(0, 0, 4), 0.004, 1e-15);
}

// Across microbatch counts and schedules: the fewest devices within the selection margin of
// the fastest candidate, the fastest of those; what does not fit is never picked.
TEST(SelectTest, AcrossOptionsFewerDevicesWinWithinTheMargin) {
  auto plan = [](std::vector<std::vector<int>> stages, double samples,
                 std::string infeasible = "") {
    Plan p;
    for (auto& d : stages) {
      PlanStage s;
      s.at.devices = d;
      p.stages.push_back(s);
    }
    p.samples_per_s = samples;
    p.infeasible = std::move(infeasible);
    return p;
  };
  const Plan split = plan({{0}, {1}}, 8038), alone = plan({{1}}, 7909), slow = plan({{1}}, 6000),
             other = plan({{0}}, 7950), too_big = plan({{1}}, 9000, "needs more memory");
  EXPECT_EQ(pickAcrossOptions({&split, &alone}), 1);          // 1.6% slower, one device
  EXPECT_EQ(pickAcrossOptions({&alone, &split}), 0);          // in either order
  EXPECT_EQ(pickAcrossOptions({&split, &slow}), 0);           // 34% slower: the split
  EXPECT_EQ(pickAcrossOptions({&split, &alone, &other}), 2);  // the faster single device
  EXPECT_EQ(pickAcrossOptions({&split, &too_big}), 0);        // what does not fit is out
  EXPECT_EQ(pickAcrossOptions({&too_big}), -1);
  EXPECT_EQ(pickAcrossOptions({}), -1);
  // The margin is measured against the fastest, never compounded: 8038 -> 7909 is within
  // it, 7909 -> 6900 would be too, but 8038 -> 6900 is not.
  const Plan three = plan({{0}, {1}, {2}}, 8038), two = plan({{0}, {1}}, 7909),
             one = plan({{0}}, 6900);
  EXPECT_EQ(pickAcrossOptions({&three, &two, &one}), 1);
}

TEST(SimulateTest, ServingObjectivesAreRefused) {
  Problem problem = uniformProblem(4, 1, 0.001, 0.001);
  problem.options.objective = Objective::kInferThroughput;
  const CostModel cost(problem);
  tandem::testing::expectThrowWith<InvalidArgument>([&] { predictStep(cost, evenPlan(cost, 1)); },
                                                    {"training objective"});
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
    // And never more than the selection margin slower than the search's split, by the
    // same prediction (fewer devices are preferred within it).
    EXPECT_LE(plan.step_s, bestPlan(cost).step_s * (1 + kSelectionMargin) * (1 + 1e-9))
        << "seed " << seed;
    std::set<int> used;
    for (const PlanStage& s : plan.stages) used.insert(s.at.devices.begin(), s.at.devices.end());
    EXPECT_EQ(used.size() + plan.left_out.size(), cost.problem().devices.size());
  }
}

// The codecs a link may carry, most exact first, with int8's ratio at its 256-value blocks.
std::vector<CodecChoice> wireCodecs() {
  return {{"fp32", 1}, {"fp16", 0.5}, {"bf16", 0.5}, {"int8", 0.2578}};
}

// Three nodes: n0 - n1 fast, n2 an edge node 100 kB/s from both. A microbatch's
// activations (1000 bytes) take 10 ms at fp32 on its links, against 4 ms of a stage's
// forward. Eight microbatches: a third stage's fill and drain cost less than it gains.
Problem slowLastLink() {
  Problem problem = uniformProblem(12, 3, 0.001, 0.002, 1e12, 1e-5);
  for (const size_t other : {0, 1}) problem.links[other][2] = problem.links[2][other] = {1e5, 1e-5};
  problem.options.microbatches = 8;
  problem.options.codecs = wireCodecs();
  problem.options.choose_activation_codec = problem.options.choose_gradient_codec = true;
  return problem;
}

TEST(SelectTest, ASlowLinkIsCompressedAndAFastOneStaysExact) {
  const CostModel cost(slowLastLink());
  const Plan exact = evenPlan(cost, 3);
  const Plan chosen = chooseCodecs(cost, exact);
  ASSERT_EQ(chosen.stages.size(), 3u);
  const LinkCodec fast = chosen.stages[0].next, slow = chosen.stages[1].next;
  EXPECT_EQ(fast.activations, "fp32");
  EXPECT_EQ(fast.gradients, "fp32");
  EXPECT_TRUE(slow.activations != "fp32" || slow.gradients != "fp32") << planToYaml(cost, chosen);
  // Shorter than fp32 on every link, and within the tolerance of the fastest pair there.
  EXPECT_LT(chosen.step_s, exact.step_s * 0.9) << planToYaml(cost, chosen);
  std::vector<Assignment> stages;
  for (const PlanStage& s : exact.stages) stages.push_back(s.at);
  double fastest = exact.step_s;
  for (const CodecChoice& a : wireCodecs())
    for (const CodecChoice& g : wireCodecs()) {
      const LinkCodec trial{a.name, g.name, a.ratio, g.ratio};
      const double step = evaluate(cost, stages, "trial", {fast, trial}).step_s;
      fastest = std::min(fastest, step);
    }
  EXPECT_LE(chosen.step_s, fastest * (1 + kCodecTolerance) * (1 + 1e-9));
  // The plan says so, and reads back.
  const std::string yaml = planToYaml(cost, chosen);
  EXPECT_NE(yaml.find("codec: {activations: fp32, gradients: fp32}"), std::string::npos) << yaml;
  const auto specs = parsePlan(yaml, "plan.yaml");
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].activation_codec, "fp32");
  EXPECT_EQ(specs[1].activation_codec, slow.activations);
  EXPECT_EQ(specs[1].gradient_codec, slow.gradients);
  EXPECT_EQ(specs[2].activation_codec, "");  // the last stage has no link after it
}

TEST(SelectTest, CodecsAreChosenOnlyWhereTheJobLeavesThemOpen) {
  Problem problem = slowLastLink();
  // Activations fixed at fp16, gradients chosen: every link's activations stay fp16.
  problem.options.choose_activation_codec = false;
  problem.options.activation_codec = "fp16";
  problem.options.activation_ratio = 0.5;
  const CostModel cost(problem);
  const Plan chosen = chooseCodecs(cost, evenPlan(cost, 3));
  for (size_t s = 0; s + 1 < chosen.stages.size(); ++s)
    EXPECT_EQ(chosen.stages[s].next.activations, "fp16");
  EXPECT_EQ(chosen.stages[0].next.gradients, "fp32");
  // Nothing chosen: the plan as it was, the options' codecs on every link.
  problem.options.choose_gradient_codec = false;
  const CostModel fixed(problem);
  const Plan same = chooseCodecs(fixed, evenPlan(fixed, 3));
  for (size_t s = 0; s + 1 < same.stages.size(); ++s)
    EXPECT_EQ(same.stages[s].next, (LinkCodec{"fp16", "fp32", 0.5, 1}));
  // Serving plans keep the options' codecs (the step is what is priced).
  problem.options.objective = Objective::kInferThroughput;
  problem.options.choose_activation_codec = true;
  const CostModel serving(problem);
  const Plan served = chooseCodecs(serving, evenPlan(serving, 3));
  EXPECT_EQ(served.stages[1].next.activations, "fp16");
}

TEST(SelectTest, ChoosingCodecsNeverPredictsASlowerStep) {
  // Device selection with per-link codecs against the same with fp32 everywhere: never
  // slower, and where the slow node is used its links are compressed.
  Problem problem = slowLastLink();
  const CostModel choosing(problem);
  problem.options.choose_activation_codec = problem.options.choose_gradient_codec = false;
  const CostModel exact(problem);
  const Plan with = choosePlan(choosing), without = choosePlan(exact);
  EXPECT_LE(with.step_s, without.step_s * (1 + 1e-9));
  // Compressed, the edge node's links carry a microbatch in less than a stage's forward:
  // the plan uses all three nodes, and is faster than any plan in fp32.
  EXPECT_EQ(with.stages.size(), 3u) << planToYaml(choosing, with);
  EXPECT_LT(with.step_s, without.step_s * 0.95) << planToYaml(exact, without);
  for (size_t s = 0; s + 1 < with.stages.size(); ++s) {
    const int a = with.stages[s].at.devices[0], b = with.stages[s + 1].at.devices[0];
    if ((a == 2) != (b == 2)) {
      EXPECT_NE(with.stages[s].next, (LinkCodec{"fp32", "fp32", 1, 1}))
          << planToYaml(choosing, with);
    }
  }
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    RandomProblemOptions o;
    o.layers = 8;
    o.devices = 4;
    o.nodes = 3;
    o.memory_min = 1.2;
    o.memory_max = 3;
    o.seed = seed;
    o.cost.microbatches = static_cast<int64_t>(1 + seed % 6);
    Problem p = randomProblem(o);
    const Plan plain = choosePlan(CostModel(p));
    p.options.codecs = wireCodecs();
    p.options.choose_activation_codec = p.options.choose_gradient_codec = true;
    const Plan coded = choosePlan(CostModel(p));
    EXPECT_LE(coded.step_s, plain.step_s * (1 + 1e-9)) << "seed " << seed;
  }
}

// A device stays in the plan only when it is predicted to shorten the step by more than
// kSelectionMargin (about the cost model's error): a second device three times slower
// gains 6.5% and is left out, saying so; one twice as slow gains 20% and is used.
TEST(SelectTest, ADeviceThatGainsLessThanTheMarginIsLeftOut) {
  for (const double slower : {3.0, 2.0}) {
    Problem problem = uniformProblem(24, 2, 0.001, 0.002, 1e9, 1e-4);
    for (double& t : problem.devices[1].forward_s) t *= slower;
    for (double& t : problem.devices[1].backward_s) t *= slower;
    problem.options.microbatches = 4;
    const CostModel cost(problem);
    const Plan searched = bestPlan(cost);
    const Plan alone = evaluate(cost, {Assignment{0, cost.layers(), {0}}}, "alone");
    ASSERT_EQ(searched.stages.size(), 2u);
    const double gain = alone.step_s / searched.step_s - 1;
    const Plan plan = choosePlan(cost);
    if (slower == 3.0) {
      EXPECT_GT(gain, 0.03);
      EXPECT_LT(gain, kSelectionMargin);
      ASSERT_EQ(plan.stages.size(), 1u) << planToYaml(cost, plan);
      EXPECT_EQ(plan.stages[0].at.devices, std::vector<int>{0});
      EXPECT_DOUBLE_EQ(plan.step_s, alone.step_s);
      ASSERT_EQ(plan.left_out.size(), 1u);
      EXPECT_EQ(plan.left_out[0].device, 1);
      EXPECT_NE(plan.left_out[0].reason.find("within the 15% a device must bring"),
                std::string::npos)
          << plan.left_out[0].reason;
    } else {
      EXPECT_GT(gain, kSelectionMargin);
      EXPECT_EQ(plan.stages.size(), 2u) << planToYaml(cost, plan);
      EXPECT_TRUE(plan.left_out.empty());
    }
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
