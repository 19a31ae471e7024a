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

// One set of buffers per size, shared by every benchmark of that size: the reference
// loop and the encoders read the same input and write the same output memory, so where
// the allocator happened to place buffers (measured: up to 2x on this loop) is not
// mistaken for a difference between them.
struct Buffers {
  std::vector<float> in;
  Encoded encoded;                 // the encoders' output; its payload doubles as the loop's
  std::map<Codec, Encoded> coded;  // each codec's encoding of `in`, for the decoders
  std::vector<float> out;          // the decoders' output
};

Buffers& buffers(int64_t bytes) {
  static std::map<int64_t, Buffers> all;
  Buffers& b = all[bytes];
  if (b.in.empty()) {
    b.in.resize(static_cast<size_t>(bytes / 4));
    Rng rng(1);
    for (float& x : b.in) x = rng.normal();
    b.encoded.payload.reserve(static_cast<size_t>(bytes));  // never reallocated below
    for (Codec c : {Codec::kF16, Codec::kBF16, Codec::kI8}) encode(c, b.in, b.coded[c]);
    b.out.resize(b.in.size());
  }
  return b;
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
  Buffers& b = buffers(state.range(0));
  b.encoded.payload.resize(b.in.size() * 2);
  auto* out = reinterpret_cast<uint16_t*>(b.encoded.payload.data());
  for (auto _ : state) {
    plainF16c(b.in.data(), out, b.in.size());
    benchmark::DoNotOptimize(out);
  }
  setRate(state, state.range(0));
}

void BM_Encode(benchmark::State& state, Codec c) {
  Buffers& b = buffers(state.range(0));
  for (auto _ : state) {
    encode(c, b.in, b.encoded);
    benchmark::DoNotOptimize(b.encoded.payload.data());
  }
  setRate(state, state.range(0));
}

void BM_Decode(benchmark::State& state, Codec c) {
  Buffers& b = buffers(state.range(0));
  const Encoded& e = b.coded.at(c);
  for (auto _ : state) {
    decode(c, e.payload, e.scales, e.block, b.out);
    benchmark::DoNotOptimize(b.out.data());
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
