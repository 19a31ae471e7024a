// Replicas of the whole model on devices of unequal speed rebalance their shares of each
// batch from what their first steps measured (PipelineOptions::rebalance_steps): two
// replicas as threads of this process, one of them on a backend that sleeps in
// proportion to the data each op works on.
#include <gtest/gtest.h>

#include <mutex>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/pipeline/stage_trainer.h"
#include "tests/forwarding_backend.h"
#include "tests/test_util.h"
#include "transport/local_group.h"

namespace tandem {
namespace {

using Weights = std::map<std::string, std::vector<float>>;

// No dropout: its masks follow the microbatches, so a model with it would train
// differently under another cut of the same batches.
constexpr const char* kNet = R"(name: plain
input: [1, 8, 8]
layers:
  - flatten
  - linear: {out: 16}
  - relu
  - linear: {out: 4}
)";

struct ReplicaRun {
  std::vector<Weights> weights;                          // by replica
  std::vector<StageCounters> counters;                   // by replica
  std::vector<std::vector<std::vector<double>>> shares;  // by replica, after each step
  std::vector<bool> settled;  // replica 0, after each step: StageTrainer::sharesSettled
};

// Two replicas of the whole model train `epochs` over `d`; replica 1's every op first
// sleeps `slow_ns_per_element` for each element of its first tensor.
ReplicaRun replicas(const PipelineOptions& options, const Dataset& d, int epochs,
                    int64_t slow_ns_per_element) {
  std::vector<std::unique_ptr<Group>> group = transport::makeLocalGroup(2);
  ReplicaRun run;
  run.weights.resize(2);
  run.counters.resize(2);
  run.shares.resize(2);
  std::mutex mu;
  std::vector<std::exception_ptr> errors;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        cpu::CpuBackend cpu(cpu::CpuOptions{1});
        testing::ForwardingBackend be(cpu);
        be.record(false);
        if (r == 1)
          be.beforeOp([&](Op, int64_t elements) {
            std::this_thread::sleep_for(std::chrono::nanoseconds(elements * slow_ns_per_element));
          });
        Model m(parseModelSpec(kNet));
        m.build(be, options.seed);
        Optimizer opt(be, OptimizerOptions{});
        PipelineOptions o = options;
        o.replicas = group[static_cast<size_t>(r)].get();
        StageTrainer st(m, StageRange::interleaved(0, 1, {LayerRange{0, m.size()}}), nullptr,
                        nullptr, &opt, o);
        std::vector<std::vector<double>> shares;
        std::vector<bool> settled;
        for (int e = 0; e < epochs; ++e)
          st.trainEpoch(&d, d.size(), e, [&](const StepReport&) {
            shares.push_back(st.shares());
            settled.push_back(st.sharesSettled());
          });
        Weights w;
        for (Param* p : m.params()) w[p->name] = toHost(p->value);
        std::lock_guard lock(mu);
        run.weights[static_cast<size_t>(r)] = w;
        run.counters[static_cast<size_t>(r)] = st.executor().counters();
        run.shares[static_cast<size_t>(r)] = shares;
        if (r == 0) run.settled = settled;
      } catch (...) {
        std::lock_guard lock(mu);
        errors.push_back(std::current_exception());
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors) std::rethrow_exception(e);
  return run;
}

PipelineOptions options(int64_t rebalance_steps) {
  PipelineOptions o;
  o.batch = 32;
  o.microbatches = 4;
  o.seed = 3;
  o.microbatch_shares = {1, 1};
  o.rebalance_steps = rebalance_steps;
  return o;
}

