// Tensor-parallel training on one node (core/train/tensor_parallel.h) against one device
// training the whole model: the same losses, and the merged model and optimizer state
// the whole one's, to rounding.
#include "core/train/tensor_parallel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "backends/opencl/devices.h"
#include "backends/registry.h"
#include "core/model_spec.h"
#include "tests/test_util.h"
#include "transport/local_group.h"

namespace tandem {
namespace {

using testing::expectThrowWith;

// One pair ([1, 3] through relu) and a last linear left whole.
constexpr const char* kNet = R"(name: tp-net
input: [1, 8, 8]
layers: [flatten, {linear: {out: 33}}, relu, {linear: {out: 16}}, tanh, {linear: {out: 4}}]
)";

TEST(TensorParallelTest, TrainsAsTheWholeModelAndMergesBack) {
  const Dataset data = testing::quadrants(160, 5);
  const TrainOptions options{16, 3, true};
  OptimizerOptions sgd;
  sgd.lr = 0.05f;
  auto cpu = makeBackend("cpu");
  Model whole(parseModelSpec(kNet));
  whole.build(*cpu, options.seed);
  Optimizer whole_opt(*cpu, sgd);
  Trainer trainer(whole, whole_opt, options);
  const EpochReport want = trainer.trainEpoch(data, 0, {});

  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(makeBackend("cpu"));
  backends.push_back(makeBackend("cpu"));
  auto groups = transport::makeLocalGroup(2);
  TensorParallelTrainer tp(parseModelSpec(kNet), {backends[0].get(), backends[1].get()},
                           {groups[0].get(), groups[1].get()}, {1, 3}, sgd, options);
  // Rank 1 of 1 : 3 holds 25 of the 33 hidden features (ideal 24.75).
  EXPECT_EQ(tp.model(1).layer(1).outputShape(), Shape({25}));
  EXPECT_EQ(tp.model(0).layer(1).outputShape(), Shape({8}));
  EXPECT_FALSE(tp.resyncs());  // alike devices stay bitwise alike by themselves
  int steps = 0;
  const EpochReport got = tp.trainEpoch(data, 0, [&](const StepReport&) { ++steps; });
  EXPECT_EQ(steps, 10);  // progress from rank 0 only
  EXPECT_NEAR(got.train_loss, want.train_loss, 1e-5 * (1 + want.train_loss));
  // Replicated parameters stay bitwise alike across ranks of alike devices.
  EXPECT_EQ(toHost(tp.model(0).param("5.weight").value),
            toHost(tp.model(1).param("5.weight").value));
  EXPECT_EQ(toHost(tp.model(0).param("3.bias").value), toHost(tp.model(1).param("3.bias").value));

  const TensorParts merged = tp.merged(*cpu);
  for (const Param* p : whole.params())
    testing::expectCloseAll(toHost(merged.model->param(p->name).value), toHost(p->value), 1e-4f,
                            p->name);
  std::map<std::string, Tensor> want_state;
  for (const auto& [name, t] : whole_opt.state()) want_state[name] = t;
  const auto state = merged.optimizer->state();
  ASSERT_EQ(state.size(), want_state.size());
  for (const auto& [name, t] : state)
    testing::expectCloseAll(toHost(t), toHost(want_state.at(name)), 1e-4f, name);
  EXPECT_EQ(merged.optimizer->steps(), whole_opt.steps());

  const EvalResult e = tp.evaluate(data, 32);
  const EvalResult w = evaluate(whole, data, 32);
  EXPECT_NEAR(e.loss, w.loss, 1e-4 * (1 + w.loss));
  EXPECT_EQ(e.samples, w.samples);
}

// A CPU rank beside each OpenCL device: the layers after an all-reduce run on unlike
// kernels, so each step ends with rank 0's replicated parameters sent to the other; they
// stay bitwise equal (through trainEpoch and step), and training follows the whole model.
TEST(TensorParallelTest, UnlikeRanksKeepTheirReplicatedParametersEqual) {
  const Dataset data = testing::quadrants(64, 5);
  const TrainOptions options{16, 3, true};
  OptimizerOptions sgd;
  sgd.lr = 0.05f;
  for (const auto& d : opencl::listClDevices()) {
    SCOPED_TRACE(d.label());
    auto cpu = makeBackend("cpu");
    auto device = makeBackend(d.label());
    auto groups = transport::makeLocalGroup(2);
    TensorParallelTrainer tp(parseModelSpec(kNet), {cpu.get(), device.get()},
                             {groups[0].get(), groups[1].get()}, {3, 1}, sgd, options);
    EXPECT_TRUE(tp.resyncs());
    tp.trainEpoch(data, 0, {});
    std::vector<float> x(static_cast<size_t>(16 * 64), 0.5f);
    std::vector<int32_t> y(16, 1);
    tp.step(x.data(), y.data(), 16);
    int replicated = 0;
    for (Param* p : tp.model(0).params()) {
      if (p->slice) continue;
      ++replicated;
      EXPECT_EQ(toHost(p->value), toHost(tp.model(1).param(p->name).value)) << p->name;
    }
    EXPECT_EQ(replicated, 3);  // 3.bias, 5.weight, 5.bias
  }
}

TEST(TensorParallelTest, RefusesMismatchedRanks) {
  auto cpu = makeBackend("cpu");
  auto groups = transport::makeLocalGroup(2);
  const ModelSpec spec = parseModelSpec(kNet);
  expectThrowWith<InvalidArgument>(
      [&] {
        TensorParallelTrainer(spec, {cpu.get()}, {groups[0].get(), groups[1].get()}, {}, {}, {});
      },
      {"1 backends for 2 group ranks"});
  expectThrowWith<InvalidArgument>(
      [&] {
        TensorParallelTrainer(spec, {cpu.get(), cpu.get()}, {groups[0].get(), groups[1].get()},
                              {1, 2, 3}, {}, {});
      },
      {"3 shares for 2 ranks"});
  expectThrowWith<InvalidArgument>(
      [&] {
        TensorParallelTrainer(spec, {cpu.get(), cpu.get()}, {groups[1].get(), groups[0].get()}, {},
                              {}, {});
      },
      {"group 0 is rank 1"});
}

}  // namespace
}  // namespace tandem
