// Listener: where a coordinator waits for the workers it started to connect back. Each
// accepted connection goes through the handshake (handshake.h) on the cluster key before
// it is handed out as a channel.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/endpoint.h"
#include "targets/runtime/channel.h"
#include "targets/runtime/cluster_key.h"
#include "targets/runtime/handshake.h"

namespace tandem::runtime {

class Listener {
 public:
  // Binds `listen` (HOST:PORT, port 0: any). IoError naming the address if it cannot.
  Listener(const std::string& listen, const ClusterKey& key, const HandshakeOptions& options);
  ~Listener();
  Endpoint endpoint() const;
  // The next authenticated channel, or nullptr when `timeout` passes first. A peer that
  // fails the handshake raises what the handshake raised (HandshakeRefused, Timeout).
  std::unique_ptr<Channel> accept(std::chrono::milliseconds timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::runtime
