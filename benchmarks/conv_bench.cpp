// One convolution with bias on the CPU backend, forward and backward (the input's and the
// weights' gradients), at 1 and 2 threads, on the shapes of the example CNN and those a
// ResNet uses (3x3, 3x3 with stride 2, 1x1 with stride 2, a bottleneck's 1x1). Each shape's
// label is "n C HxW oc K s P" (benchmarks/compare_conv.py runs PyTorch's conv2d on the
// same). Counters: forward_ms and backward_ms (means over the iterations), gflops (the
// convolution's FLOPs, forward once and backward twice, over both), beside BM_ConvSgemm's
// 1024^3 sgemm through the backend at the same threads.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>

#include "backends/cpu/cpu_backend.h"
#include "core/random.h"

namespace tandem::bench {
namespace {

struct ConvShape {
  int64_t n, c, h, w, oc, k, stride, pad;
};

constexpr ConvShape kShapes[] = {
    {128, 1, 28, 28, 32, 3, 1, 1},   // examples/models/cnn.yaml, first convolution
    {128, 32, 14, 14, 64, 3, 1, 1},  // and its second
    {8, 64, 56, 56, 64, 3, 1, 1},    // ResNet's first stage, 3x3
    {8, 64, 56, 56, 128, 3, 2, 1},   // into its second stage, 3x3 with stride 2
    {8, 64, 56, 56, 128, 1, 2, 0},   // the shortcut's 1x1 with stride 2
    {8, 256, 28, 28, 64, 1, 1, 0},   // a bottleneck's 1x1
    {8, 128, 28, 28, 128, 3, 1, 1},  // the second stage's 3x3
};

Tensor randomTensor(Backend& be, const Shape& shape, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = rng.normal();
  return toDevice(be, shape, v);
}

void BM_Conv(benchmark::State& state) {
  const ConvShape& s = kShapes[state.range(0)];
  const int threads = static_cast<int>(state.range(1));
  cpu::CpuBackend be(cpu::CpuOptions{threads});
  const Window2d g{s.c, s.h, s.w, s.k, s.k, s.stride, s.stride, s.pad, s.pad};
  const Tensor x = randomTensor(be, {s.n, s.c, s.h, s.w}, 1);
  const Tensor weight = randomTensor(be, {s.oc, s.c, s.k, s.k}, 2);
  const Tensor bias = randomTensor(be, {s.oc}, 3);
  const Shape out{s.n, s.oc, g.outHeight(), g.outWidth()};
  const Tensor dy = randomTensor(be, out, 4);
  Tensor y = be.empty(out), dx = be.empty(x.shape());
  Tensor dw = be.zeros(weight.shape()), db = be.zeros({s.oc});
  // Two untimed rounds first, as the PyTorch peer runs (torch_peer.py conv: --warmup 2).
  for (int i = 0; i < 2; ++i) {
    be.conv2d(x, weight, bias, g, y);
    be.conv2dBackwardData(dy, weight, g, dx);
    be.conv2dBackwardWeight(x, dy, g, dw, db);
  }
  auto now = [] { return std::chrono::steady_clock::now(); };
  double forward_s = 0, backward_s = 0;
  for (auto _ : state) {
    const auto t0 = now();
    be.conv2d(x, weight, bias, g, y);
    const auto t1 = now();
    be.conv2dBackwardData(dy, weight, g, dx);
    be.conv2dBackwardWeight(x, dy, g, dw, db);
    const auto t2 = now();
    forward_s += std::chrono::duration<double>(t1 - t0).count();
    backward_s += std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(std::chrono::duration<double>(t2 - t0).count());
  }
  const double iterations = static_cast<double>(state.iterations());
  const double flops = 2.0 * static_cast<double>(s.n * s.oc * g.outHeight() * g.outWidth()) *
                       static_cast<double>(s.c * s.k * s.k);
  state.counters["forward_ms"] = 1e3 * forward_s / iterations;
  state.counters["backward_ms"] = 1e3 * backward_s / iterations;
  state.counters["gflops"] = 3 * flops * iterations / (forward_s + backward_s) / 1e9;
  state.counters["threads"] = threads;
  char label[96];
  std::snprintf(label, sizeof label, "%lld %lld %lldx%lld %lld %lld %lld %lld",
                static_cast<long long>(s.n), static_cast<long long>(s.c),
                static_cast<long long>(s.h), static_cast<long long>(s.w),
                static_cast<long long>(s.oc), static_cast<long long>(s.k),
                static_cast<long long>(s.stride), static_cast<long long>(s.pad));
  state.SetLabel(label);
}

void BM_ConvSgemm(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  cpu::CpuBackend be(cpu::CpuOptions{threads});
  const Tensor a = randomTensor(be, {1024, 1024}, 5), b = randomTensor(be, {1024, 1024}, 6);
  Tensor c = be.empty({1024, 1024});
  for (auto _ : state) be.gemm(false, false, 1.0f, a, b, 0.0f, c);
  state.counters["gflops"] = benchmark::Counter(2.0 * 1024 * 1024 * 1024 / 1e9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
}

BENCHMARK(BM_Conv)
    ->ArgNames({"shape", "threads"})
    ->ArgsProduct({{0, 1, 2, 3, 4, 5, 6}, {1, 2}})
    ->MinTime(0.5)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConvSgemm)->ArgName("threads")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tandem::bench