// Steps 1 and 2 measure under the given shares, and after step 2 the fast replica's share
// grows and stays, the same on both replicas; its measured time leaves out the gradient
// sums it waits for inside its last backward (else both would look as slow as the slow
// one and nothing would move).
// The weights are those of one device accumulating the same batches, within rounding.
TEST(RebalanceTest, TheFasterReplicaTakesMoreOfEachBatchAfterTheFirstSteps) {
  const Dataset d = testing::quadrants(160, 1);  // 5 steps of 32 an epoch
  const ReplicaRun got = replicas(options(2), d, 2, 1000);
  ASSERT_EQ(got.shares[0].size(), 10u);
  EXPECT_EQ(got.shares[0], got.shares[1]) << "the replicas must cut every batch alike";
  const std::vector<std::vector<double>>& shares = got.shares[0];
  EXPECT_EQ(shares[0], (std::vector<double>{1, 1})) << "step 0 warms up: nothing measured";
  EXPECT_EQ(shares[1], (std::vector<double>{1, 1})) << "the shares change once, after step 2";
  ASSERT_EQ(shares[2].size(), 2u);
  EXPECT_GT(shares[2][0], 0.8) << "replica 1 sleeps about 1 ms per thousand elements";
  EXPECT_NEAR(shares[2][0] + shares[2][1], 1.0, 1e-12);
  for (size_t s = 3; s < shares.size(); ++s)
    EXPECT_EQ(shares[s], shares[2]) << "rebalance_steps 2: the shares stay after step 2";
  // Settled (what a checkpoint carries) from step 2 on, not while measuring.
  EXPECT_EQ(got.settled,
            (std::vector<bool>{false, false, true, true, true, true, true, true, true, true}));
  const int64_t fast = got.counters[0].samples, slow = got.counters[1].samples;
  EXPECT_EQ(fast + slow, 2 * 160);
  EXPECT_GT(fast, 2 * slow);  // 48 each in steps 0 to 2, then more than 4 : 1
  EXPECT_EQ(got.weights[1], got.weights[0]) << "replicas stay bitwise identical";

  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(kNet));
  m.build(be, 3);
  Optimizer opt(be, OptimizerOptions{});
  Trainer trainer(m, opt, TrainOptions{32, 3, true, 4});
  for (int e = 0; e < 2; ++e) trainer.trainEpoch(d, e, {});
  for (Param* p : m.params()) {
    const std::vector<float> want = toHost(p->value);
    const std::vector<float>& g = got.weights[0].at(p->name);
    ASSERT_EQ(g.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(g[i], want[i], 1e-5f * (1 + std::abs(want[i]))) << p->name << "[" << i << "]";
  }
}

TEST(RebalanceTest, WithoutRebalancingThePlannedSharesStay) {
  const Dataset d = testing::quadrants(96, 1);
  const ReplicaRun got = replicas(options(0), d, 1, 1000);
  for (const std::vector<double>& s : got.shares[0]) EXPECT_EQ(s, (std::vector<double>{1, 1}));
  EXPECT_EQ(got.settled, std::vector<bool>(got.shares[0].size(), true)) << "nothing to measure";
  EXPECT_EQ(got.counters[0].samples, 48);
  EXPECT_EQ(got.counters[1].samples, 48);
}

// Only the whole model rebalances: elsewhere the first stage cuts the batches and the
// replicated stage could not tell it.
TEST(RebalanceTest, AReplicatedStageOfAPipelineDoesNotRebalance) {
  std::vector<std::unique_ptr<Group>> group = transport::makeLocalGroup(2);
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(kNet));
  m.build(be, 1);
  Optimizer opt(be, OptimizerOptions{});
  PipelineOptions o = options(3);
  o.replicas = group[0].get();
  try {  // the last of two stages (refused before its missing link is)
    StageTrainer st(m, StageRange::interleaved(1, 2, {LayerRange{2, m.size()}}), nullptr, nullptr,
                    &opt, o);
    FAIL() << "a replicated last stage of two rebalanced";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("only replicas of the whole model rebalance"),
              std::string::npos)
        << e.what();
  }
  o.rebalance_steps = -1;
  o.replicas = nullptr;
  EXPECT_THROW(StageTrainer(m, StageRange::interleaved(0, 1, {LayerRange{0, m.size()}}), nullptr,
                            nullptr, &opt, o),
               InvalidArgument);
}

}  // namespace
}  // namespace tandem
