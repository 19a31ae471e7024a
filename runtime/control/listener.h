// Listener: where a coordinator waits for the workers it started to connect back. Each
// accepted connection is admitted as a daemon admits its own (admission.h: a threadless
// waiting room until it speaks, bounded handshake slots, idle ones evicted for new ones)
// and goes through the handshake (handshake.h) on the cluster key on a thread of its
// own, so that connections without the key, idle or slow, hold up no worker's.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/endpoint.h"
#include "runtime/control/admission.h"
#include "runtime/control/channel.h"
#include "runtime/control/cluster_key.h"
#include "runtime/control/handshake.h"

namespace tandem::runtime {

class Listener {
 public:
  // Binds `listen` (HOST:PORT, port 0: any) and accepts on a thread of its own from now
  // on. IoError naming the address if it cannot bind. The admission's hello timeout is
  // the handshake's.
  Listener(const std::string& listen, const ClusterKey& key, const HandshakeOptions& options,
           AdmissionOptions admission = {});
  ~Listener();
  Endpoint endpoint() const;
  // The next authenticated channel, in the order their handshakes ended, or nullptr when
  // `timeout` passes first. A peer that fails the handshake is logged (at a bounded rate)
  // and counted, not raised.
  std::unique_ptr<Channel> accept(std::chrono::milliseconds timeout);
  AdmissionStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::runtime
