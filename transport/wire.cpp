#include "transport/wire.h"

#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/flatbuffers_read.h"
#include "transport/schema/wire_generated.h"

namespace tandem::transport {

namespace {

[[noreturn]] void bad(const std::string& what) { throw FormatError("bad wire header: " + what); }

}  // namespace

uint64_t payloadChecksum(std::span<const uint8_t> payload) {
  return XXH3_64bits(payload.data(), payload.size());
}

std::vector<uint8_t> encodeHeader(const WireHeader& h) {
  flatbuffers::FlatBufferBuilder b(256 + h.scales.size() * 4);
  auto shape = b.CreateVector(h.shape.dims());
  auto scales = b.CreateVector(h.scales);
  wire::HeaderBuilder hb(b);
  hb.add_version(h.version);
  hb.add_job(h.job);
  hb.add_src_stage(h.src_stage);
  hb.add_dst_stage(h.dst_stage);
  hb.add_microbatch(h.microbatch);
  hb.add_kind(static_cast<wire::Kind>(h.kind));
  hb.add_dtype(static_cast<wire::DType>(h.dtype));
  hb.add_shape(shape);
  hb.add_codec(static_cast<wire::Codec>(h.codec));
  hb.add_block(h.block);
  hb.add_scales(scales);
  hb.add_payload_bytes(h.payload_bytes);
  hb.add_has_checksum(h.checksum.has_value());
  hb.add_checksum(h.checksum.value_or(0));
  wire::FinishHeaderBuffer(b, hb.Finish());
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

WireHeader decodeHeader(std::span<const uint8_t> bytes, const WireLimits& limits) {
  if (bytes.size() < 8) bad(std::to_string(bytes.size()) + " bytes is too short");
  if (bytes.size() > limits.max_header_bytes)
    bad(std::to_string(bytes.size()) + " bytes exceeds the cap of " +
        std::to_string(limits.max_header_bytes));
  // FlatBuffers reads fields in place and needs them aligned; ZeroMQ hands small frames
  // at arbitrary offsets inside its receive buffer. Copy those (headers are small).
  std::vector<uint64_t> aligned;
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint64_t) != 0) {
    aligned.resize((bytes.size() + 7) / 8);
    std::memcpy(aligned.data(), bytes.data(), bytes.size());
    bytes = {reinterpret_cast<const uint8_t*>(aligned.data()), bytes.size()};
  }
  if (!wire::HeaderBufferHasIdentifier(bytes.data())) bad("missing the 'TDW1' identifier");
  flatbuffers::Verifier verifier(bytes.data(), bytes.size(), /*max_depth=*/8, /*max_tables=*/16);
  if (!wire::VerifyHeaderBuffer(verifier)) bad("failed FlatBuffers verification");
  const wire::Header* w = wire::GetHeader(bytes.data());

  WireHeader h;
  h.version = w->version();
  if (h.version != kWireVersion)
    bad("protocol version " + std::to_string(h.version) + ", this build speaks " +
        std::to_string(kWireVersion));
  h.job = w->job();
  h.src_stage = w->src_stage();
  h.dst_stage = w->dst_stage();
  h.microbatch = w->microbatch();
  if (w->kind() > wire::Kind_MAX) bad("unknown message kind " + std::to_string(w->kind()));
  h.kind = static_cast<MessageKind>(w->kind());
  if (w->dtype() > wire::DType_MAX) bad("unknown dtype " + std::to_string(w->dtype()));
  h.dtype = static_cast<DType>(w->dtype());
  if (w->codec() > wire::Codec_MAX) bad("unknown codec " + std::to_string(w->codec()));
  h.codec = static_cast<Codec>(w->codec());

  const auto* dims = w->shape();
  if (dims && dims->size() > static_cast<size_t>(Shape::kMaxRank))
    bad("shape of rank " + std::to_string(dims->size()));
  const std::vector<int64_t> d = copyInt64s(dims);
  for (int64_t v : d)
    if (v < 0) bad("negative dimension " + std::to_string(v));
  h.shape = Shape(std::span<const int64_t>(d));
  // The same signed, left-to-right product Shape::numel computes, so nothing downstream
  // can overflow on a shape that passed here (found by the fuzzer: [2^32, 2^32, 0] has
  // zero elements but overflows on the way).
  int64_t count = 1;
  for (int64_t v : d)
    if (__builtin_mul_overflow(count, v, &count)) bad("shape " + h.shape.str() + " overflows");
  const auto numel = static_cast<uint64_t>(count);

  if (h.codec != Codec::kRaw && h.dtype != DType::kF32)
    bad("codec " + std::string(codecName(h.codec)) + " with dtype " +
        std::string(dtypeName(h.dtype)) + " (lossy codecs carry f32 tensors only)");
  if (numel > limits.max_payload_bytes) bad("shape " + h.shape.str() + " exceeds the size cap");
  const uint64_t want = encodedBytes(h.codec, h.dtype, numel);
  h.payload_bytes = w->payload_bytes();
  if (h.payload_bytes != want)
    bad("payload_bytes " + std::to_string(h.payload_bytes) + " disagrees with shape " +
        h.shape.str() + " " + std::string(dtypeName(h.dtype)) + " under " +
        std::string(codecName(h.codec)) + " (" + std::to_string(want) + " bytes)");
  if (h.payload_bytes > limits.max_payload_bytes)
    bad("payload of " + std::to_string(h.payload_bytes) + " bytes exceeds the cap of " +
        std::to_string(limits.max_payload_bytes));

  h.block = w->block();
  const auto* scales = w->scales();
  const size_t n_scales = scales ? scales->size() : 0;
  if (h.codec == Codec::kI8) {
    if (h.block == 0) bad("int8 codec with block size 0");
    const uint64_t blocks = (numel + h.block - 1) / h.block;
    if (n_scales != blocks)
      bad(std::to_string(n_scales) + " int8 scales for " + std::to_string(blocks) + " blocks");
    if (scales) h.scales.assign(scales->begin(), scales->end());  // absent when 0 blocks
    for (float s : h.scales)
      if (!(s >= 0.0f && s <= std::numeric_limits<float>::max()))
        bad("int8 scale " + std::to_string(s) + " is not a finite, non-negative number");
  } else if (n_scales != 0 || h.block != 0) {
    bad("codec " + std::string(codecName(h.codec)) + " carries no block size or scales");
  }
  if (w->has_checksum()) h.checksum = w->checksum();
  return h;
}

void checkPayload(const WireHeader& h, std::span<const uint8_t> payload) {
  if (payload.size() != h.payload_bytes)
    throw FormatError("payload frame of " + std::to_string(payload.size()) +
                      " bytes, the header announced " + std::to_string(h.payload_bytes));
  if (h.checksum && payloadChecksum(payload) != *h.checksum)
    throw FormatError("payload checksum mismatch (corrupted in transit)");
}

}  // namespace tandem::transport
