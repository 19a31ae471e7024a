// What the two Link implementations share (zmq_link.h, socket_link.h): their options and
// counters, a tensor made into a wire header and payload under the link's codec, a
// verified payload made back into a tensor, and a pool of payload buffers.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/comm/link.h"
#include "transport/codec.h"
#include "transport/wire.h"

namespace tandem::transport {

struct LinkOptions {
  std::string bind;             // where this side receives, e.g. "tcp://127.0.0.1:*" (any port)
  std::string connect;          // the peer's receive endpoint; may be given later with connect()
  Codec codec = Codec::kRaw;    // for f32 tensors sent; other dtypes always go raw
  bool error_feedback = false;  // for gradients under a lossy codec
  uint32_t int8_block = kDefaultInt8Block;
  bool checksum = false;
  std::chrono::milliseconds timeout{30000};  // every blocking send and recv
  std::chrono::milliseconds linger{2000};    // ZmqLink: how long close waits to deliver sends
  int send_hwm = 16, recv_hwm = 16;          // ZmqLink: messages ZeroMQ queues per direction
  size_t max_buffered_messages = 64;         // held by recv for other tags
  uint64_t max_buffered_bytes = uint64_t{1} << 30;
  WireLimits limits;
  // ZmqLink's CurveZMQ: both set = the link is encrypted and only the peer's key may
  // connect. Unsupported is raised if this libzmq has no CURVE.
  std::string curve_secret_key_file;       // this side's secret key (Z85)
  std::string curve_peer_public_key_file;  // the peer's public key (Z85)
  // The same two keys given as Z85 text instead of files (both set, or neither).
  std::string curve_secret_key, curve_peer_public_key;
  uint64_t job = 0;
  int32_t stage = 0, peer_stage = 0;
  // TCP congestion control of this side's sending connections whose peer is on this
  // machine (chooseLocalCongestion, local_tcp.h): this one, else reno, else the system's;
  // "" keeps the system's. Connections to other machines keep the system's.
  std::string local_congestion = "cubic";
};

struct LinkStats {
  uint64_t messages_sent = 0, messages_received = 0;
  uint64_t bytes_sent_raw = 0, bytes_sent_wire = 0;  // tensor bytes / payload bytes
  uint64_t bytes_received_raw = 0, bytes_received_wire = 0;
  uint64_t received_in_place = 0;  // messages whose buffer became the tensor, uncopied
  uint64_t rejects = 0;
  std::string last_reject;  // why the latest rejected message was refused
  double send_blocked_s = 0, recv_blocked_s = 0;
};

// Raw payloads at least this large become the received tensor's memory without a copy.
inline constexpr size_t kAdoptMinBytes = 16384;

// `t`'s payload under the link's codec into `out` (resized to it): f32 values encoded
// (gradients through `feedback` when the options ask for error feedback), with the
// header's codec, block and scales set; other tensors and the raw codec as their bytes.
void encodePayload(const LinkOptions& o, std::map<MessageKind, ErrorFeedback>& feedback,
                   const MessageTag& tag, const Tensor& t, WireHeader& h,
                   std::vector<uint8_t>& out);

// The header's remaining fields for `t` sent with `tag` and the payload `payload` (its
// length, and its checksum when the options ask for one).
void addressHeader(const LinkOptions& o, const MessageTag& tag, const Tensor& t,
                   std::span<const uint8_t> payload, WireHeader& h);

// A verified message's payload (decodeHeader, checkPayload) as a new tensor on
// `backend`: copied, or decoded.
Tensor decodePayload(const WireHeader& h, std::span<const uint8_t> payload, Backend& backend);

// "(kind, microbatch N)", for messages.
std::string describeTag(const MessageTag& tag);

// Payload buffers a link has finished with, kept for its next messages so large ones do
// not fault in fresh pages every time. Buffers may come back from other threads (ZeroMQ's,
// or whichever drops a tensor that adopted one).
class BufferPool {
 public:
  using Buffer = std::unique_ptr<std::vector<uint8_t>>;
  explicit BufferPool(size_t keep = 8) : keep_(keep) {}
  Buffer take();
  void give(Buffer b);

 private:
  const size_t keep_;
  std::mutex mutex_;
  std::vector<Buffer> free_;  // guarded by mutex_
};

}  // namespace tandem::transport
