// The wire header: encoding, and a decoder for hostile input. decodeHeader() runs the
// FlatBuffers Verifier and then cross-checks every field against every other (version,
// enums, rank and sizes, codec against dtype, payload length against shape x codec,
// int8 scales against blocks, caps on sizes) before the payload is touched; checkPayload()
// then checks the payload frame's length and checksum. Defects raise FormatError naming
// the defect; callers add the peer.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/comm/message.h"
#include "core/shape.h"
#include "transport/codec.h"

namespace tandem::transport {

inline constexpr uint16_t kWireVersion = 1;

struct WireHeader {
  uint16_t version = kWireVersion;
  uint64_t job = 0;
  int32_t src_stage = 0, dst_stage = 0;
  int64_t microbatch = 0;
  MessageKind kind = MessageKind::kActivation;
  DType dtype = DType::kF32;
  Shape shape;
  Codec codec = Codec::kRaw;
  uint32_t block = 0;
  std::vector<float> scales;
  uint64_t payload_bytes = 0;
  std::optional<uint64_t> checksum;
};

struct WireLimits {
  uint64_t max_payload_bytes = uint64_t{1} << 31;  // 2 GiB
  uint64_t max_header_bytes = uint64_t{1} << 24;   // 16 MiB (int8 scales of a large tensor)
};

std::vector<uint8_t> encodeHeader(const WireHeader& h);
WireHeader decodeHeader(std::span<const uint8_t> bytes, const WireLimits& limits = {});
void checkPayload(const WireHeader& h, std::span<const uint8_t> payload);

uint64_t payloadChecksum(std::span<const uint8_t> payload);

}  // namespace tandem::transport
