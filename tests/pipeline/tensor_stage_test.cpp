// A tensor-split stage inside a pipeline (core/pipeline/tensor_stage.h): three stages in
// one process, the middle one split over two ranks with unequal shares, against one
// device's gradient accumulation — the same losses and, merged back, the same weights and
// optimizer state to rounding; the split stage's neighbours see one stage.
#include "core/pipeline/tensor_stage.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "backends/opencl/devices.h"
#include "backends/registry.h"
#include "core/model_spec.h"
#include "core/train/tensor_parallel.h"
#include "tests/test_util.h"
#include "transport/local_group.h"
#include "transport/zmq_link.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using testing::expectThrowWith;

// Stage 1 ([2, 5)) holds a linear pair through relu; stages 0 and 2 are whole.
constexpr const char* kNet = R"(name: ts-net
input: [1, 8, 8]
layers: [flatten, {linear: {out: 24}}, {linear: {out: 33}}, relu, {linear: {out: 16}}, tanh,
         {linear: {out: 4}}]
)";
const std::vector<LayerRange> kRanges = {{0, 2}, {2, 5}, {5, 7}};

struct Result {
  std::vector<double> losses;
  EvalResult eval;
  std::map<std::string, std::vector<float>> weights, state;
  int progress_calls = 0;
};

void collect(const Model& m, const Optimizer& o, Result& out) {
  for (const Param* p : m.params()) out.weights[p->name] = toHost(p->value);
  for (const auto& [name, t] : o.state()) out.state[name] = toHost(t);
}

PipelineOptions options(ScheduleKind kind) {
  PipelineOptions o;
  o.schedule = kind;
  o.microbatches = 4;
  o.batch = 16;
  o.seed = 3;
  return o;
}

OptimizerOptions sgd() {
  OptimizerOptions o;
  o.lr = 0.05f;
  o.momentum = 0.9f;
  return o;
}

Result reference(const PipelineOptions& po, const Dataset& train, const Dataset& test, int epochs) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(kNet));
  m.build(be, po.seed);
  Optimizer opt(be, sgd());
  Trainer trainer(m, opt, TrainOptions{po.batch, po.seed, po.shuffle, po.microbatches});
  Result r;
  for (int e = 0; e < epochs; ++e) r.losses.push_back(trainer.trainEpoch(train, e, {}).train_loss);
  r.eval = evaluate(m, test, 50);
  collect(m, opt, r);
  return r;
}

