// Generation speed of a GPT shaped like examples/models/gpt-mini.yaml (width 128, 4 blocks
// of 4 heads, bytes) but with a context of 640, so 512 new tokens fit after a 16-token
// prompt: greedy decoding of 128 and 512 tokens with the key/value cache and without it
// (every step recomputes the prefix), at 1 and 2 threads. Counters: tokens_per_s over
// the decoding steps (after the first token), first_token_ms (the prompt's prefill), and
// weight_gb_per_s: the model's weight bytes times tokens_per_s, the traffic of reading
// every weight once per token (what bounds decoding one sequence), beside BM_MemoryCopy's
// rate at the same threads (a 256 MiB copy on the pool, bytes read and written per second).
// benchmarks/compare_generate.py runs it beside PyTorch's own cache loop.
//
// BM_GenerateLlama: a Llama-shaped model (width 512, 8 heads of which 2 key/value heads,
// rotary embedding, 6 blocks with SwiGLU 1376 wide, a 4096-token vocabulary, context 640):
// greedy decoding of 128 tokens after a 16-token prompt with the cache, at 1 and 2
// threads; benchmarks/torch_peer.py `llama:128` decodes the same shape
// (benchmarks/torch_llama.py) with its own cache loop.
//
// BM_Int8Decode: the same Llama-shaped model with f32 weights and with those weights in
// int8 (`tandem quantize`: a scale per output row, group 0, or per 32 inputs), decoding
// 128 tokens after the same prompt, the two alternated in one process; counters: each
// one's tokens_per_s, `speedup` (int8 over f32) and `weight_bytes_ratio` (the issue's
// goals: >= 1.5x and about 0.25x plus scales).
//
// BM_PipelinedGenerate/sequences:N/wide:W: N sequences of 128 tokens (of gpt-mini's shape,
// or with wide:1 of benchmarks/generate_job.py's 10.7 M model) in flight through 2 stages
// (threads of one thread each, inproc links, the feedback link from the last stage to the
// first; core/pipeline/stage_decoder.h: they travel as 2 batches of N / 2, each stage
// decoding a batch in one pass over its weights) against one single-threaded process
// decoding the same N as one batch (StageDecoder alone, as `tandem serve` runs a model),
// and against one sequence through the same 2 stages. Counters: each one's tokens/s,
// `vs_one_process` (goal >= 1 when each stage has a core; ideal 2, the stages' count)
// and `vs_one_sequence` (the serving issue's goal: >= 1.8x at 4 in flight).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/generate.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "core/pipeline/stage_decoder.h"
#include "core/quantize_model.h"
#include "transport/zmq_link.h"

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

// benchmarks/generate_job.py's wider GPT (10.7 M parameters, a few ms a token) with room
// for a 16-token prompt and 128 new tokens.
constexpr const char* kWide160 = R"(name: gpt-wide-160
input: [160]
layers:
  - embedding: {vocab: 256, dim: 384}
  - positional: {context: 160}
  - transformer: {heads: 6, mlp: 1536}
  - transformer: {heads: 6, mlp: 1536}
  - transformer: {heads: 6, mlp: 1536}
  - transformer: {heads: 6, mlp: 1536}
  - transformer: {heads: 6, mlp: 1536}
  - transformer: {heads: 6, mlp: 1536}
  - layernorm
  - linear: {out: 256}
)";

constexpr const char* kLlama640 = R"(name: llama-bench
input: [640]
layers:
  - embedding: {vocab: 4096, dim: 512}
  - llama: {heads: 8, kv_heads: 2, mlp: 1376, eps: 1e-5, rope_theta: 10000}
  - llama: {heads: 8, kv_heads: 2, mlp: 1376, eps: 1e-5, rope_theta: 10000}
  - llama: {heads: 8, kv_heads: 2, mlp: 1376, eps: 1e-5, rope_theta: 10000}
  - llama: {heads: 8, kv_heads: 2, mlp: 1376, eps: 1e-5, rope_theta: 10000}
  - llama: {heads: 8, kv_heads: 2, mlp: 1376, eps: 1e-5, rope_theta: 10000}
  - llama: {heads: 8, kv_heads: 2, mlp: 1376, eps: 1e-5, rope_theta: 10000}
  - rmsnorm: {eps: 1e-5}
  - linear: {out: 4096, bias: false}
)";

