// reduceInto, the in-process group's kernel, against a scalar reference written here:
// every value the op over the sources in order, bitwise, with NaN, infinities, signed
// zeros and subnormals among the values, tails shorter than a tile, and the outputs
// being the sources.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "core/comm/reduce.h"
#include "core/error.h"
#include "core/random.h"
#include "core/simd.h"

namespace tandem {
namespace {

// Random values spread over many exponents, with the special ones now and then.
std::vector<float> values(uint64_t seed, size_t n) {
  Rng rng(seed);
  const float special[] = {std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           0.0f,
                           -0.0f,
                           std::numeric_limits<float>::denorm_min(),
                           -3 * std::numeric_limits<float>::denorm_min()};
  std::vector<float> v(n);
  for (float& x : v) {
    if (rng.uniform() < 0.05f) {
      x = special[rng.below(std::size(special))];
    } else {
      x = std::ldexp(rng.uniform(-1.0f, 1.0f), static_cast<int>(rng.below(41)) - 20);
    }
  }
  return v;
}

float reference(const std::vector<std::vector<float>>& src, size_t i, ReduceOp op) {
  float v = src[0][i];
  for (size_t k = 1; k < src.size(); ++k) {
    const float x = src[k][i];
    v = op == ReduceOp::kMax ? (v < x ? x : v) : v + x;
  }
  if (op == ReduceOp::kMean) v = v / static_cast<float>(src.size());
  return v;
}

// Equal bit for bit, but any NaN equals any NaN (which operand's payload an addition of
// two NaNs keeps is the compiler's choice).
bool same(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

using Kernel = void (*)(std::span<float* const>, std::span<const float* const>, size_t, size_t,
                        ReduceOp);

void expectReferenceValues(Kernel kernel, const std::string& name) {
  for (const size_t sources : {1, 2, 3, 4, 7}) {
    for (const size_t n : {0, 1, 31, 32, 33, 95, 1000, 4099}) {
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
        std::vector<std::vector<float>> src;
        for (size_t k = 0; k < sources; ++k) src.push_back(values(1000 * k + n, n));
        // A range that starts and ends off a tile's edge where it can.
        const size_t begin = n > 40 ? 3 : 0, end = n > 40 ? n - 5 : n;
        const std::string where = name + ", " + std::to_string(sources) + " sources, " +
                                  std::to_string(n) + " values, " + std::string(reduceOpName(op));

        // Into separate outputs: the range reduced, the rest untouched.
        std::vector<std::vector<float>> out(2, std::vector<float>(n, 42.0f));
        std::vector<float*> outs = {out[0].data(), out[1].data()};
        std::vector<const float*> srcs;
        for (const auto& s : src) srcs.push_back(s.data());
        kernel(outs, srcs, begin, end, op);
        for (size_t i = 0; i < n; ++i) {
          const float want = i >= begin && i < end ? reference(src, i, op) : 42.0f;
          for (const auto& o : out) {
            ASSERT_TRUE(same(o[i], want))
                << where << ": value " << i << " is " << o[i] << ", not " << want;
          }
        }

        // In place: the sources are the outputs.
        std::vector<std::vector<float>> shared = src;
        std::vector<float*> both;
        for (auto& s : shared) both.push_back(s.data());
        const std::vector<const float*> both_src(both.begin(), both.end());
        kernel(both, both_src, begin, end, op);
        for (size_t i = begin; i < end; ++i) {
          const float want = reference(src, i, op);
          for (const auto& s : shared)
            ASSERT_TRUE(same(s[i], want)) << where << ", in place: value " << i;
        }
      }
    }
  }
}

TEST(ReduceIntoTest, EveryValueIsTheOpOverTheSourcesInOrder) {
  expectReferenceValues(&reduceInto, hasAvx2() ? "with AVX2" : "without AVX2");
}

TEST(ReduceIntoTest, ThePortableLoopsGiveTheSameValues) {
  expectReferenceValues(&detail::reduceIntoPortable, "portable");
}

TEST(ReduceIntoTest, MaxKeepsTheEarlierOfEqualOrUnorderedValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // 40 values: a whole tile and a tail, the same cases in both.
  std::vector<float> a(40), b(40);
  for (size_t i = 0; i < 40; i += 4) {
    a[i] = nan, b[i] = 1.0f;            // NaN first: stays
    a[i + 1] = 1.0f, b[i + 1] = nan;    // NaN second: the earlier value stays
    a[i + 2] = -0.0f, b[i + 2] = 0.0f;  // equal: the earlier, -0
    a[i + 3] = 0.0f, b[i + 3] = -0.0f;
  }
  std::vector<float> out(40);
  float* const outs[] = {out.data()};
  const float* const srcs[] = {a.data(), b.data()};
  reduceInto(outs, srcs, 0, 40, ReduceOp::kMax);
  for (size_t i = 0; i < 40; i += 4) {
    EXPECT_TRUE(std::isnan(out[i])) << i;
    EXPECT_EQ(out[i + 1], 1.0f) << i;
    EXPECT_TRUE(std::signbit(out[i + 2])) << i;
    EXPECT_FALSE(std::signbit(out[i + 3])) << i;
  }
}

TEST(ReduceIntoTest, NoSourcesIsRefused) {
  std::vector<float> out(8);
  float* const outs[] = {out.data()};
  EXPECT_THROW(reduceInto(outs, {}, 0, 8, ReduceOp::kSum), InvalidArgument);
}

}  // namespace
}  // namespace tandem
