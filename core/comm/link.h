// Link: tagged point-to-point transfer of tensors between two stages. Messages are
// matched by (kind, microbatch) whatever order they arrive in. Implementations live in
// transport/ (ZeroMQ over tcp, ipc and inproc); core's pipeline code sees only this.
//
// A link is driven by one thread at a time. Every blocking call has a time limit and
// raises tandem::Timeout naming the peer when it passes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/comm/message.h"

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

// The links to the replicas of a neighbouring stage: microbatch g (global) goes to and
// comes from replica g mod R, the one that runs it (executor.h). With one link it is
// that link.
class ReplicaLinks final : public Link {
 public:
  explicit ReplicaLinks(std::vector<Link*> links);
  void send(const MessageTag& tag, const Tensor& t) override { route(tag).send(tag, t); }
  Tensor recv(const MessageTag& tag, Backend& backend) override {
    return route(tag).recv(tag, backend);
  }
  const std::string& peer() const override { return peers_; }

 private:
  Link& route(const MessageTag& tag) const {
    return *links_[static_cast<size_t>(tag.microbatch % static_cast<int64_t>(links_.size()))];
  }
  std::vector<Link*> links_;
  std::string peers_;  // "a, b": every replica's address
};

}  // namespace tandem
