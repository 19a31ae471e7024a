// Samples/s of one training step (forward, backward, SGD with momentum) on the CPU
// backend, for the models and batches that benchmarks/compare_torch.py also runs in
// PyTorch (examples/models/gpt-mini.yaml among them: a token-level loss over [128, 256]).
// Inputs are random and fixed; the step includes uploading the batch. Each case also
// reports its arithmetic rate (`gflops`: the FLOPs of its layers with weights, counted from
// their shapes, forward once and backward twice, over the step's time), beside BM_Sgemm1024's
// rate at the same threads: how far from the machine's GEMM each case runs.
#include <benchmark/benchmark.h>

#include <fstream>
#include <sstream>

#include "backends/cpu/cpu_backend.h"
#include "benchmarks/train_step_cases.h"
#include "core/model_spec.h"
#include "core/random.h"
#include "core/train/trainer.h"

namespace tandem::bench {
namespace {

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A training step's FLOPs in its layers with weights: Layer::flops (forward, per sample)
// times the batch, times 3 (forward, the input's and the weights' gradients), times 2 for
// layer 0 (its input gradient is not computed). Norms, activations and the loss are left out.
double stepFlops(const Model& model, int64_t batch) {
  double total = 0;
  for (size_t l = 0; l < model.size(); ++l) {
    const Layer& layer = model.layer(l);
    if (layer.paramCount() == 0) continue;
    total += static_cast<double>(layer.flops()) * static_cast<double>(batch) * (l == 0 ? 2 : 3);
  }
  return total;
}

void runStep(benchmark::State& state, const std::string& yaml, int64_t batch) {
  const int threads = static_cast<int>(state.range(0));
  cpu::CpuBackend backend(cpu::CpuOptions{threads});
  Model model(parseModelSpec(yaml, "benchmark"));
  model.build(backend, 1);
  Optimizer opt(backend, OptimizerOptions{});
  Trainer trainer(model, opt, TrainOptions{batch, 1, false});
  Rng rng(7);
  // Pixels as normal draws and a class each; a language model's token ids and a next
  // token per position.
  const bool tokens = model.inputDType() == DType::kI32;
  const Shape& out = model.outputShape();
  const auto classes = static_cast<uint64_t>(out[out.rank() - 1]);
  std::vector<float> x(static_cast<size_t>(batch * model.inputShape().numel()));
  for (float& v : x) v = tokens ? static_cast<float>(rng.below(classes)) : rng.normal();
  std::vector<int32_t> y(static_cast<size_t>(batch * labelsPerSample(model)));
  for (auto& v : y) v = static_cast<int32_t>(rng.below(classes));
  for (int i = 0; i < 3; ++i) trainer.step(x.data(), y.data(), batch);  // warm-up
  for (auto _ : state) benchmark::DoNotOptimize(trainer.step(x.data(), y.data(), batch));
  state.counters["samples_per_s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
  state.counters["gflops"] = benchmark::Counter(stepFlops(model, batch) / 1e9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// The GEMM reference: a 1024^3 product through the backend's gemm (OpenBLAS on the pool).
void BM_Sgemm1024(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  cpu::CpuBackend backend(cpu::CpuOptions{threads});
  const int64_t n = 1024;
  Rng rng(3);
  std::vector<float> values(static_cast<size_t>(n * n));
  for (float& v : values) v = rng.normal();
  const Tensor a = toDevice(backend, {n, n}, values), b = toDevice(backend, {n, n}, values);
  Tensor c = backend.empty({n, n});
  backend.gemm(false, false, 1.0f, a, b, 0.0f, c);
  for (auto _ : state) backend.gemm(false, false, 1.0f, a, b, 0.0f, c);
  state.counters["gflops"] = benchmark::Counter(2.0 * static_cast<double>(n * n * n) / 1e9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
}

void BM_TrainStep_MlpWide_b256(benchmark::State& state) { runStep(state, kMlpWideYaml, 256); }
void BM_TrainStep_Cnn_b128(benchmark::State& state) {
  runStep(state, readFile(TANDEM_SOURCE_DIR "/examples/models/cnn.yaml"), 128);
}
void BM_TrainStep_Mlp_b128(benchmark::State& state) {
  runStep(state, readFile(TANDEM_SOURCE_DIR "/examples/models/mlp.yaml"), 128);
}
void BM_TrainStep_GptMini_b16(benchmark::State& state) {
  runStep(state, readFile(TANDEM_SOURCE_DIR "/examples/models/gpt-mini.yaml"), 16);
}
void BM_TrainStep_Resnet18_b32(benchmark::State& state) {
  runStep(state, readFile(TANDEM_SOURCE_DIR "/examples/models/resnet18.yaml"), 32);
}
void BM_TrainStep_MobilenetV2_b32(benchmark::State& state) {
  runStep(state, readFile(TANDEM_SOURCE_DIR "/examples/models/mobilenet_v2.yaml"), 32);
}

BENCHMARK(BM_TrainStep_MlpWide_b256)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TrainStep_Cnn_b128)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TrainStep_Mlp_b128)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TrainStep_GptMini_b16)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TrainStep_Resnet18_b32)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TrainStep_MobilenetV2_b32)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Sgemm1024)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace tandem::bench
