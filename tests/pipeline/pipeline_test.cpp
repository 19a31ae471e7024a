// The pipeline in one process: each stage a thread with its own backend and model slice,
// neighbours joined by inproc links. Equivalence: with fp32 transport, every schedule,
// stage count, microbatch count and recomputation setting gives bitwise the weights of
// single-device gradient accumulation; fp16 activations stay within a stated bound.
#include <gtest/gtest.h>

#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/pipeline/job.h"
#include "core/pipeline/stage_trainer.h"
#include "tests/test_util.h"
#include "transport/zmq_link.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

using Weights = std::map<std::string, std::vector<float>>;

Weights reference(const PipelineOptions& o, const Dataset& d, int epochs) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(testing::kTinyNet));
  m.build(be, o.seed);
  Optimizer opt(be, OptimizerOptions{});
  TrainOptions t{o.batch, o.seed, o.shuffle, o.microbatches};
  Trainer trainer(m, opt, t);
  for (int e = 0; e < epochs; ++e) trainer.trainEpoch(d, e, {});
  Weights w;
  for (Param* p : m.params()) w[p->name] = toHost(p->value);
  return w;
}

struct PipelineRun {
  Weights weights;
  std::vector<double> losses;  // the last stage's, per epoch
  EvalResult eval;
  std::vector<StageCounters> counters;
};

