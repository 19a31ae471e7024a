// The wire header decoder against hostile input: every defect is a FormatError naming it.
#include "transport/wire.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/random.h"
#include "tests/test_util.h"

namespace tandem::transport {
namespace {

using testing::expectThrowWith;

WireHeader sample() {
  WireHeader h;
  h.job = 42;
  h.src_stage = 1;
  h.dst_stage = 2;
  h.microbatch = 7;
  h.kind = MessageKind::kGradient;
  h.shape = Shape{3, 5};
  h.codec = Codec::kI8;
  h.block = 4;
  h.scales = {0.5f, 0.25f, 1.0f, 0.0f};
  h.payload_bytes = 15;
  h.checksum = 0x1234;
  return h;
}

TEST(WireTest, RoundTripKeepsEveryField) {
  const WireHeader h = sample();
  const WireHeader d = decodeHeader(encodeHeader(h));
  EXPECT_EQ(d.job, 42u);
  EXPECT_EQ(d.src_stage, 1);
  EXPECT_EQ(d.dst_stage, 2);
  EXPECT_EQ(d.microbatch, 7);
  EXPECT_EQ(d.kind, MessageKind::kGradient);
  EXPECT_EQ(d.dtype, DType::kF32);
  EXPECT_EQ(d.shape, (Shape{3, 5}));
  EXPECT_EQ(d.codec, Codec::kI8);
  EXPECT_EQ(d.block, 4u);
  EXPECT_EQ(d.scales, h.scales);
  EXPECT_EQ(d.payload_bytes, 15u);
  EXPECT_EQ(d.checksum, std::optional<uint64_t>(0x1234));
  WireHeader raw;
  raw.dtype = DType::kI32;
  raw.kind = MessageKind::kLabel;
  raw.shape = Shape{0};
  EXPECT_FALSE(decodeHeader(encodeHeader(raw)).checksum.has_value());
}

TEST(WireTest, DecodesHeadersAtAnyAlignment) {
  // ZeroMQ may deliver a frame at any offset; decoding must not depend on it.
  const auto good = encodeHeader(sample());
  std::vector<uint8_t> shifted(good.size() + 8);
  for (size_t offset = 0; offset < 8; ++offset) {
    std::copy(good.begin(), good.end(), shifted.begin() + static_cast<std::ptrdiff_t>(offset));
    EXPECT_EQ(decodeHeader(std::span(shifted).subspan(offset, good.size())).microbatch, 7)
        << offset;
  }
}

TEST(WireTest, RandomBytesAndTruncationsAreRejected) {
  const auto good = encodeHeader(sample());
  for (size_t len = 0; len < good.size(); ++len)
    EXPECT_THROW(decodeHeader(std::span(good).first(len)), FormatError) << len;
  Rng rng(9);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> junk(rng.below(300));
    for (auto& b : junk) b = static_cast<uint8_t>(rng.below(256));
    if (trial % 2 && junk.size() >= 8) std::copy_n("TDW1", 4, junk.begin() + 4);
    EXPECT_THROW(decodeHeader(junk), FormatError);
  }
  for (int trial = 0; trial < 2000; ++trial) {  // flipped bytes: rejected or still consistent
    auto bad = good;
    bad[rng.below(bad.size())] ^= static_cast<uint8_t>(1 + rng.below(255));
    try {
      const WireHeader d = decodeHeader(bad);
      EXPECT_EQ(d.payload_bytes,
                encodedBytes(d.codec, d.dtype, static_cast<uint64_t>(d.shape.numel())));
    } catch (const FormatError&) {
    }
  }
}

TEST(WireTest, InconsistentFieldsAreNamed) {
  WireHeader h = sample();
  h.payload_bytes = 16;
  expectThrowWith<FormatError>([&] { decodeHeader(encodeHeader(h)); },
                               {"payload_bytes 16", "[3, 5]", "15 bytes"});
  h = sample();
  h.codec = static_cast<Codec>(9);
  expectThrowWith<FormatError>([&] { decodeHeader(encodeHeader(h)); }, {"unknown codec 9"});
  h = sample();
  h.kind = static_cast<MessageKind>(7);
  expectThrowWith<FormatError>([&] { decodeHeader(encodeHeader(h)); }, {"unknown message kind 7"});
  h = sample();
  h.dtype = static_cast<DType>(12);
  expectThrowWith<FormatError>([&] { decodeHeader(encodeHeader(h)); }, {"unknown dtype 12"});
  h = sample();
  h.dtype = DType::kI32;
  expectThrowWith<FormatError>([&] { decodeHeader(encodeHeader(h)); }, {"int8 with dtype i32"});
  h = sample();
  h.scales.pop_back();
  expectThrowWith<FormatError>([&] { decodeHeader(encodeHeader(h)); },
                               {"3 int8 scales for 4 blocks"});
  h = sample();
  h.scales[1] = -1.0f;
  expectThrowWith<FormatError>([&] { decodeHeader(encodeHeader(h)); }, {"int8 scale -1"});
  h = sample();
  h.block = 0;
  expectThrowWith<FormatError>([&] { decodeHeader(encodeHeader(h)); }, {"block size 0"});
  h = sample();
  h.codec = Codec::kF16;
  h.payload_bytes = 30;
  expectThrowWith<FormatError>([&] { decodeHeader(encodeHeader(h)); },
                               {"carries no block size or scales"});
  h = sample();
  h.version = 2;
  expectThrowWith<FormatError>([&] { decodeHeader(encodeHeader(h)); }, {"protocol version 2"});
}

TEST(WireTest, FuzzerFindingsStayFixed) {
  // libFuzzer (tests/fuzz/wire_header_fuzz): an int8 header of zero elements whose
  // scales field is absent was dereferenced as a null vector.
  const std::vector<uint8_t> missing_scales = {
      0x24, 0x00, 0x00, 0x00, 0x54, 0x44, 0x57, 0x31, 0x18, 0x00, 0x2c, 0x00, 0x2a, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x1c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x18, 0x00, 0x17, 0x00,
      0x10, 0x00, 0x0c, 0x00, 0x04, 0x00, 0x1c, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03,
      0x28, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x01, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x03, 0x28, 0x00, 0x15, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x02, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  try {
    const WireHeader h = decodeHeader(missing_scales);
    EXPECT_TRUE(h.scales.empty());
  } catch (const FormatError&) {
  }
}

TEST(WireTest, AMisalignedShapeVectorIsReadSafely) {
  // libFuzzer under UBSan: the verifier passed a header whose int64 shape vector sits at
  // 4 mod 8, and the shape was read with misaligned loads. (The sanitizer build fails
  // this test if the read comes back.)
  const std::vector<uint8_t> misaligned_shape = {
      0x24, 0x00, 0x00, 0x00, 0x54, 0x44, 0x57, 0x31, 0x1c, 0x00, 0x2c, 0x00, 0x2a, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x1c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x18, 0x00, 0x17, 0x00,
      0x10, 0x00, 0x0c, 0x00, 0x04, 0x00, 0x1c, 0x00, 0x00, 0x00, 0x0f, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x0d, 0x9b, 0x00, 0x00,
      0x0c, 0x00, 0x00, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x01, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x01, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff,
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00};
  // A scalar's empty shape vector reads back empty (the sanitizer build: no null
  // pointer reaches memcpy).
  WireHeader scalar;
  scalar.shape = Shape{};
  scalar.payload_bytes = 4;
  EXPECT_EQ(decodeHeader(encodeHeader(scalar)).shape, Shape{});
  // Its one dimension, read byte-wise, is too large: refused, named.
  expectThrowWith<FormatError>([&] { decodeHeader(misaligned_shape); },
                               {"shape [17179934720] exceeds the size cap"});
}

TEST(WireTest, OversizeMessagesAreRejected) {
  WireHeader h;
  h.shape = Shape{1 << 20, 1 << 20};
  h.payload_bytes = uint64_t{4} << 40;
  expectThrowWith<FormatError>([&] { decodeHeader(encodeHeader(h)); }, {"exceeds"});
  h.shape = Shape{int64_t{1} << 40, int64_t{1} << 40, 1 << 20};
  expectThrowWith<FormatError>([&] { decodeHeader(encodeHeader(h)); }, {"overflows"});
  // Found by the fuzzer: zero elements in all, but the running product overflows int64
  // before the zero (Shape::numel would throw later, outside the reject path).
  h.shape = Shape{4294901760, 4294967290, 0};
  h.payload_bytes = 0;
  expectThrowWith<FormatError>([&] { decodeHeader(encodeHeader(h)); }, {"overflows"});
  WireLimits tight;
  tight.max_header_bytes = 16;
  expectThrowWith<FormatError>([&] { decodeHeader(encodeHeader(sample()), tight); },
                               {"exceeds the cap of 16"});
}

TEST(WireTest, PayloadLengthAndChecksumAreChecked) {
  std::vector<uint8_t> payload(15);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7);
  WireHeader h = sample();
  h.checksum = payloadChecksum(payload);
  const WireHeader d = decodeHeader(encodeHeader(h));
  EXPECT_NO_THROW(checkPayload(d, payload));
  payload[3] ^= 1;
  expectThrowWith<FormatError>([&] { checkPayload(d, payload); }, {"checksum mismatch"});
  expectThrowWith<FormatError>([&] { checkPayload(d, std::span(payload).first(14)); },
                               {"14 bytes", "announced 15"});
}

}  // namespace
}  // namespace tandem::transport
