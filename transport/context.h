// Context: one per process. ZeroMQ's I/O threads, the inproc namespace, the ZAP handler
// that authenticates CurveZMQ peers (started when the first encrypted link registers a
// key). (keepFreedMemory: the process's treatment of received-message memory, which a
// program chooses.)
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <zmq.hpp>

namespace tandem::transport {

struct ContextOptions {
  int io_threads = 1;
};

// ZeroMQ mallocs every received message. For large ones glibc maps fresh pages each time
// and returns freed heap to the kernel at once, so each message would fault in newly
// zeroed memory, slower than a socket that reuses its buffer (docs/wire-format.md has the
// link figures). This sets glibc's mmap threshold to its maximum (32 MiB on
// 64-bit, 512 KiB on 32-bit: larger messages are still mapped fresh) and its trim
// threshold to `bytes`: up to that many freed bytes stay resident for reuse. It changes
// malloc for the whole process, so the library never calls it: a program whose links
// carry large messages (a stage worker, tandemd, the benchmarks) does, once, at its
// start. Nothing where the C library is not glibc.
inline constexpr size_t kKeepFreedBytes = size_t{256} << 20;
void keepFreedMemory(size_t bytes = kKeepFreedBytes);

class Context {
 public:
  explicit Context(const ContextOptions& options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  zmq::context_t& zmq() { return ctx_; }

  // Lets a CurveZMQ client with this public key (Z85) connect to this process's links.
  void allowCurveKey(const std::string& public_key_z85);

 private:
  zmq::context_t ctx_;
  std::mutex mutex_;
  std::set<std::string> allowed_;  // 32-byte binary keys; guarded by mutex_
  std::thread zap_;
  std::atomic<bool> stop_{false};
};

}  // namespace tandem::transport
