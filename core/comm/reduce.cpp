#include "core/comm/reduce.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "core/simd.h"

#if TANDEM_X86
#include <immintrin.h>
#endif

namespace tandem {

TANDEM_CLONES void accumulate(std::span<float> acc, std::span<const float> x, ReduceOp op) {
  TANDEM_CHECK_MSG(acc.size() == x.size(), InvalidArgument,
                   "accumulate " << x.size() << " values into " << acc.size());
  float* a = acc.data();
  const float* b = x.data();
  const size_t n = acc.size();
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < n; ++i) a[i] = std::max(a[i], b[i]);
  } else {
    for (size_t i = 0; i < n; ++i) a[i] += b[i];
  }
}

TANDEM_CLONES void combine(std::span<float> out, std::span<const float> x, std::span<const float> y,
                           ReduceOp op) {
  TANDEM_CHECK_MSG(out.size() == x.size() && out.size() == y.size(), InvalidArgument,
                   "combine " << x.size() << " and " << y.size() << " values into " << out.size());
  float* o = out.data();
  const float *a = x.data(), *b = y.data();
  const size_t n = out.size();
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < n; ++i) o[i] = std::max(a[i], b[i]);
  } else {
    for (size_t i = 0; i < n; ++i) o[i] = a[i] + b[i];
  }
}

void finishReduce(std::span<float> acc, ReduceOp op, int ranks) {
  if (op != ReduceOp::kMean || ranks == 1) return;
  const auto n = static_cast<float>(ranks);
  for (float& v : acc) v = v / n;
}

namespace detail {

void reduceIntoPortable(std::span<float* const> out, std::span<const float* const> src,
                        size_t begin, size_t end, ReduceOp op) {
  TANDEM_CHECK_MSG(!src.empty(), InvalidArgument, "a reduction of no sources");
  constexpr size_t kBlock = 2048;
  std::array<float, kBlock> buffer;
  for (size_t b = begin; b < end; b += kBlock) {
    const size_t n = std::min(kBlock, end - b);
    const std::span<float> acc(buffer.data(), n);
    if (src.size() > 1) {  // the first two without copying the first
      combine(acc, {src[0] + b, n}, {src[1] + b, n}, op);
    } else {
      std::memcpy(acc.data(), src[0] + b, n * sizeof(float));
    }
    for (size_t k = 2; k < src.size(); ++k) accumulate(acc, {src[k] + b, n}, op);
    finishReduce(acc, op, static_cast<int>(src.size()));
    for (float* o : out) std::memcpy(o + b, acc.data(), n * sizeof(float));
  }
}

}  // namespace detail

namespace {

#if TANDEM_X86
// Tiles of 32 values (four registers): loaded from the first source, reduced with each
// further one in order, divided for the mean, stored to every output; what is left over
// goes the portable way. _mm256_max_ps(x, v) is x > v ? x : v, std::max(v, x): the
// earlier value of equal or unordered ones stays.
template <bool kMax>
__attribute__((target("avx2"))) size_t reduceTilesAvx2(std::span<float* const> out,
                                                       std::span<const float* const> src,
                                                       size_t begin, size_t end, bool mean) {
  constexpr size_t kTile = 32;
  const __m256 divisor = _mm256_set1_ps(static_cast<float>(src.size()));
  size_t i = begin;
  for (; i + kTile <= end; i += kTile) {
    const float* first = src[0] + i;
    __m256 v0 = _mm256_loadu_ps(first), v1 = _mm256_loadu_ps(first + 8),
           v2 = _mm256_loadu_ps(first + 16), v3 = _mm256_loadu_ps(first + 24);
    for (size_t k = 1; k < src.size(); ++k) {
      const float* x = src[k] + i;
      if constexpr (kMax) {
        v0 = _mm256_max_ps(_mm256_loadu_ps(x), v0);
        v1 = _mm256_max_ps(_mm256_loadu_ps(x + 8), v1);
        v2 = _mm256_max_ps(_mm256_loadu_ps(x + 16), v2);
        v3 = _mm256_max_ps(_mm256_loadu_ps(x + 24), v3);
      } else {
        v0 = _mm256_add_ps(v0, _mm256_loadu_ps(x));
        v1 = _mm256_add_ps(v1, _mm256_loadu_ps(x + 8));
        v2 = _mm256_add_ps(v2, _mm256_loadu_ps(x + 16));
        v3 = _mm256_add_ps(v3, _mm256_loadu_ps(x + 24));
      }
    }
    if (mean) {
      v0 = _mm256_div_ps(v0, divisor);
      v1 = _mm256_div_ps(v1, divisor);
      v2 = _mm256_div_ps(v2, divisor);
      v3 = _mm256_div_ps(v3, divisor);
    }
    for (float* o : out) {
      _mm256_storeu_ps(o + i, v0);
      _mm256_storeu_ps(o + i + 8, v1);
      _mm256_storeu_ps(o + i + 16, v2);
      _mm256_storeu_ps(o + i + 24, v3);
    }
  }
  return i;
}
#endif

}  // namespace

void reduceInto(std::span<float* const> out, std::span<const float* const> src, size_t begin,
                size_t end, ReduceOp op) {
  TANDEM_CHECK_MSG(!src.empty(), InvalidArgument, "a reduction of no sources");
#if TANDEM_X86
  if (hasAvx2() && begin < end) {
    // The tiles start on a 32-byte boundary of the first output (the first source if
    // none), the values before it going the portable way: where every buffer is aligned
    // alike, as large allocations are (malloc's 16 bytes past a page), no load or store
    // then splits a cache line. At 16 bytes off, 1 MiB x 2 ranks took a quarter longer.
    const auto at = reinterpret_cast<uintptr_t>((out.empty() ? src[0] : out[0]) + begin);
    const size_t head = std::min(end - begin, (32 - at % 32) % 32 / sizeof(float));
    if (head > 0) detail::reduceIntoPortable(out, src, begin, begin + head, op);
    begin += head;
    const bool mean = op == ReduceOp::kMean && src.size() > 1;
    begin = op == ReduceOp::kMax ? reduceTilesAvx2<true>(out, src, begin, end, mean)
                                 : reduceTilesAvx2<false>(out, src, begin, end, mean);
  }
#endif
  if (begin < end) detail::reduceIntoPortable(out, src, begin, end, op);
}

}  // namespace tandem
