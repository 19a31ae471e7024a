// Codecs: bit patterns, the vector (F16C, NEON) and portable fp16 paths agreeing bit for bit, the
// error bounds stated in transport/codec.h, and error feedback keeping the sum of decoded gradients
// within one message's error of the true sum.
#include "transport/codec.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/random.h"
#include "tests/test_util.h"

namespace tandem::transport {
namespace {

std::vector<float> interestingFloats() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -2.0f,
                          65504.0f,
                          65519.0f,
                          65520.0f,
                          1e9f,
                          -1e9f,
                          inf,
                          -inf,
                          std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::signaling_NaN(),
                          std::ldexp(1.0f, -14),
                          std::ldexp(1.0f, -24),
                          std::ldexp(1.0f, -25),
                          std::ldexp(3.0f, -26),
                          std::numeric_limits<float>::denorm_min(),
                          1.0f + std::ldexp(1.0f, -11),
                          1.0f + 3 * std::ldexp(1.0f, -11)};
  Rng rng(5);
  for (int i = 0; i < 200000; ++i)
    v.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng.next())));
  for (int i = 0; i < 20000; ++i)
    v.push_back(std::ldexp(rng.uniform(-1, 1), static_cast<int>(rng.below(40)) - 30));
  return v;
}

TEST(CodecTest, TheVectorHalfPathAndThePortableOneAgreeBitForBit) {
  const auto v = interestingFloats();
  std::vector<uint16_t> a(v.size()), b(v.size());
  floatsToHalf(v.data(), a.data(), v.size());
  floatsToHalfPortable(v.data(), b.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i)
    ASSERT_EQ(a[i], b[i]) << "float bits " << std::bit_cast<uint32_t>(v[i]);
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> fa(65536), fb(65536);
  halfsToFloat(all.data(), fa.data(), all.size());
  halfsToFloatPortable(all.data(), fb.data(), all.size());
  for (uint32_t h = 0; h < 65536; ++h)
    ASSERT_EQ(std::bit_cast<uint32_t>(fa[h]), std::bit_cast<uint32_t>(fb[h])) << "half " << h;
  RecordProperty("half_path", std::string(halfConversionPath()));
}

TEST(CodecTest, VectorisedBFloatMatchesTheScalarReference) {
  const auto v = interestingFloats();
  Encoded e;
  encode(Codec::kBF16, v, e);
  const auto* b = reinterpret_cast<const uint16_t*>(e.payload.data());
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(v[i])) {
      ASSERT_EQ(b[i] & 0x7f80, 0x7f80);
      ASSERT_NE(b[i] & 0x7f, 0);
    } else {
      ASSERT_EQ(b[i], floatToBFloat16(v[i])) << "float bits " << std::bit_cast<uint32_t>(v[i]);
    }
  }
}

TEST(CodecTest, KnownHalfAndBFloatPatterns) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {1.0f, -2.0f, 65504.0f, 65520.0f, inf, -inf, std::ldexp(1.0f, -24),
                                 0.0f};
  Encoded e;
  encode(Codec::kF16, in, e);
  const auto* h = reinterpret_cast<const uint16_t*>(e.payload.data());
  const uint16_t want_h[] = {0x3c00, 0xc000, 0x7bff, 0x7c00, 0x7c00, 0xfc00, 0x0001, 0x0000};
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(h[i], want_h[i]) << i;
  encode(Codec::kBF16, in, e);
  const auto* b = reinterpret_cast<const uint16_t*>(e.payload.data());
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(b[i], floatToBFloat16(in[i])) << i;
  EXPECT_EQ(b[0], 0x3f80);
  EXPECT_EQ(b[4], 0x7f80);
  std::vector<float> nan = {std::numeric_limits<float>::quiet_NaN()}, out(1);
  for (Codec c : {Codec::kF16, Codec::kBF16}) {
    encode(c, nan, e);
    decode(c, e.payload, e.scales, e.block, out);
    EXPECT_TRUE(std::isnan(out[0])) << codecName(c);
  }
}

class CodecRoundTripTest : public ::testing::TestWithParam<std::tuple<Codec, int64_t>> {};