// The three stages, each a thread; stage 1 a TensorStage of `shares.size()` ranks, rank r
// on devices[r] (default: every rank on the CPU).
Result splitPipeline(const PipelineOptions& po, const Dataset& train, const Dataset& test,
                     int epochs, const std::vector<double>& shares,
                     std::vector<std::string> devices = {}) {
  devices.resize(shares.size(), "cpu");
  transport::Context ctx;
  static int run = 0;
  const std::string id = std::to_string(run++);
  std::vector<std::unique_ptr<transport::ZmqLink>> down, up;  // down[s]: s's end to s + 1
  for (int s = 0; s < 2; ++s) {
    transport::LinkOptions a, b;
    a.bind = "inproc://ts" + id + "-" + std::to_string(s) + "-down";
    b.bind = "inproc://ts" + id + "-" + std::to_string(s) + "-up";
    a.timeout = b.timeout = 20s;
    down.push_back(std::make_unique<transport::ZmqLink>(ctx, a));
    up.push_back(std::make_unique<transport::ZmqLink>(ctx, b));
    down.back()->connect(up.back()->endpoint());
    up.back()->connect(down.back()->endpoint());
  }
  Result result;
  std::mutex mu;
  std::vector<std::exception_ptr> errors;
  auto guard = [&](const std::function<void()>& fn) {
    try {
      fn();
    } catch (...) {
      std::lock_guard lock(mu);
      errors.push_back(std::current_exception());
    }
  };
  const ModelSpec spec = parseModelSpec(kNet);
  auto whole_stage = [&](int s) {
    guard([&] {
      cpu::CpuBackend be(cpu::CpuOptions{1});
      Model m(spec);
      m.build(be, po.seed, {kRanges[static_cast<size_t>(s)]});
      Optimizer opt(be, sgd());
      StageTrainer st(m,
                      StageRange(s, 3, kRanges[static_cast<size_t>(s)].begin,
                                 kRanges[static_cast<size_t>(s)].end),
                      s == 2 ? up[1].get() : nullptr, s == 0 ? down[0].get() : nullptr, &opt, po);
      std::vector<double> losses;
      for (int e = 0; e < epochs; ++e)
        losses.push_back(st.trainEpoch(s == 0 ? &train : nullptr, train.size(), e, {}).train_loss);
      const EvalResult ev = st.evaluate(s == 0 ? &test : nullptr, test.size(), 50);
      std::lock_guard lock(mu);
      collect(m, opt, result);
      if (s == 2) {
        result.losses = losses;
        result.eval = ev;
      }
    });
  };
  std::thread first(whole_stage, 0), last(whole_stage, 2);
  guard([&] {
    const int ranks = static_cast<int>(shares.size());
    auto groups = transport::makeLocalGroup(ranks);
    std::vector<std::unique_ptr<Backend>> backends;
    std::vector<std::unique_ptr<Model>> models;
    std::vector<std::unique_ptr<Optimizer>> optimizers;
    std::vector<TensorStage::Rank> parts;
    for (int r = 0; r < ranks; ++r) {
      backends.push_back(makeBackend(devices[static_cast<size_t>(r)], BackendOptions{1}));
      models.push_back(std::make_unique<Model>(spec));
      models.back()->splitForTensor(2, 5, *groups[static_cast<size_t>(r)], shares);
      models.back()->build(*backends.back(), po.seed, {kRanges[1]});
      optimizers.push_back(std::make_unique<Optimizer>(*backends.back(), sgd()));
      parts.push_back(
          {models.back().get(), optimizers.back().get(), groups[static_cast<size_t>(r)].get()});
    }
    TensorStage stage(parts, StageRange(1, 3, 2, 5), up[0].get(), down[1].get(), po);
    EXPECT_EQ(stage.resyncs(), devices[0] != devices[1]);
    for (int e = 0; e < epochs; ++e)
      stage.trainEpoch(nullptr, train.size(), e, [&](const StepReport&) {
        ++result.progress_calls;
        // Every rank waits here, none into the next step: their replicated parameters
        // are this step's, and they have run the same forwards.
        EXPECT_EQ(toHost(models[0]->param("4.bias").value),
                  toHost(models[1]->param("4.bias").value));
        EXPECT_EQ(stage.executor(1).counters().microbatches,
                  stage.executor(0).counters().microbatches);
      });
    stage.evaluate(nullptr, test.size(), 50);
    for (int r = 1; r < ranks; ++r) {  // replicated parameters stay alike, whatever the devices
      for (const Param* p : models[0]->params()) {
        if (!p->slice) {
          EXPECT_EQ(toHost(p->value), toHost(models[static_cast<size_t>(r)]->param(p->name).value))
              << "rank " << r << ": " << p->name;
        }
      }
    }
    std::vector<const Model*> ms;
    std::vector<const Optimizer*> os;
    for (int r = 0; r < ranks; ++r) {
      ms.push_back(models[static_cast<size_t>(r)].get());
      os.push_back(optimizers[static_cast<size_t>(r)].get());
    }
    cpu::CpuBackend host(cpu::CpuOptions{1});
    const TensorParts merged = mergeTensorParts(spec, {kRanges[1]}, ms, os, host, sgd());
    std::lock_guard lock(mu);
    collect(*merged.model, *merged.optimizer, result);
  });
  first.join();
  last.join();
  for (size_t i = 1; i < errors.size(); ++i) {  // the first is raised; the others said
    try {
      std::rethrow_exception(errors[i]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
  }
  if (!errors.empty()) std::rethrow_exception(errors.front());
  return result;
}

void expectClose(const std::map<std::string, std::vector<float>>& got,
                 const std::map<std::string, std::vector<float>>& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, values] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const std::vector<float>& g = got.at(name);
    ASSERT_EQ(g.size(), values.size()) << name;
    for (size_t i = 0; i < g.size(); ++i)
      ASSERT_NEAR(g[i], values[i], tolerance * (1 + std::abs(values[i])))
          << name << "[" << i << "]";
  }
}

