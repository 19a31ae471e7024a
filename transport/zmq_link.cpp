#include "transport/zmq_link.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "transport/local_tcp.h"

namespace tandem::transport {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

int millisLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// A payload in flight: its bytes, and the pool to return them to.
struct InFlight {
  std::unique_ptr<std::vector<uint8_t>> bytes;
  std::weak_ptr<void> pool;
};

}  // namespace

ZmqLink::ZmqLink(Context& context, LinkOptions options)
    : options_(std::move(options)),
      push_(context.zmq(), zmq::socket_type::push),
      pull_(context.zmq(), zmq::socket_type::pull) {
  TANDEM_CHECK_MSG(!options_.bind.empty(), InvalidArgument, "link: no endpoint to bind");
  TANDEM_CHECK_MSG(options_.timeout.count() > 0, InvalidArgument, "link: timeout must be positive");
  TANDEM_CHECK_MSG(options_.send_hwm > 0 && options_.recv_hwm > 0, InvalidArgument,
                   "link: high-water marks must be positive");
  for (zmq::socket_t* s : {&push_, &pull_})
    s->set(zmq::sockopt::linger, static_cast<int>(options_.linger.count()));
  const bool from_files =
      !options_.curve_secret_key_file.empty() || !options_.curve_peer_public_key_file.empty();
  const bool given = !options_.curve_secret_key.empty() || !options_.curve_peer_public_key.empty();
  if (from_files || given) {
    TANDEM_CHECK_MSG(from_files != given, InvalidArgument,
                     "link: CurveZMQ keys given both as files and as text");
    TANDEM_CHECK_MSG(
        from_files ? !options_.curve_secret_key_file.empty() &&
                         !options_.curve_peer_public_key_file.empty()
                   : !options_.curve_secret_key.empty() && !options_.curve_peer_public_key.empty(),
        InvalidArgument, "link: CurveZMQ needs both a secret key and the peer's public key");
    if (!curveSupported())
      throw Unsupported("link: CurveZMQ requested but the installed libzmq has no CURVE support");
    const std::string secret =
        from_files ? readCurveKey(options_.curve_secret_key_file) : options_.curve_secret_key;
    const std::string peer_public = from_files ? readCurveKey(options_.curve_peer_public_key_file)
                                               : options_.curve_peer_public_key;
    char own_public[41];
    TANDEM_CHECK_MSG(secret.size() == 40 && zmq_curve_public(own_public, secret.c_str()) == 0,
                     InvalidArgument,
                     "link: " << (from_files ? "'" + options_.curve_secret_key_file + "'"
                                             : std::string("the secret key given"))
                              << " is not a valid secret key");
    // The receiving side is the CURVE server; the context's ZAP handler admits the peer only.
    context.allowCurveKey(peer_public);
    pull_.set(zmq::sockopt::zap_domain, "tandem");
    pull_.set(zmq::sockopt::curve_server, 1);
    pull_.set(zmq::sockopt::curve_secretkey, secret);
    push_.set(zmq::sockopt::curve_serverkey, peer_public);
    push_.set(zmq::sockopt::curve_publickey, std::string(own_public));
    push_.set(zmq::sockopt::curve_secretkey, secret);
  }
  push_.set(zmq::sockopt::sndhwm, options_.send_hwm);
  pull_.set(zmq::sockopt::rcvhwm, options_.recv_hwm);
  // ZeroMQ itself refuses messages beyond the caps before they are buffered.
  pull_.set(zmq::sockopt::maxmsgsize,
            static_cast<int64_t>(
                std::max(options_.limits.max_payload_bytes, options_.limits.max_header_bytes)));
  try {
    pull_.bind(options_.bind);
  } catch (const zmq::error_t& e) {
    throw IoError("link: cannot bind '" + options_.bind + "': " + e.what());
  }
  endpoint_ = pull_.get(zmq::sockopt::last_endpoint);
  if (!options_.local_congestion.empty() && endpoint_.starts_with("tcp://")) {
    // Before any connect, so that no connection's event is missed. A monitor that cannot
    // be set up leaves the connections on the system's congestion control.
    static std::atomic<uint64_t> monitors{0};
    const std::string address = "inproc://tandem-link-connections-" + std::to_string(monitors++);
    if (zmq_socket_monitor(push_.handle(), address.c_str(), ZMQ_EVENT_CONNECTED) == 0) {
      connections_ = zmq::socket_t(context.zmq(), zmq::socket_type::pair);
      connections_.set(zmq::sockopt::linger, 0);
      connections_.connect(address);
    }
  }
  if (!options_.connect.empty()) {
    const std::string peer = options_.connect;
    options_.connect.clear();
    connect(peer);
  }
}