PipelineRun pipeline(int p, const PipelineOptions& o, const Dataset& d, int epochs,
                     transport::Codec codec = transport::Codec::kRaw,
                     const Dataset* test = nullptr) {
  static int run_id = 0;
  const std::string id = std::to_string(run_id++);
  transport::Context ctx;
  const auto ranges = equalStageRanges(Model(parseModelSpec(testing::kTinyNet)).size(), p);
  // Link s joins stage s (its `next`) and stage s + 1 (its `prev`).
  std::vector<std::unique_ptr<transport::ZmqLink>> down, up;
  for (int s = 0; s + 1 < p; ++s) {
    transport::LinkOptions a, b;
    a.bind = "inproc://pipe" + id + "-" + std::to_string(s) + "-down";
    b.bind = "inproc://pipe" + id + "-" + std::to_string(s) + "-up";
    a.codec = b.codec = codec;
    a.timeout = b.timeout = 20s;
    down.push_back(std::make_unique<transport::ZmqLink>(ctx, a));
    up.push_back(std::make_unique<transport::ZmqLink>(ctx, b));
    down.back()->connect(up.back()->endpoint());
    up.back()->connect(down.back()->endpoint());
  }
  PipelineRun run;
  run.counters.resize(static_cast<size_t>(p));
  std::vector<Weights> parts(static_cast<size_t>(p));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(p));
  std::vector<std::thread> threads;
  for (int s = 0; s < p; ++s) {
    threads.emplace_back([&, s] {
      try {
        cpu::CpuBackend be(cpu::CpuOptions{1});
        Model m(parseModelSpec(testing::kTinyNet));
        const auto [begin, end] = ranges[static_cast<size_t>(s)];
        m.build(be, o.seed, begin, end);
        Optimizer opt(be, OptimizerOptions{});
        Link* prev = s > 0 ? up[static_cast<size_t>(s - 1)].get() : nullptr;
        Link* next = s + 1 < p ? down[static_cast<size_t>(s)].get() : nullptr;
        StageTrainer st(m, StageRange{s, p, begin, end}, prev, next, &opt, o);
        const Dataset* data = s == 0 ? &d : nullptr;
        for (int e = 0; e < epochs; ++e) {
          const EpochReport r = st.trainEpoch(data, d.size(), e, {});
          if (s == p - 1) run.losses.push_back(r.train_loss);
        }
        if (test) {
          const EvalResult r = st.evaluate(s == 0 ? test : nullptr, test->size(), 50);
          if (s == p - 1) run.eval = r;
        }
        for (Param* param : m.params())
          parts[static_cast<size_t>(s)][param->name] = toHost(param->value);
        run.counters[static_cast<size_t>(s)] = st.executor().counters();
      } catch (...) {
        errors[static_cast<size_t>(s)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (const Weights& w : parts) run.weights.insert(w.begin(), w.end());
  return run;
}

TEST(PipelineTest, BitwiseEqualToSingleDeviceAccumulation) {
  const Dataset d = testing::quadrants(72, 1);  // 72 = 2 batches of 32 and one of 8
  for (const ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (const int64_t m : {1, 2, 4, 8}) {
      PipelineOptions o;
      o.schedule = kind;
      o.microbatches = m;
      o.batch = 32;
      o.seed = 5;
      const Weights want = reference(o, d, 1);
      for (const int p : {2, 3, 4}) {
        for (const bool recompute : {false, true}) {
          o.recompute = recompute;
          const PipelineRun got = pipeline(p, o, d, 1);
          ASSERT_EQ(got.weights.size(), want.size());
          for (const auto& [name, w] : want)
            ASSERT_EQ(got.weights.at(name), w) << name << ": " << scheduleName(kind) << " p=" << p
                                               << " m=" << m << " recompute=" << recompute;
          // 1F1B keeps at most p - s microbatches stashed; GPipe all of them.
          for (int s = 0; s < p; ++s) {
            const int64_t peak = got.counters[static_cast<size_t>(s)].peak_stash;
            ASSERT_LE(peak, kind == ScheduleKind::k1F1B ? std::min<int64_t>(p - s, m) : m);
          }
        }
      }
    }
  }
}

TEST(PipelineTest, TrainsAndEvaluatesLikeOneDevice) {
  const Dataset train = testing::quadrants(400, 1), test = testing::quadrants(200, 2);
  PipelineOptions o;
  o.batch = 16;
  o.microbatches = 4;
  const PipelineRun got = pipeline(3, o, train, 2, transport::Codec::kRaw, &test);
  ASSERT_EQ(got.losses.size(), 2u);
  EXPECT_LT(got.losses[1], got.losses[0]);
  // The evaluation runs through the stages forward-only; one device gives the same.
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(testing::kTinyNet));
  m.build(be, o.seed);
  for (Param* p : m.params()) be.upload(p->value, got.weights.at(p->name).data());
  const EvalResult want = evaluate(m, test, 50);
  EXPECT_EQ(got.eval.samples, 200);
  EXPECT_EQ(got.eval.accuracy, want.accuracy);
  EXPECT_NEAR(got.eval.loss, want.loss, 1e-5);
  EXPECT_GT(got.eval.accuracy, 0.8);
}

TEST(PipelineTest, Fp16ActivationsStayCloseToFp32) {
  // fp16 rounds each activation and gradient to 11 significant bits (relative error
  // <= 2^-11); over 2 epochs the final loss stays within 2% of the fp32 run's.
  const Dataset d = testing::quadrants(400, 1);
  PipelineOptions o;
  o.batch = 16;
  o.microbatches = 4;
  const PipelineRun fp32 = pipeline(3, o, d, 2);
  const PipelineRun fp16 = pipeline(3, o, d, 2, transport::Codec::kF16);
  EXPECT_NE(fp16.weights, fp32.weights);  // the codec really ran
  EXPECT_NEAR(fp16.losses.back(), fp32.losses.back(), 0.02 * fp32.losses.back());
}

TEST(PipelineTest, MisconfiguredStagesAreNamed) {
  cpu::CpuBackend be;
  Model m(parseModelSpec(testing::kTinyNet));
  m.build(be, 1, 0, 3);
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        StageExecutor(m, StageRange{0, 2, 0, 3}, nullptr, nullptr, nullptr, {});
      },
      {"stage 0", "link to the next stage"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        Stash st;
        m.forward(be.zeros({1, 16, 4, 4}), st, {}, 3, 5);
      },
      {"layers [3, 5) run, but only [0, 3) are built"});
  const Dataset d = testing::quadrants(8, 1);
  StageTrainer lone(m, StageRange{0, 1, 0, 3}, nullptr, nullptr, nullptr, PipelineOptions{});
  testing::expectThrowWith<InvalidArgument>([&] { lone.trainEpoch(nullptr, 8, 0, {}); },
                                            {"the dataset goes to the first stage only"});
}

}  // namespace
}  // namespace tandem
