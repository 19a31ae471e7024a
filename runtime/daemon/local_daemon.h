// LocalDaemon: a tandemd started on this machine's loopback for one run (`tandem run`
// without node addresses), with a key made for the run on its standard input. It dies
// with the process that started it and is stopped (SIGTERM, then SIGKILL) when
// destroyed.
#pragma once

#include <sys/types.h>

#include <string>

#include "core/endpoint.h"
#include "runtime/control/cluster_key.h"

namespace tandem::runtime {

class LocalDaemon {
 public:
  // Starts `program` (a tandemd) on 127.0.0.1, port 0, and waits for its address.
  // Error naming the program if it does not start or say where it listens.
  LocalDaemon(const std::string& program, const ClusterKey& key, const std::string& name);
  ~LocalDaemon();
  LocalDaemon(const LocalDaemon&) = delete;
  LocalDaemon& operator=(const LocalDaemon&) = delete;
  const Endpoint& endpoint() const { return endpoint_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  Endpoint endpoint_;
};

}  // namespace tandem::runtime