ZmqLink::~ZmqLink() {
  if (connections_) zmq_socket_monitor(push_.handle(), nullptr, 0);
}

void ZmqLink::tuneNewConnections() {
  if (!connections_) return;
  // Each event is two frames: event number (16 bits) and value (32: the descriptor),
  // then the endpoint; a message's frames arrive together.
  zmq::message_t event, endpoint;
  while (connections_.recv(event, zmq::recv_flags::dontwait)) {
    if (event.more()) (void)connections_.recv(endpoint, zmq::recv_flags::dontwait);
    if (event.size() < 6) continue;
    uint16_t number = 0;
    int32_t fd = -1;
    std::memcpy(&number, event.data(), sizeof(number));
    std::memcpy(&fd, static_cast<const uint8_t*>(event.data()) + sizeof(number), sizeof(fd));
    if (number == ZMQ_EVENT_CONNECTED && fd >= 0)
      chooseLocalCongestion(fd, options_.local_congestion);
  }
}

void ZmqLink::setTimeout(std::chrono::milliseconds timeout) {
  TANDEM_CHECK_MSG(timeout.count() > 0, InvalidArgument, "link: timeout must be positive");
  options_.timeout = timeout;
}

void ZmqLink::connect(const std::string& endpoint) {
  TANDEM_CHECK_MSG(options_.connect.empty(), InvalidArgument,
                   "link: already connected to '" << options_.connect << "'");
  try {
    push_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    throw IoError("link: cannot connect to '" + endpoint + "': " + e.what());
  }
  options_.connect = endpoint;
}

void ZmqLink::send(const MessageTag& tag, const Tensor& t) {
  TANDEM_CHECK_MSG(!options_.connect.empty(), InvalidArgument,
                   "link bound at '" << endpoint_ << "' has no peer to send to");
  WireHeader h;
  auto payload = buffers_->take();
  encodePayload(options_, feedback_, tag, t, h, *payload);
  // Zero copy of the payload buffer: ZeroMQ sends from it and calls back when done, from
  // its I/O thread, possibly after this link is gone (then the buffer is simply freed).
  auto* flight = new InFlight{std::move(payload), buffers_};
  auto done = [](void*, void* hint) {
    std::unique_ptr<InFlight> f(static_cast<InFlight*>(hint));
    if (auto pool = std::static_pointer_cast<BufferPool>(f->pool.lock()))
      pool->give(std::move(f->bytes));
  };
  zmq::message_t body(flight->bytes->data(), flight->bytes->size(), done, flight);
  sendFrames(tag, t, h, body);
}

void ZmqLink::sendInPlace(const MessageTag& tag, const Tensor& t) {
  const void* host = t.defined() ? t.backend().hostData(t) : nullptr;
  const bool raw = t.dtype() != DType::kF32 || options_.codec == Codec::kRaw;
  if (!host || !raw || t.bytes() == 0 || options_.connect.empty()) return send(tag, t);
  // ZeroMQ reads the tensor's memory directly; the copy of the handle keeps its storage
  // alive until ZeroMQ's callback drops it.
  auto* keep = new Tensor(t);
  zmq::message_t body(
      const_cast<void*>(host), t.bytes(),
      [](void*, void* hint) { delete static_cast<Tensor*>(hint); }, keep);
  WireHeader h;
  sendFrames(tag, t, h, body);
}

void ZmqLink::sendFrames(const MessageTag& tag, const Tensor& t, WireHeader& h,
                         zmq::message_t& body) {
  tuneNewConnections();
  addressHeader(options_, tag, t, {static_cast<const uint8_t*>(body.data()), body.size()}, h);
  const std::vector<uint8_t> header = encodeHeader(h);
  zmq::message_t head(header.data(), header.size());
  const size_t wire_bytes = body.size();

  const auto t0 = Clock::now();
  push_.set(zmq::sockopt::sndtimeo, static_cast<int>(options_.timeout.count()));
  const bool sent = push_.send(head, zmq::send_flags::sndmore).has_value() &&
                    push_.send(body, zmq::send_flags::none).has_value();
  stats_.send_blocked_s += seconds(Clock::now() - t0);
  if (!sent)
    throw Timeout("link: sending " + describeTag(tag) + " to '" + options_.connect +
                  "' blocked for " + std::to_string(options_.timeout.count()) +
                  " ms (is the peer receiving?)");
  ++stats_.messages_sent;
  stats_.bytes_sent_raw += t.bytes();
  stats_.bytes_sent_wire += wire_bytes;
}