TEST(TensorStageTest, ASplitMiddleStageTrainsAsOneDeviceAccumulates) {
  const Dataset train = testing::quadrants(96, 5), test = testing::quadrants(50, 6);
  for (const ScheduleKind kind : {ScheduleKind::k1F1B, ScheduleKind::kGPipe}) {
    for (const std::vector<double>& shares :
         std::vector<std::vector<double>>{{1, 1}, {1, 3}, {2, 1, 1}}) {
      SCOPED_TRACE(::testing::Message()
                   << static_cast<int>(kind) << ", " << shares.size() << " ranks");
      const PipelineOptions po = options(kind);
      const Result want = reference(po, train, test, 2);
      const Result got = splitPipeline(po, train, test, 2, shares);
      // 6 steps an epoch (96 samples, batch 16), progress on rank 0 only.
      EXPECT_EQ(got.progress_calls, 12);
      ASSERT_EQ(got.losses.size(), want.losses.size());
      for (size_t e = 0; e < want.losses.size(); ++e)
        EXPECT_NEAR(got.losses[e], want.losses[e], 1e-5 * (1 + want.losses[e]));
      EXPECT_EQ(got.eval.samples, want.eval.samples);
      EXPECT_NEAR(got.eval.loss, want.eval.loss, 1e-5 * (1 + want.eval.loss));
      // The row layer's all-reduce regroups one sum: weights agree to rounding.
      expectClose(got.weights, want.weights, 1e-4);
      expectClose(got.state, want.state, 1e-4);
    }
  }
}

// A CPU rank and an OpenCL rank (each OpenCL device found; POCL in CI) share the stage:
// each step ends with rank 0's replicated parameters sent to the other, and training
// follows one device's to the kernels' rounding.
TEST(TensorStageTest, ACpuAndAnOpenClRankShareTheStage) {
  const Dataset train = testing::quadrants(96, 5), test = testing::quadrants(50, 6);
  const PipelineOptions po = options(ScheduleKind::k1F1B);
  const Result want = reference(po, train, test, 1);
  for (const auto& d : opencl::listClDevices()) {
    SCOPED_TRACE(d.label());
    const Result got = splitPipeline(po, train, test, 1, {3, 1}, {"cpu", d.label()});
    ASSERT_EQ(got.losses.size(), 1u);
    EXPECT_NEAR(got.losses[0], want.losses[0], 1e-4 * (1 + want.losses[0]));
    expectClose(got.weights, want.weights, 1e-3);
  }
}

TEST(TensorStageTest, RefusesRanksThatAreNotItsGroup) {
  auto groups = transport::makeLocalGroup(2);
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(kNet));
  m.splitForTensor(2, 5, *groups[1], {1, 1});
  m.build(be, 1, {kRanges[1]});
  expectThrowWith<InvalidArgument>(
      [&] {
        TensorStage({{&m, nullptr, groups[1].get()}}, StageRange(1, 3, 2, 5), nullptr, nullptr, {});
      },
      {"stage 1", "tensor rank 0"});
  auto replicas = transport::makeLocalGroup(2);
  PipelineOptions po;
  po.replicas = replicas[0].get();
  expectThrowWith<Unsupported>(
      [&] {
        TensorStage({{&m, nullptr, groups[0].get()}}, StageRange(1, 3, 2, 5), nullptr, nullptr, po);
      },
      {"stage 1", "cannot have replicas"});
}

}  // namespace
}  // namespace tandem