std::vector<int32_t> benchPrompt() {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 16; ++i) prompt.push_back(static_cast<int32_t>("The cat sat on t"[i]));
  return prompt;
}

// Decodes `count` greedy tokens of `spec` per iteration and sets the counters.
void runGenerate(benchmark::State& state, const char* spec, int64_t count, bool cache,
                 int threads) {
  cpu::CpuBackend backend(cpu::CpuOptions{threads});
  Model model(parseModelSpec(spec, "benchmark"));
  model.build(backend, 1);
  const std::vector<int32_t> prompt = benchPrompt();
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
  state.counters["weight_gb_per_s"] =
      static_cast<double>(model.paramBytes()) * static_cast<double>(decoded) / decode_s / 1e9;
  state.counters["threads"] = threads;
}

// The memory's rate beside decoding's weight traffic: 256 MiB (far beyond the caches) copied
// per iteration, split over the pool's threads; counter gb_per_s, the bytes the copy moves
// (each read once and written once) per second.
void BM_MemoryCopy(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  cpu::CpuBackend backend(cpu::CpuOptions{threads});
  const int64_t count = int64_t{64} << 20;  // floats
  const Tensor src = backend.zeros({count});
  const Tensor dst = backend.zeros({count});
  const float* from = backend.f32(src);
  float* to = backend.f32(dst);
  for (auto _ : state)
    backend.pool().parallelFor(count, int64_t{1} << 20, [&](int64_t b, int64_t e) {
      std::memcpy(to + b, from + b, static_cast<size_t>(e - b) * sizeof(float));
    });
  state.counters["gb_per_s"] = benchmark::Counter(2.0 * static_cast<double>(count) * 4 / 1e9,
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
}

void BM_Generate(benchmark::State& state) {
  runGenerate(state, kGpt640, state.range(0), state.range(1) != 0,
              static_cast<int>(state.range(2)));
}

void BM_GenerateLlama(benchmark::State& state) {
  runGenerate(state, kLlama640, state.range(0), true, static_cast<int>(state.range(1)));
}

void BM_Int8Decode(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(1));
  cpu::CpuBackend backend(cpu::CpuOptions{threads});
  Model f32(parseModelSpec(kLlama640, "benchmark"));
  f32.build(backend, 1);
  const ModelFile file = parseModelFile(serializeModel(f32, nullptr, {}), "benchmark");
  const std::unique_ptr<Model> int8 =
      loadModel(quantizeModel(file, state.range(2), backend), backend);
  const std::vector<int32_t> prompt = benchPrompt();
  double seconds[2] = {0, 0};
  int64_t decoded[2] = {0, 0};
  for (auto _ : state) {
    int i = 0;
    for (Model* m : {&f32, int8.get()}) {
      const Generation g = generate(*m, prompt, state.range(0), SamplingOptions{}, true);
      for (double s : g.intervals_s) seconds[i] += s;
      decoded[i++] += static_cast<int64_t>(g.intervals_s.size());
    }
  }
  const double f32_rate = static_cast<double>(decoded[0]) / seconds[0];
  const double int8_rate = static_cast<double>(decoded[1]) / seconds[1];
  state.counters["f32_tokens_per_s"] = f32_rate;
  state.counters["int8_tokens_per_s"] = int8_rate;
  state.counters["speedup"] = int8_rate / f32_rate;
  state.counters["weight_bytes_ratio"] =
      static_cast<double>(int8->paramBytes()) / static_cast<double>(f32.paramBytes());
  state.counters["threads"] = threads;
}

std::vector<int32_t> promptOf(const char* text) {
  std::vector<int32_t> out;
  for (const char* c = text; *c; ++c) out.push_back(static_cast<unsigned char>(*c));
  return out;
}

