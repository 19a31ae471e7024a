// Tensor parallelism on one node (core/train/tensor_parallel.h): samples/s of a training
// step of the wide MLP (784-1024-1024-10, batch 256; its first linear pair split) and of
// examples/models/cnn.yaml (batch 128; its convolutions split by channels and its linear
// pair by features) and of examples/models/gpt-mini.yaml (batch 16 sequences of 128 tokens;
// its blocks' heads and MLPs split) over 2 ranks of 1 thread each, beside the other ways to use the
// same two cores in the same run: one device of 1 thread (the ideal is 2x it), one device of 2
// threads (our GEMMs split over the pool), and 2 data-parallel replicas of 1 thread.
// Where the machine has an OpenCL device, the same split over the CPU (1 thread) and
// opencl:0, with the features shared in proportion to each device's measured speed on the
// whole step (each timed alone first) against an even split, and against the faster of
// the two alone. Ratios > 1: the tensor split is faster. Every case runs the same fixed
// random batch, 3 warm-up steps, SGD with momentum, uploading the batch each step; the
// tensor ranks and the replicas meet on the in-process group, each on its own thread kept
// for the run (TensorParallelTrainer and DataParallelTrainer, what `tandem train --tensor`
// and `--replicas` run), and every two-way case has the same two cores as the 2-thread one.
// Single-sequence greedy decoding of the GPT benchmarks/generate_job.py measures (width 384,
// 6 blocks of 6 heads, MLP 1536, context 128: 10.7 M parameters) with the key/value cache:
// tokens/s of 2 tensor ranks of 1 thread (each block's heads and MLP split evenly, every
// rank generating in step: TensorParallelGenerator, what `tandem generate --tensor 2` runs)
// against one process of 1 thread (the ideal is 2x it) and of 2 threads; each iteration a
// 4-token prompt and 60 new tokens after the same 4-token warm-up, greedy, the cache on.
//
//   build/release/benchmarks/tensor_bench [--benchmark_min_time=2]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "backends/cpu/blas_core.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/opencl/devices.h"
#include "backends/registry.h"
#include "benchmarks/ratio_reporter.h"
#include "benchmarks/train_step_cases.h"
#include "core/file.h"
#include "core/generate.h"
#include "core/model_spec.h"
#include "core/random.h"
#include "core/train/data_parallel.h"
#include "core/train/tensor_generate.h"
#include "core/train/tensor_parallel.h"
#include "transport/local_group.h"

