// ZmqLink: core's Link over ZeroMQ for tcp://, ipc:// and inproc:// endpoints.
//
// Each side binds a PULL socket on its own endpoint and connects a PUSH socket to the
// peer's: ZeroMQ reconnects a restarted peer without the link object changing, and the
// high-water marks bound what is queued in each direction, so a fast sender blocks
// (until its timeout) instead of growing memory. A message is two frames: the wire
// header, then the payload, handed to ZeroMQ without a copy and freed by its callback.
// On the receiving side a large raw payload becomes the tensor's memory (a backend that
// adopts host memory, i.e. the CPU) without a copy; other payloads are decoded or copied
// into a buffer from the backend's pool.
//
// recv(tag) keeps messages that arrive for other tags in a bounded buffer. A message
// that fails any check (frames, header verification, sizes, checksum) is rejected,
// counted in stats() with the reason, and skipped: the link keeps working.
//
// Threading: one thread drives a link; the Context must outlive its links.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "core/comm/link.h"
#include "transport/context.h"
#include "transport/curve.h"
#include "transport/link_message.h"

namespace tandem::transport {

class ZmqLink final : public Link {
 public:
  ZmqLink(Context& context, LinkOptions options);
  ~ZmqLink() override;

  void send(const MessageTag& tag, const Tensor& t) override;
  Tensor recv(const MessageTag& tag, Backend& backend) override;
  const std::string& peer() const override { return options_.connect; }

  // Like send(), but for a host-memory tensor of a raw-coded message, ZeroMQ sends
  // straight from the tensor's memory, holding its storage until done: no copy. The
  // caller must not modify `t` afterwards (the pipeline's activations are never
  // modified). Over inproc the receiver's tensor is then this very memory, so neither
  // side may modify it, and it must be released before t's backend is destroyed, as must
  // the Context. Other tensors take send()'s path.
  void sendInPlace(const MessageTag& tag, const Tensor& t);

  // Connects the sending side to the peer's receive endpoint.
  void connect(const std::string& endpoint);
  // The limit of every later blocking call (positive).
  void setTimeout(std::chrono::milliseconds timeout);
  // The endpoint this side actually bound (resolves "tcp://host:*" to its port).
  const std::string& endpoint() const { return endpoint_; }
  const LinkStats& stats() const { return stats_; }
  size_t buffered() const { return stash_.size(); }

 private:
  struct Pending {
    WireHeader header;
    zmq::message_t payload;
  };

  // Completes `h` (codec fields already set) for tensor `t` and the payload frame `body`,
  // then queues header and payload; Timeout if ZeroMQ refuses them within the timeout.
  void sendFrames(const MessageTag& tag, const Tensor& t, WireHeader& h, zmq::message_t& body);
  // Reads one message (or times out: false) and stashes it, or rejects it.
  bool receiveOne(std::chrono::steady_clock::time_point deadline);
  void reject(const std::string& why);
  Tensor decodeInto(Pending& p, Backend& backend);
  // The payload as a tensor without a copy, if the backend can adopt host memory and the
  // message is raw and aligned; otherwise undefined, leaving `p` as it was.
  Tensor adoptPayload(Pending& p, Backend& backend);
  // Sets options_.local_congestion on the sending socket's connections made since the
  // last call (the monitor's "connected" events carry their descriptors).
  void tuneNewConnections();

  LinkOptions options_;
  // Payload buffers ZeroMQ has finished with (returned from its I/O thread), shared with
  // the free callbacks of messages still in flight, which may outlive the link.
  std::shared_ptr<BufferPool> buffers_ = std::make_shared<BufferPool>();
  zmq::socket_t push_, pull_;
  zmq::socket_t connections_;  // push_'s monitor, when local_congestion applies
  std::string endpoint_;
  std::multimap<MessageTag, Pending> stash_;  // equal tags stay in arrival order
  uint64_t stash_bytes_ = 0;
  std::map<MessageKind, ErrorFeedback> feedback_;
  LinkStats stats_;
};

}  // namespace tandem::transport
