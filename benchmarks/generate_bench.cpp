// Generation speed of a GPT shaped like examples/models/gpt-mini.yaml (width 128, 4 blocks
// of 4 heads, bytes) but with a context of 640, so 512 new tokens fit after a 16-token
// prompt: greedy decoding of 128 and 512 tokens with the key/value cache and without it
// (every step recomputes the prefix), at 1 and 2 threads. Counters: tokens_per_s over
// the decoding steps (after the first token), first_token_ms (the prompt's prefill).
// benchmarks/compare_generate.py runs it beside PyTorch's own cache loop.
#include <benchmark/benchmark.h>

#include "backends/cpu/cpu_backend.h"
#include "core/generate.h"
#include "core/model_spec.h"

namespace tandem::bench {
namespace {

constexpr const char* kGpt640 = R"(name: gpt-mini-640
input: [640]
layers:
  - embedding: {vocab: 256, dim: 128}
  - positional: {context: 640}
  - transformer: {heads: 4, mlp: 512}
  - transformer: {heads: 4, mlp: 512}
  - transformer: {heads: 4, mlp: 512}
  - transformer: {heads: 4, mlp: 512}
  - layernorm
  - linear: {out: 256}
)";

void BM_Generate(benchmark::State& state) {
  const int64_t count = state.range(0);
  const bool cache = state.range(1) != 0;
  const int threads = static_cast<int>(state.range(2));
  cpu::CpuBackend backend(cpu::CpuOptions{threads});
  Model model(parseModelSpec(kGpt640, "benchmark"));
  model.build(backend, 1);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 16; ++i) prompt.push_back(static_cast<int32_t>("The cat sat on t"[i]));
  double decode_s = 0, first_s = 0;
  int64_t decoded = 0;
  for (auto _ : state) {
    const Generation g = generate(model, prompt, count, SamplingOptions{}, cache);
    for (double s : g.intervals_s) decode_s += s;
    decoded += static_cast<int64_t>(g.intervals_s.size());
    first_s += g.first_token_s;
  }
  state.counters["tokens_per_s"] = static_cast<double>(decoded) / decode_s;
  state.counters["first_token_ms"] = 1e3 * first_s / static_cast<double>(state.iterations());
  state.counters["threads"] = threads;
}

BENCHMARK(BM_Generate)
    ->ArgNames({"tokens", "cache", "threads"})
    ->ArgsProduct({{128, 512}, {1, 0}, {1, 2}})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace tandem::bench

BENCHMARK_MAIN();