INSTANTIATE_TEST_SUITE_P(AllCodecsAndSizes, CodecRoundTripTest,
                         ::testing::Combine(::testing::Values(Codec::kRaw, Codec::kF16,
                                                              Codec::kBF16, Codec::kI8),
                                            ::testing::Values(0, 1, 7, 13, 127, 1000, 65537)),
                         [](const auto& info) {
                           return std::string(codecName(std::get<0>(info.param))) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST_P(CodecRoundTripTest, ErrorWithinTheStatedBound) {
  const auto [codec, n] = GetParam();
  // Magnitudes from 1e-3 to 1e3: inside fp16's normal range.
  std::vector<float> in(static_cast<size_t>(n));
  Rng rng(static_cast<uint64_t>(n) + 1);
  for (float& x : in) x = (rng.below(2) ? 1.0f : -1.0f) * std::pow(10.0f, rng.uniform(-3, 3));
  Encoded e;
  encode(codec, in, e, 64);
  EXPECT_EQ(e.payload.size(), encodedBytes(codec, DType::kF32, static_cast<uint64_t>(n)));
  std::vector<float> out(in.size(), -1.0f);
  decode(codec, e.payload, e.scales, e.block, out);
  for (size_t i = 0; i < in.size(); ++i) {
    const float x = in[i];
    switch (codec) {
      case Codec::kRaw:
        ASSERT_EQ(out[i], x);
        break;
      case Codec::kF16:
        ASSERT_LE(std::abs(out[i] - x), std::ldexp(std::abs(x), -11)) << x;
        break;
      case Codec::kBF16:
        ASSERT_LE(std::abs(out[i] - x), std::ldexp(std::abs(x), -8)) << x;
        break;
      case Codec::kI8: {
        const size_t b0 = i / 64 * 64;
        float m = 0;
        for (size_t j = b0; j < std::min(in.size(), b0 + 64); ++j) m = std::max(m, std::abs(in[j]));
        ASSERT_LE(std::abs(out[i] - x), m / 254.0f * (1 + 1e-4f)) << x;  // codec.h's bound
        break;
      }
    }
  }
  if (codec == Codec::kI8) {
    EXPECT_EQ(e.scales.size(), static_cast<size_t>((n + 63) / 64));
  }
}

// The int8 encoder's vector path (AVX2 where the CPU has it) against the definition,
// byte for byte: scale = absmax / 127, q = round-half-even(x * 127 / absmax). Blocks
// with absmax 127 put exact ties (k + 0.5) on the rounding boundary.
TEST(CodecTest, VectorisedInt8MatchesTheScalarReference) {
  Rng rng(21);
  for (const uint32_t block : {1u, 8u, 33u, 256u}) {
    for (const size_t n : {size_t{1}, size_t{7}, size_t{100}, size_t{1000}, size_t{4099}}) {
      std::vector<float> in(n);
      for (size_t i = 0; i < n; ++i) {
        const uint64_t pick = rng.below(4);
        in[i] = pick == 0   ? rng.normal() * 1e-40f  // subnormal
                : pick == 1 ? static_cast<float>(rng.below(254)) - 127.0f + 0.5f
                : pick == 2 ? (rng.below(2) ? -0.0f : 127.0f)
                            : rng.normal() * 50.0f;
      }
      Encoded e;
      encode(Codec::kI8, in, e, block);
      ASSERT_EQ(e.scales.size(), (n + block - 1) / block);
      for (size_t b = 0, k = 0; b < n; b += block, ++k) {
        const size_t len = std::min<size_t>(block, n - b);
        float m = 0.0f;
        for (size_t i = b; i < b + len; ++i) m = std::max(m, std::fabs(in[i]));
        ASSERT_EQ(e.scales[k], m / 127.0f) << "block " << k;
        const float inv = m > 0.0f ? 127.0f / m : 0.0f;
        for (size_t i = b; i < b + len; ++i)
          ASSERT_EQ(static_cast<int8_t>(e.payload[i]),
                    static_cast<int8_t>(static_cast<int32_t>(std::nearbyint(in[i] * inv))))
              << "value " << in[i] << " at " << i << ", block " << block;
      }
    }
  }
}

TEST(CodecTest, Int8EdgeCases) {
  Encoded e;
  std::vector<float> zeros(10, 0.0f), out(10, 1.0f);
  encode(Codec::kI8, zeros, e, 4);
  decode(Codec::kI8, e.payload, e.scales, e.block, out);
  EXPECT_EQ(out, zeros);
  std::vector<float> bad = {1.0f, std::numeric_limits<float>::infinity()};
  testing::expectThrowWith<InvalidArgument>([&] { encode(Codec::kI8, bad, e); },
                                            {"index 1", "not finite"});
  std::vector<float> nan_late(100, 0.5f);  // in the vector part of a block, after a larger value
  nan_late[3] = 2.0f;
  nan_late[20] = std::numeric_limits<float>::quiet_NaN();
  testing::expectThrowWith<InvalidArgument>([&] { encode(Codec::kI8, nan_late, e, 64); },
                                            {"index 20"});
  nan_late[20] = 0.5f;
  nan_late[98] = -std::numeric_limits<float>::infinity();  // negative, in a block's tail
  testing::expectThrowWith<InvalidArgument>([&] { encode(Codec::kI8, nan_late, e, 64); },
                                            {"index 98"});
  EXPECT_THROW(encode(Codec::kI8, zeros, e, 0), InvalidArgument);
  std::vector<float> small(3);
  encode(Codec::kI8, zeros, e, 4);
  EXPECT_THROW(decode(Codec::kI8, e.payload, e.scales, e.block, small), FormatError);
  EXPECT_THROW(decode(Codec::kI8, std::span(e.payload).first(10), {}, 4, out), FormatError);
}

TEST(CodecTest, NamesAndSizes) {
  for (Codec c : {Codec::kRaw, Codec::kF16, Codec::kBF16, Codec::kI8})
    EXPECT_EQ(parseCodec(codecName(c)), c);
  EXPECT_EQ(parseCodec("fp32"), Codec::kRaw);
  testing::expectThrowWith<InvalidArgument>([] { parseCodec("fp8"); }, {"'fp8'"});
  EXPECT_EQ(encodedBytes(Codec::kRaw, DType::kI32, 5), 20u);
  EXPECT_EQ(encodedBytes(Codec::kI8, DType::kF32, 5), 5u);
  EXPECT_THROW(encodedBytes(Codec::kF16, DType::kI32, 5), InvalidArgument);
}

TEST(ErrorFeedbackTest, SumOfDecodedTracksTheTrueSumWithoutDrift) {
  // Each message: one large value and many small ones below int8's half step, which plain
  // int8 always rounds to zero. Without feedback the error of the sum grows with every
  // message; with feedback it stays within one message's quantisation error.
  constexpr int kMessages = 2000;
  constexpr size_t kN = 64;
  std::vector<float> grad(kN, 0.001f);
  grad[0] = 1.0f;
  const float step = 1.0f / 127.0f;  // scale of each block: absmax 1
  ErrorFeedback ef;
  Encoded e;
  std::vector<double> sum_true(kN, 0.0), sum_fb(kN, 0.0), sum_plain(kN, 0.0);
  std::vector<float> out(kN);
  double worst_fb = 0;
  for (int m = 0; m < kMessages; ++m) {
    ef.encode(Codec::kI8, grad, e, kN);
    decode(Codec::kI8, e.payload, e.scales, e.block, out);
    for (size_t i = 0; i < kN; ++i) {
      sum_true[i] += grad[i];
      sum_fb[i] += out[i];
    }
    encode(Codec::kI8, grad, e, kN);
    decode(Codec::kI8, e.payload, e.scales, e.block, out);
    for (size_t i = 0; i < kN; ++i) sum_plain[i] += out[i];
    for (size_t i = 0; i < kN; ++i)
      worst_fb = std::max(worst_fb, std::abs(sum_fb[i] - sum_true[i]));
  }
  // Bound: the residual is at most half a step of the block holding it (plus f32 rounding).
  EXPECT_LE(worst_fb, 0.5 * step * 1.01 + 1e-4);
  EXPECT_GT(std::abs(sum_plain[1] - sum_true[1]), 1.0);  // 2000 x 0.001 lost without feedback
  for (float r : ef.residual()) EXPECT_LE(std::abs(r), 0.5f * step * 1.01f);
}

}  // namespace
}  // namespace tandem::transport