void ZmqLink::reject(const std::string& why) {
  ++stats_.rejects;
  stats_.last_reject = "message to '" + endpoint_ + "' (peer '" + options_.connect + "'): " + why;
}

bool ZmqLink::receiveOne(Clock::time_point deadline) {
  zmq::message_t head;
  pull_.set(zmq::sockopt::rcvtimeo, millisLeft(deadline));
  const auto t0 = Clock::now();
  const bool got = pull_.recv(head, zmq::recv_flags::none).has_value();
  stats_.recv_blocked_s += seconds(Clock::now() - t0);
  if (!got) return false;
  if (!head.more()) {
    reject("a message of 1 frame (expected header and payload)");
    return true;
  }
  zmq::message_t body;
  pull_.set(zmq::sockopt::rcvtimeo, 1000);  // the rest of a multipart message is already here
  if (!pull_.recv(body, zmq::recv_flags::none).has_value()) {
    reject("the payload frame did not follow its header");
    return true;
  }
  if (body.more()) {  // drain the rest of the message, then refuse it
    while (body.more() && pull_.recv(body, zmq::recv_flags::none).has_value()) {
    }
    reject("a message of more than 2 frames");
    return true;
  }
  Pending p;
  try {
    p.header =
        decodeHeader({static_cast<const uint8_t*>(head.data()), head.size()}, options_.limits);
    checkPayload(p.header, {static_cast<const uint8_t*>(body.data()), body.size()});
  } catch (const FormatError& e) {
    reject(e.what());
    return true;
  }
  const MessageTag tag{p.header.kind, p.header.microbatch};
  if (stash_.size() >= options_.max_buffered_messages ||
      stash_bytes_ + body.size() > options_.max_buffered_bytes) {
    throw Error("link '" + endpoint_ + "': receive buffer full (" + std::to_string(stash_.size()) +
                " messages, " + std::to_string(stash_bytes_) + " bytes) with " + describeTag(tag) +
                " arriving from '" + options_.connect +
                "'; the peer sends messages that are not asked for");
  }
  stash_bytes_ += body.size();
  p.payload = std::move(body);
  stash_.emplace(tag, std::move(p));
  return true;
}

Tensor ZmqLink::adoptPayload(Pending& p, Backend& backend) {
  const WireHeader& h = p.header;
  // Small payloads are copied: cheap, and they may sit inside the zmq_msg_t itself or at
  // any offset of ZeroMQ's shared 8 KiB receive buffer, which they would pin.
  if (h.codec != Codec::kRaw || p.payload.size() < kAdoptMinBytes ||
      reinterpret_cast<uintptr_t>(p.payload.data()) % dtypeSize(h.dtype) != 0)
    return {};
  // A message of this size lives outside the zmq_msg_t: moving it keeps its address.
  auto* message = new zmq::message_t(std::move(p.payload));
  auto storage = backend.adoptHost(message->data(), message->size(), [message] { delete message; });
  if (!storage) {
    p.payload = std::move(*message);
    delete message;
    return {};
  }
  ++stats_.received_in_place;
  return Tensor(std::move(storage), h.shape, h.dtype);
}

Tensor ZmqLink::decodeInto(Pending& p, Backend& backend) {
  const WireHeader& h = p.header;
  const size_t wire_bytes = p.payload.size();
  Tensor t = adoptPayload(p, backend);
  if (!t.defined()) {
    t = decodePayload(h, {static_cast<const uint8_t*>(p.payload.data()), p.payload.size()},
                      backend);
  }
  ++stats_.messages_received;
  stats_.bytes_received_raw += t.bytes();
  stats_.bytes_received_wire += wire_bytes;
  return t;
}

Tensor ZmqLink::recv(const MessageTag& tag, Backend& backend) {
  const auto deadline = Clock::now() + options_.timeout;
  for (;;) {
    auto it = stash_.find(tag);
    if (it != stash_.end()) {
      Pending p = std::move(it->second);
      stash_.erase(it);
      stash_bytes_ -= p.payload.size();
      return decodeInto(p, backend);
    }
    if (!receiveOne(deadline))
      throw Timeout("link '" + endpoint_ + "': no " + describeTag(tag) + " from '" +
                    options_.connect + "' within " + std::to_string(options_.timeout.count()) +
                    " ms");
  }
}

}  // namespace tandem::transport
