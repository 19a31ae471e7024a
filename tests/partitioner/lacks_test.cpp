// Devices whose backends lack a layer's ops (DeviceCosts::lacks, from Backend::supports
// through the profile): no search places the layer there, a plan that does is infeasible
// saying why, and a layer no device runs is refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "partitioner/search.h"
#include "tests/test_util.h"

namespace tandem::partitioner {
namespace {

using tandem::testing::expectThrowWith;

// 8 layers; device n0 fast, n1 `slow` times slower, one node each, free links.
Problem twoDevices(double slow) {
  Problem p;
  for (size_t l = 0; l < 8; ++l) p.layers.push_back({"relu", 0, 1000, 1000});
  p.input_bytes = 1000;
  for (int d = 0; d < 2; ++d) {
    const std::string node = std::string("n").append(std::to_string(d));
    const double k = d == 0 ? 1 : slow;
    p.node_names.push_back(node);
    p.devices.push_back({std::string(node).append("/cpu"), d, int64_t{1} << 40,
                         std::vector<double>(8, 1e-3 * k), std::vector<double>(8, 2e-3 * k)});
  }
  p.links.assign(2, std::vector<LinkCosts>(2, LinkCosts{1e15, 0}));
  return p;
}

// Every stage of `plan` runs on a device that runs all its layers.
void expectRunnable(const CostModel& cost, const Plan& plan) {
  ASSERT_FALSE(plan.stages.empty());
  EXPECT_EQ(plan.infeasible, "");
  for (const PlanStage& s : plan.stages)
    EXPECT_TRUE(cost.runs(cost.typeOf(s.at.devices.front()), s.at.begin, s.at.end))
        << "[" << s.at.begin << ", " << s.at.end << ") on device " << s.at.devices.front();
}

TEST(LacksTest, NoSearchPlacesALayerOnADeviceThatLacksItsOps) {
  // Alone, the fast device is the plan (the other is 4x slower) ...
  Problem p = twoDevices(4);
  {
    const CostModel cost(p);
    const Plan alone = choosePlan(cost);
    ASSERT_EQ(alone.stages.size(), 1u);
    EXPECT_EQ(alone.stages[0].at.devices, std::vector<int>{0});
  }
  // ... but it cannot run layer 5: the slow device takes it.
  p.devices[0].lacks.assign(8, "");
  p.devices[0].lacks[5] = "lacks activation on f32";
  const CostModel cost(p);
  EXPECT_FALSE(cost.runs(0, 0, 8));
  EXPECT_TRUE(cost.runs(0, 0, 5));
  EXPECT_TRUE(cost.runs(0, 6, 8));
  EXPECT_EQ(cost.lacking(0, 2, 8), "layer 5 (relu): lacks activation on f32");
  EXPECT_EQ(cost.compute(0, 4, 6), std::numeric_limits<double>::infinity());
  for (const Plan& plan : {exactPlan(cost), heuristicPlan(cost), choosePlan(cost)}) {
    expectRunnable(cost, plan);
    EXPECT_EQ(plan.stages.size(), 2u);
  }
  // Interleaved over the chosen stages, the chunks respect it too.
  const Plan base = exactPlan(cost);
  expectRunnable(cost, interleavedPlan(cost, base, 2));
  // A plan that puts layer 5 on the fast device is infeasible, and says why.
  const Plan bad = evaluate(cost, {{0, 6, {0}}, {6, 8, {1}}}, "by hand");
  EXPECT_EQ(bad.infeasible,
            "stage 0 runs on n0/cpu, which cannot run layer 5 (relu): lacks "
            "activation on f32");
  EXPECT_FALSE(std::isfinite(bad.step_s));
}

TEST(LacksTest, ALayerNoDeviceRunsIsRefusedNamingEachDevicesLack) {
  Problem p = twoDevices(2);
  for (DeviceCosts& d : p.devices) {
    d.lacks.assign(8, "");
    d.lacks[3] = d.name == "n0/cpu" ? "lacks gemm on i8" : "lacks softmax on f32";
  }
  const CostModel cost(p);
  for (int which = 0; which < 2; ++which)
    expectThrowWith<InvalidArgument>(
        [&] { which == 0 ? exactPlan(cost) : heuristicPlan(cost); },
        {"no device can run layer 3 (relu): n0/cpu lacks gemm on i8; n1/cpu lacks softmax on f32"});
}

TEST(LacksTest, ASplitTheLacksLeaveNoRoomForIsRefused) {
  // n0 cannot run layer 2, n1 cannot run layer 6: [0, 2) can go on either, but two devices
  // cannot cover layers 2 and 6 with one stage each in order unless n1 holds 2 and n0 6.
  Problem p = twoDevices(1);
  p.devices[0].lacks.assign(8, "");
  p.devices[1].lacks.assign(8, "");
  p.devices[0].lacks[2] = "lacks x on f32";
  p.devices[1].lacks[6] = "lacks y on f32";
  {
    const CostModel cost(p);
    const Plan plan = exactPlan(cost);
    expectRunnable(cost, plan);
    ASSERT_EQ(plan.stages.size(), 2u);
    EXPECT_EQ(plan.stages[0].at.devices, std::vector<int>{1});  // holds layer 2
  }
  // And where n1 also lacks layer 1 and n0 layer 7, no contiguous split exists.
  p.devices[1].lacks[1] = "lacks z on f32";
  p.devices[0].lacks[7] = "lacks w on f32";
  p.devices[0].lacks[0] = "lacks v on f32";
  const CostModel cost(p);
  expectThrowWith<InvalidArgument>(
      [&] { exactPlan(cost); },
      {"found no split", "n0/cpu cannot run layers 0, 2, 7", "n1/cpu cannot run layers 1, 6"});
}

TEST(LacksTest, AListOfTheWrongLengthIsRefused) {
  Problem p = twoDevices(1);
  p.devices[1].lacks = {"", ""};
  expectThrowWith<InvalidArgument>(
      [&] { CostModel cost(p); },
      {"device n1/cpu says what it lacks for 2 layers, the model has 8"});
}

}  // namespace
}  // namespace tandem::partitioner
