// What travels between pipeline stages: the kind of a message and the tag (kind,
// microbatch) by which a receiver asks for it. Shared by core's Link interface (with the
// pipeline issue) and the transport that implements it.
#pragma once

#include <cstdint>
#include <string_view>

namespace tandem {

// kCollective: a collective's chunks between the ranks of a group over links (ZmqGroup),
// and a benchmark's acks; never the control protocol, which has its own channel.
// kToken: a generated token, from the last stage back to the first (stage_decoder.h).
enum class MessageKind : uint8_t {
  kActivation = 0,
  kGradient = 1,
  kLabel = 2,
  kCollective = 3,
  kToken = 4
};

inline std::string_view messageKindName(MessageKind k) {
  switch (k) {
    case MessageKind::kActivation:
      return "activation";
    case MessageKind::kGradient:
      return "gradient";
    case MessageKind::kLabel:
      return "label";
    case MessageKind::kCollective:
      return "collective";
    case MessageKind::kToken:
      return "token";
  }
  return "invalid";
}

}  // namespace tandem
