// Daemon: the node daemon's server (`tandemd`), as a library so that tests run it in
// one process. It listens on one TCP address, authenticates every connection
// (handshake.h) on its own thread, then answers the peer: its NodeInfo first, then pongs
// to pings, and `launch`: a stage worker process that connects back to the peer's run
// (coordinator.h), reported as `launched` and, when it ends, `worker ended`. The workers
// of a connection are stopped when it ends — the peer left, or vanished (closed or
// silent) — and the daemon serves the next run; one run's workers at a time. A peer's bad message
// gets an error reply and the connection lives on; a refused handshake is logged with the peer's
// address and why. Nothing a peer sends ends the daemon.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/control/admission.h"
#include "runtime/control/cluster_key.h"
#include "runtime/control/handshake.h"

namespace tandem::runtime {

// The daemon's side of its control connections: they carry tasks, pings and leaves (the
// largest a profile task's model spec), never weights, so a frame is at most 4 MiB and a
// connection queues at most 8 MiB of them unread: with the frame being read, about 16 MiB
// a connection, 256 MiB for max_connections (16) whatever the clients send.
HandshakeOptions daemonHandshakeOptions();

struct DaemonOptions {
  std::string listen = "127.0.0.1:7600";  // HOST:PORT; port 0 takes a free one
  ClusterKey key;
  std::string name;  // the node's name (default: the host name)
  HandshakeOptions handshake = daemonHandshakeOptions();
  int max_connections = 16;  // authenticated ones; beyond: refused as busy after the hello
  // Before the handshake (admission.h): the waiting room for connections that have said
  // nothing and the handshake slots; its hello_timeout is the handshake's timeout.
  AdmissionOptions admission;
  // How to start a stage worker on this node: `program args... --control HOST:PORT
  // --slot N`, the run's key on its standard input (tandemd: itself, `worker`). Empty:
  // this daemon starts no workers.
  std::string worker_program;
  std::vector<std::string> worker_args;
  std::string cache_dir;  // the node's weight cache, reported in its node info (empty: none)
};

// Counters, for the log and for tests.
struct DaemonStats {
  uint64_t accepted = 0;  // connections that passed the handshake
  uint64_t refused = 0;   // handshakes refused or failed, connections closed unanswered
  uint64_t evicted = 0;   // idle connections shut to make room for new ones
  uint64_t bad_messages = 0;
};

class Daemon {
 public:
  // Binds now: IoError naming the address if it cannot.
  explicit Daemon(DaemonOptions options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // The bound address (with the port taken when the options said 0).
  Endpoint endpoint() const;
  // Serves until stop(); every connection's thread is joined before it returns.
  void run();
  // Ends run(): from any thread, once or more.
  void stop();
  DaemonStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True for loopback addresses (127.0.0.0/8, ::1, "localhost").
bool isLoopbackHost(const std::string& host);

}  // namespace tandem::runtime
