// SocketLink: core's Link over plain stream sockets (tcp://HOST:PORT, ipc://PATH), read
// and written by the thread that drives the link itself. No I/O thread: a message costs
// no hand-off between threads at either end, which on a node of a quarter of a core is
// most of a small message's cost over ZeroMQ (docs/wire-format.md, "Socket links").
//
// Each side listens on its own endpoint; connect() opens this side's sending connection
// to the peer's and sends a hello (link_seal.h). The receiving connection is accepted
// when this side next waits on the link, and only the first connection whose hello names
// this link (and, sealed, proves the key) is kept; others are counted in stats() with the
// reason and closed. With a key every message is sealed with ChaCha20-Poly1305 under
// keys of this connection's own; without one (ipc in a private folder) it goes in the
// clear. A message is a 16-byte prefix (header and payload lengths), the FlatBuffers
// wire header and the payload (each followed by its seal's tag when sealed): the payload
// is received into a buffer of its own that a CPU tensor then adopts without a copy.
//
// Messages are read when recv() looks for one, in arrival order until its tag (the others
// wait in the bounded buffer); unread, they hold the sender back through TCP's window, as
// a ZeroMQ link's high-water marks do. send() returns once the message is in the kernel's
// socket buffer; while that is full it reads what the peer sends into recv()'s buffer (as
// long as that has room), so two sides that send to each other at once cannot block each
// other. Checks as ZmqLink's: a message
// whose header or payload fails verification is rejected, counted and skipped; one that
// fails to open, an oversized length, or a closed connection ends the link (IoError, after
// the messages received before it). Every blocking call has the link's time limit.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "core/comm/link.h"
#include "transport/link_message.h"
#include "transport/link_seal.h"

namespace tandem::transport {

class SocketLink final : public Link {
 public:
  // Binds options.bind ("tcp://HOST:PORT", PORT * for any; "ipc://PATH"); with `key`
  // the link is sealed. The CurveZMQ, high-water mark and linger options do not apply
  // (curve keys are refused: a socket link is sealed by its key).
  explicit SocketLink(LinkOptions options, std::optional<LinkKey> key = std::nullopt);
  ~SocketLink() override;
  SocketLink(const SocketLink&) = delete;
  SocketLink& operator=(const SocketLink&) = delete;

  void send(const MessageTag& tag, const Tensor& t) override;
  Tensor recv(const MessageTag& tag, Backend& backend) override;
  const std::string& peer() const override;

  // Opens the sending connection to the peer's endpoint and says hello.
  void connect(const std::string& endpoint);
  void setTimeout(std::chrono::milliseconds timeout);
  // The endpoint this side actually bound (resolves "tcp://host:*" to its port).
  const std::string& endpoint() const;
  const LinkStats& stats() const;
  size_t buffered() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::transport
