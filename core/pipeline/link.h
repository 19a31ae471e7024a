// Link: tagged point-to-point transfer of tensors between two stages. Messages are
// matched by (kind, microbatch) whatever order they arrive in. Implementations live in
// transport/ (ZeroMQ over tcp, ipc and inproc); core's pipeline code sees only this.
//
// A link is driven by one thread at a time. Every blocking call has a time limit and
// raises tandem::Timeout naming the peer when it passes.
#pragma once

#include <cstdint>
#include <string>

#include "core/backend.h"
#include "core/pipeline/message.h"

namespace tandem {

struct MessageTag {
  MessageKind kind = MessageKind::kActivation;
  int64_t microbatch = 0;
  auto operator<=>(const MessageTag&) const = default;
};

class Link {
 public:
  virtual ~Link() = default;
  // Sends a copy of `t` (on any backend); returns once the message is queued.
  virtual void send(const MessageTag& tag, const Tensor& t) = 0;
  // The next message with this tag, as a new tensor on `backend`.
  virtual Tensor recv(const MessageTag& tag, Backend& backend) = 0;
  // The peer's address, for messages.
  virtual const std::string& peer() const = 0;
};

}  // namespace tandem