// Seconds to generate `requests` through 2 stage threads of one thread each.
double pipelinedSeconds(const char* yaml, const std::vector<GenerationRequest>& requests, int run) {
  using namespace std::chrono_literals;
  transport::Context ctx;
  auto pair = [&](const std::string& name) {
    transport::LinkOptions a, b;
    a.bind = "inproc://bench-" + name + "-a";
    b.bind = "inproc://bench-" + name + "-b";
    a.timeout = b.timeout = 60s;
    auto la = std::make_unique<transport::ZmqLink>(ctx, a);
    auto lb = std::make_unique<transport::ZmqLink>(ctx, b);
    la->connect(lb->endpoint());
    lb->connect(la->endpoint());
    return std::make_pair(std::move(la), std::move(lb));
  };
  auto forward = pair("fwd" + std::to_string(run)), back = pair("back" + std::to_string(run));
  const ModelSpec spec = parseModelSpec(yaml, "benchmark");
  const size_t cut = Model(spec).size() / 2;  // embedding, positional, 2 blocks | the rest
  const auto t0 = std::chrono::steady_clock::now();
  auto stage = [&](int s) {
    cpu::CpuBackend backend(cpu::CpuOptions{1});
    Model model(spec);
    const size_t begin = s == 0 ? 0 : cut, end = s == 0 ? cut : model.size();
    model.build(backend, 1, begin, end);
    StageDecoder d(model, StageRange{s, 2, begin, end}, s == 1 ? forward.second.get() : nullptr,
                   s == 0 ? forward.first.get() : nullptr,
                   s == 0 ? back.second.get() : back.first.get());
    d.run(requests);
  };
  std::thread second(stage, 1);
  stage(0);
  second.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Seconds to generate `requests` in one single-threaded process, all in flight as one
// batch (StageDecoder alone, as `tandem serve` runs a model).
double batchedSeconds(const char* yaml, const std::vector<GenerationRequest>& requests) {
  cpu::CpuBackend backend(cpu::CpuOptions{1});
  Model model(parseModelSpec(yaml, "benchmark"));
  model.build(backend, 1);
  DecoderOptions o;
  o.max_in_flight = static_cast<int>(requests.size());
  StageDecoder d(model, StageRange{0, 1, 0, model.size()}, nullptr, nullptr, nullptr, o);
  const auto t0 = std::chrono::steady_clock::now();
  d.run(requests);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BM_PipelinedGenerate(benchmark::State& state) {
  const auto sequences = static_cast<size_t>(state.range(0));
  const char* yaml = state.range(1) == 0 ? kGpt640 : kWide160;
  const char* prompts[] = {"The cat sat on t", "Once upon a time", "A computer is a ",
                           "The meaning of l"};
  std::vector<GenerationRequest> requests;
  for (size_t q = 0; q < sequences; ++q)
    requests.push_back({promptOf(prompts[q % 4]), 128, SamplingOptions{}});
  const std::vector<GenerationRequest> one(requests.begin(), requests.begin() + 1);
  double pipelined = 0, batched = 0, single = 0;
  int run = 0;
  for (auto _ : state) {
    pipelined += pipelinedSeconds(yaml, requests, run++);
    batched += batchedSeconds(yaml, requests);
    single += pipelinedSeconds(yaml, one, run++);
  }
  const double it = static_cast<double>(state.iterations());
  const double tokens = static_cast<double>(sequences) * 128 * it;
  state.counters["pipelined_tokens_per_s"] = tokens / pipelined;
  state.counters["one_process_tokens_per_s"] = tokens / batched;
  state.counters["one_sequence_tokens_per_s"] = 128 * it / single;
  state.counters["vs_one_process"] = batched / pipelined;
  state.counters["vs_one_sequence"] = (tokens / pipelined) / (128 * it / single);
  state.SetLabel(
      "all three: CPU backend, 1 thread per stage or process, greedy, 128 new tokens each, "
      "timed from the first request to the last token, no separate warm-up, alternated in "
      "each iteration; stages: threads of this process over inproc ZeroMQ links (the "
      "product's StageDecoder, not its worker processes: benchmarks/generate_job.py runs "
      "those); one process: StageDecoder alone, all sequences as one batch");
}

BENCHMARK(BM_PipelinedGenerate)
    ->ArgNames({"sequences", "wide"})
    ->ArgsProduct({{4, 8}, {0, 1}})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(BM_Generate)
    ->ArgNames({"tokens", "cache", "threads"})
    ->ArgsProduct({{128, 512}, {1, 0}, {1, 2}})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(BM_MemoryCopy)
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(BM_GenerateLlama)
    ->ArgNames({"tokens", "threads"})
    ->ArgsProduct({{128}, {1, 2}})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(BM_Int8Decode)
    ->ArgNames({"tokens", "threads", "group"})
    ->ArgsProduct({{128}, {1, 2}, {0, 32}})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace tandem::bench
