// Opening a control connection (docs/runtime.md, "Handshake"):
//
//   client -> server   hello {version, build, nonce_c}          in the clear
//   server -> client   hello {version, build, nonce_s}          or refused {version, ...}
//   client -> server   proof {HMAC(key, client label, both hellos)}
//   server -> client   proof {HMAC(key, server label, both hellos)}  or refused {auth}
//   then every frame sealed with the session keys (channel.h)
//
// Nothing but these four messages is read before both proofs check out, and at most
// 1 KiB per frame: a peer without the key learns the protocol version and nothing else.
// Fresh nonces on both sides bind each proof to its connection, so a recorded handshake
// replayed on a new connection fails. Each step has a deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/endpoint.h"
#include "core/error.h"
#include "runtime/control/channel.h"
#include "runtime/control/cluster_key.h"

namespace tandem::runtime {

struct HandshakeOptions {
  std::string build;                           // this side's build, said in its hello
  std::chrono::milliseconds timeout{5000};     // connecting, and each handshake message
  ProtocolVersion version = kProtocolVersion;  // tests speak other versions with it
  ChannelOptions channel;
  // Accepting: called on the accepting thread once the client's hello has been read (a
  // daemon no longer treats the connection as idle).
  std::function<void()> on_hello;
};

// A peer turned us away, or we turned it away: the reason and the peer's words.
class HandshakeRefused : public IoError {
 public:
  HandshakeRefused(Refusal reason, const std::string& what) : IoError(what), reason_(reason) {}
  Refusal reason() const { return reason_; }

 private:
  Refusal reason_;
};

// Connects to `to` and proves the key both ways. IoError naming the address if it cannot
// connect; HandshakeRefused with the daemon's reason (a version mismatch names both
// versions); Timeout naming the step that took too long.
std::unique_ptr<Channel> connectChannel(const Endpoint& to, const ClusterKey& key,
                                        const HandshakeOptions& options);

// connectChannel, tried again when the connection is closed, fails or times out before
// the handshake ends — what a listener does to new connections while a flood without the
// key holds its handshake slots (admission.h) — up to `attempts` times, waiting 100 ms
// longer before each (at most 1 s). A refusal with a reason (HandshakeRefused) is final.
std::unique_ptr<Channel> connectChannelRetrying(const Endpoint& to, const ClusterKey& key,
                                                const HandshakeOptions& options, int attempts = 8);

}  // namespace tandem::runtime
