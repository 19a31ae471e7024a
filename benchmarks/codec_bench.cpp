// Encode and decode throughput of each codec (GB/s of f32 input, 1 thread) at 64 KiB,
// 1 MiB and 16 MiB, beside a plain F16C conversion loop over the same data, measured in
// the same run. At the end a table prints each codec's ratio to that loop; the targets
// (transport issue): fp16 >= 0.8x, bf16 and int8 >= 0.5x.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "benchmarks/ratio_reporter.h"
#include "core/random.h"
#include "transport/codec.h"

namespace tandem::transport {
namespace {

std::vector<float> data(int64_t bytes) {
  std::vector<float> v(static_cast<size_t>(bytes / 4));
  Rng rng(1);
  for (float& x : v) x = rng.normal();
  return v;
}

void setRate(benchmark::State& state, int64_t bytes) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * bytes);
}

// The reference: a bare F16C loop, what any fp16 conversion is judged against.
__attribute__((target("avx,f16c"))) void plainF16c(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
}

void BM_PlainF16cLoop(benchmark::State& state) {
  const auto in = data(state.range(0));
  std::vector<uint16_t> out(in.size());
  for (auto _ : state) {
    plainF16c(in.data(), out.data(), in.size());
    benchmark::DoNotOptimize(out.data());
  }
  setRate(state, state.range(0));
}

void BM_Encode(benchmark::State& state, Codec c) {
  const auto in = data(state.range(0));
  Encoded e;
  encode(c, in, e);
  for (auto _ : state) {
    encode(c, in, e);
    benchmark::DoNotOptimize(e.payload.data());
  }
  setRate(state, state.range(0));
}

void BM_Decode(benchmark::State& state, Codec c) {
  const auto in = data(state.range(0));
  Encoded e;
  encode(c, in, e);
  std::vector<float> out(in.size());
  for (auto _ : state) {
    decode(c, e.payload, e.scales, e.block, out);
    benchmark::DoNotOptimize(out.data());
  }
  setRate(state, state.range(0));
}

#define SIZES ->Arg(64 << 10)->Arg(1 << 20)->Arg(16 << 20)
BENCHMARK(BM_PlainF16cLoop) SIZES;
BENCHMARK_CAPTURE(BM_Encode, fp16, Codec::kF16) SIZES;
BENCHMARK_CAPTURE(BM_Encode, bf16, Codec::kBF16) SIZES;
BENCHMARK_CAPTURE(BM_Encode, int8, Codec::kI8) SIZES;
BENCHMARK_CAPTURE(BM_Decode, fp16, Codec::kF16) SIZES;
BENCHMARK_CAPTURE(BM_Decode, bf16, Codec::kBF16) SIZES;
BENCHMARK_CAPTURE(BM_Decode, int8, Codec::kI8) SIZES;

}  // namespace
}  // namespace tandem::transport

int main(int argc, char** argv) {
  std::printf("fp16 path: %s\n", tandem::transport::hasF16C() ? "F16C" : "portable");
  std::vector<tandem::bench::RatioRule> rules;
  for (const char* dir : {"Encode", "Decode"})
    for (const char* codec : {"fp16", "bf16", "int8"})
      rules.push_back({std::string("BM_") + dir + "/" + codec, "BM_PlainF16cLoop",
                       std::string(dir) + " " + codec + " vs F16C loop"});
  return tandem::bench::runWithRatios(argc, argv, rules);
}