namespace tandem::bench {
namespace {

constexpr int64_t kBatch = 256;  // the wide MLP's

const StepCase& mlpWide() {
  static const StepCase c{"mlp-wide", kMlpWideYaml, kBatch};
  return c;
}
const StepCase& cnn() {
  static const StepCase c{"cnn", readFile(TANDEM_SOURCE_DIR "/examples/models/cnn.yaml", "model"),
                          128};
  return c;
}
const StepCase& gptMini() {
  static const StepCase c{
      "gpt-mini", readFile(TANDEM_SOURCE_DIR "/examples/models/gpt-mini.yaml", "model"), 16};
  return c;
}

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};

// Random inputs (token ids for a language model) and a label per sample (per position).
Batch randomBatch(const ModelSpec& spec, int64_t batch = kBatch) {
  const Model model(spec);
  const bool tokens = model.inputDType() == DType::kI32;
  const Shape& out = model.outputShape();
  const auto classes = static_cast<uint64_t>(out[out.rank() - 1]);
  Rng rng(7);
  Batch b;
  b.x.resize(static_cast<size_t>(batch * model.inputShape().numel()));
  for (float& v : b.x) v = tokens ? static_cast<float>(rng.below(classes)) : rng.normal();
  const int64_t labels = batch * (tokens ? out[0] : 1);
  for (int64_t i = 0; i < labels; ++i) b.y.push_back(static_cast<int32_t>(rng.below(classes)));
  return b;
}

template <typename StepFn>
void timeSteps(benchmark::State& state, StepFn&& step, int64_t batch = kBatch) {
  for (int i = 0; i < 3; ++i) step();  // warm-up
  for (auto _ : state) benchmark::DoNotOptimize(step());
  state.SetItemsProcessed(state.iterations() * batch);  // items/s: samples/s
}

// One device training the whole model: its step and a Trainer over it.
struct Alone {
  Alone(Backend& backend, const ModelSpec& spec, int64_t batch = kBatch)
      : model(spec), opt(backend, {}) {
    model.build(backend, 1);
    trainer = std::make_unique<Trainer>(model, opt, TrainOptions{batch, 1, false});
  }
  Model model;
  Optimizer opt;
  std::unique_ptr<Trainer> trainer;
};

void whole(benchmark::State& state, const StepCase* c, int threads) {
  const ModelSpec spec = parseModelSpec(c->spec_yaml, "benchmark");
  const Batch b = randomBatch(spec, c->batch);
  cpu::CpuBackend backend(cpu::CpuOptions{threads});
  Alone a(backend, spec, c->batch);
  timeSteps(
      state, [&] { return a.trainer->step(b.x.data(), b.y.data(), c->batch); }, c->batch);
}

// The CPU (1 thread) and opencl:0: each one's steps per second alone (the median of 5
// steps after 2 warm-ups), measured once for the run.
const std::vector<double>& deviceSpeeds() {
  static const std::vector<double> speeds = [] {
    const ModelSpec spec = parseModelSpec(kMlpWideYaml, "benchmark");
    const Batch b = randomBatch(spec);
    std::vector<double> out;
    for (const char* name : {"cpu", "opencl:0"}) {
      auto backend = makeBackend(name, BackendOptions{1});
      Alone a(*backend, spec);
      std::vector<double> seconds;
      for (int i = 0; i < 7; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        a.trainer->step(b.x.data(), b.y.data(), kBatch);
        seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(seconds.begin() + 2, seconds.end());
      out.push_back(1.0 / seconds[4]);
    }
    return out;
  }();
  return speeds;
}

// The faster of the CPU and opencl:0 alone.
void bestAlone(benchmark::State& state) {
  const ModelSpec spec = parseModelSpec(kMlpWideYaml, "benchmark");
  const Batch b = randomBatch(spec);
  const std::vector<double>& speed = deviceSpeeds();
  auto backend = makeBackend(speed[0] >= speed[1] ? "cpu" : "opencl:0", BackendOptions{1});
  Alone a(*backend, spec);
  timeSteps(state, [&] { return a.trainer->step(b.x.data(), b.y.data(), kBatch); });
  state.SetLabel(backend->info().name);
}

// The split over the CPU and opencl:0, shares even or by measured speed.
void mixedRanks(benchmark::State& state, bool by_speed) {
  const ModelSpec spec = parseModelSpec(kMlpWideYaml, "benchmark");
  const Batch b = randomBatch(spec);
  auto cpu = makeBackend("cpu", BackendOptions{1});
  auto gpu = makeBackend("opencl:0", BackendOptions{1});
  auto groups = transport::makeLocalGroup(2);
  const std::vector<double> shares = by_speed ? deviceSpeeds() : std::vector<double>{1, 1};
  TensorParallelTrainer tp(spec, {cpu.get(), gpu.get()}, {groups[0].get(), groups[1].get()}, shares,
                           OptimizerOptions{}, TrainOptions{kBatch, 1, false});
  timeSteps(state, [&] { return tp.step(b.x.data(), b.y.data(), kBatch); });
  char label[64];
  std::snprintf(label, sizeof label, "cpu : opencl:0 = %.1f : %.1f", shares[0], shares[1]);
  state.SetLabel(label);
}

// Two ranks (tensor) or replicas (data) of one thread each.
void twoRanks(benchmark::State& state, const StepCase* c, bool tensor) {
  const ModelSpec spec = parseModelSpec(c->spec_yaml, "benchmark");
  const int64_t n = c->batch;
  const Batch b = randomBatch(spec, n);
  cpu::CpuBackend first(cpu::CpuOptions{1}), second(cpu::CpuOptions{1});
  auto groups = transport::makeLocalGroup(2);
  const std::vector<Backend*> backends{&first, &second};
  const std::vector<Group*> g{groups[0].get(), groups[1].get()};
  if (tensor) {
    TensorParallelTrainer tp(spec, backends, g, {}, OptimizerOptions{}, TrainOptions{n, 1, false});
    timeSteps(
        state, [&] { return tp.step(b.x.data(), b.y.data(), n); }, n);
    return;
  }
  DataParallelOptions o;
  o.batch = n;
  DataParallelTrainer dp(spec, backends, g, OptimizerOptions{}, o);
  timeSteps(
      state, [&] { return dp.step(b.x.data(), b.y.data(), n); }, n);
}

constexpr int64_t kNewTokens = 60;
const std::vector<int32_t> kPrompt{72, 101, 108, 108};

ModelSpec gptWide() {
  std::string yaml =
      "name: gpt-wide\ninput: [128]\nlayers:\n  - embedding: {vocab: 256, dim: 384}\n"
      "  - positional: {context: 128}\n";
  for (int i = 0; i < 6; ++i) yaml += "  - transformer: {heads: 6, mlp: 1536}\n";
  return parseModelSpec(yaml + "  - layernorm\n  - linear: {out: 256}\n", "benchmark");
}

void decodeWhole(benchmark::State& state, int threads) {
  cpu::CpuBackend backend(cpu::CpuOptions{threads});
  Model m(gptWide());
  m.build(backend, 1);
  generate(m, kPrompt, 4, {});  // warm-up
  for (auto _ : state) benchmark::DoNotOptimize(generate(m, kPrompt, kNewTokens, {}).tokens);
  state.SetItemsProcessed(state.iterations() * kNewTokens);  // items/s: tokens/s
}

// What `tandem generate --tensor 2` runs: a whole model's weights split over 2 ranks,
// every rank decoding in step (TensorParallelGenerator).
void decodeTensor(benchmark::State& state) {
  cpu::CpuBackend host(cpu::CpuOptions{1}), first(cpu::CpuOptions{1}), second(cpu::CpuOptions{1});
  Model whole(gptWide());
  whole.build(host, 1);
  auto groups = transport::makeLocalGroup(2);
  TensorParallelGenerator ranks(whole, {&first, &second}, {groups[0].get(), groups[1].get()}, {});
  ranks.generate(kPrompt, 4, {});  // warm-up
  for (auto _ : state) benchmark::DoNotOptimize(ranks.generate(kPrompt, kNewTokens, {}).tokens);
  state.SetItemsProcessed(state.iterations() * kNewTokens);
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  using namespace tandem::bench;
  tandem::cpu::useFasterBlasCore(argv);  // the kernels tandem's programs run
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  for (const StepCase* c : {&mlpWide(), &cnn(), &gptMini()}) {
    const std::string name = "/" + c->name + "-b" + std::to_string(c->batch);
    benchmark::RegisterBenchmark(("tensor-2x1" + name).c_str(), twoRanks, c, true)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("whole-1" + name).c_str(), whole, c, 1)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("whole-2" + name).c_str(), whole, c, 2)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("replicas-2x1" + name).c_str(), twoRanks, c, false)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("decode-tensor-2x1/gpt-wide", decodeTensor)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  for (int threads : {1, 2})
    benchmark::RegisterBenchmark(("decode-whole-" + std::to_string(threads) + "/gpt-wide").c_str(),
                                 decodeWhole, threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  std::vector<RatioRule> rules{
      {"tensor-2x1/", "whole-1/", "tensor 2x1 vs 1 thread (ideal 2)"},
      {"decode-tensor-2x1/", "decode-whole-1/", "decoding: tensor 2x1 vs 1 thread (ideal 2)"},
      {"decode-tensor-2x1/", "decode-whole-2/", "decoding: tensor 2x1 vs 2 threads, 2 cores"},
      {"tensor-2x1/", "whole-2/", "tensor 2x1 vs 2 threads, 2 cores"},
      {"tensor-2x1/", "replicas-2x1/", "tensor 2x1 vs replicas 2x1, 2 cores"}};
  if (!tandem::opencl::listClDevices().empty()) {
    const char* m = "/cpu+opencl0";
    benchmark::RegisterBenchmark((std::string("tensor-by-speed") + m).c_str(), mixedRanks, true)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("tensor-even") + m).c_str(), mixedRanks, false)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("best-alone") + m).c_str(), bestAlone)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    rules.push_back({"tensor-by-speed/", "tensor-even/", "by speed vs even, same devices"});
    rules.push_back({"tensor-by-speed/", "best-alone/", "by speed vs the faster alone"});
  }
  RatioReporter reporter(rules);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.printRatios();
  benchmark::Shutdown();
  return 0;
}
