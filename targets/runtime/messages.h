// Control messages as typed values, and their FlatBuffers form (schema/control.fbs).
// decodeMessage treats its input as hostile: the FlatBuffers Verifier first, then every
// field against the limits below; anything else raises FormatError naming the message
// and the field. encodeMessage(decodeMessage(b)) decodes to an equal value.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace tandem::runtime {

// The protocol's version: peers whose major differs refuse each other, naming both.
struct ProtocolVersion {
  uint16_t major = 0, minor = 0, patch = 0;
  std::string str() const;
  bool operator==(const ProtocolVersion&) const = default;
};
inline constexpr ProtocolVersion kProtocolVersion{1, 0, 0};

// Field limits, enforced on decode (and on encode, so we never send what a peer refuses).
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
inline constexpr size_t kMaxNameBytes = 128;
inline constexpr size_t kMaxTextBytes = 1024;
inline constexpr size_t kMaxDevices = 64;
inline constexpr size_t kMaxCachedWeights = 4096;
inline constexpr size_t kMaxDatasets = 64;

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

struct Hello {
  ProtocolVersion version;
  std::string build;
  Nonce nonce{};
  bool operator==(const Hello&) const = default;
};

struct Proof {
  Mac mac{};
  bool operator==(const Proof&) const = default;
};

enum class Refusal : uint8_t { kBadMessage = 0, kVersion = 1, kAuth = 2, kBusy = 3 };
const char* refusalName(Refusal r);

struct Refused {
  Refusal reason = Refusal::kBadMessage;
  std::string message;
  bool operator==(const Refused&) const = default;
};

struct NodeDevice {
  std::string id, name;
  int64_t memory_bytes = 0;
  int32_t compute_units = 0;
  bool fp16 = false;
  bool operator==(const NodeDevice&) const = default;
};

struct NodeInfo {
  std::string name, build, arch;
  int32_t cpus = 0;
  int64_t memory_bytes = 0, free_memory_bytes = 0;
  float load = 0;
  std::vector<NodeDevice> devices;
  std::vector<std::string> cached_weights, datasets;
  bool operator==(const NodeInfo&) const = default;
};

struct Ping {
  uint64_t id = 0;
  int64_t sent_ns = 0;
  bool operator==(const Ping&) const = default;
};

struct Pong {
  uint64_t id = 0;
  int64_t ping_sent_ns = 0, received_ns = 0, sent_ns = 0;
  bool operator==(const Pong&) const = default;
};

struct Leave {
  std::string reason;
  bool operator==(const Leave&) const = default;
};

struct ErrorReply {
  std::string message;
  bool operator==(const ErrorReply&) const = default;
};

using Message = std::variant<Hello, Proof, Refused, NodeInfo, Ping, Pong, Leave, ErrorReply>;

// "hello", "proof", ... for messages.
const char* messageName(const Message& m);

std::vector<uint8_t> encodeMessage(const Message& m);
Message decodeMessage(std::span<const uint8_t> bytes);

}  // namespace tandem::runtime
