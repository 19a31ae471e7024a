#include "transport/socket_link.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <map>

#include "core/endpoint.h"
#include "core/error.h"
#include "transport/local_tcp.h"
#include "transport/tcp/socket.h"

namespace tandem::transport {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kPrefixBytes = 16;   // header length (4), flags (4, zero), payload length (8)
constexpr size_t kMaxCandidates = 8;  // accepted connections not yet heard

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// An endpoint: "tcp://HOST:PORT" (HOST in brackets for an IPv6 address; PORT "*" for any
// when binding) or "ipc://PATH".
struct Where {
  bool tcp = false;
  std::string host, path;
  tcp::Address address;
};

Where parseWhere(const std::string& e, bool passive) {
  Where w;
  if (e.starts_with("tcp://")) {
    std::string rest = e.substr(6);
    if (passive && rest.ends_with(":*")) rest.replace(rest.size() - 1, 1, "0");
    Endpoint where;
    try {
      where = parseEndpoint(rest, passive);
    } catch (const InvalidArgument& bad) {
      throw InvalidArgument("link: '" + e + "' is not tcp://HOST:PORT: " + bad.what());
    }
    w.tcp = true;
    w.host = where.host;
    w.address = tcp::Address::resolve(w.host, std::to_string(where.port), passive);
  } else if (e.starts_with("ipc://") && e.size() > 6) {
    w.path = e.substr(6);
    w.address = tcp::Address::unixPath(w.path);
  } else {
    throw InvalidArgument("link: '" + e + "' is neither tcp://HOST:PORT nor ipc://PATH");
  }
  return w;
}

// A connection accepted but not yet heard: its hello so far.
struct Candidate {
  tcp::Socket socket;
  HelloBytes hello{};
  size_t got = 0;
};

struct Pending {
  WireHeader header;
  BufferPool::Buffer payload;
};

}  // namespace

struct SocketLink::Impl {
  LinkOptions o;
  std::optional<LinkKey> key;
  std::string endpoint;
  std::optional<tcp::Listener> listener;  // until the receiving connection is admitted
  std::vector<Candidate> candidates;
  tcp::Socket out, in;
  std::optional<Sealer> out_seal, in_seal;
  std::shared_ptr<BufferPool> pool = std::make_shared<BufferPool>();

  // The message being read: its prefix, header record and payload record in turn.
  enum class Part { kPrefix, kHeader, kPayload } part = Part::kPrefix;
  std::array<uint8_t, kPrefixBytes> prefix{};
  size_t got = 0;
  size_t header_len = 0, payload_len = 0;
  std::vector<uint8_t> header;
  BufferPool::Buffer payload;
  WireHeader decoded;
  std::string refused;  // why the header was refused (its payload is then read and dropped)
  std::string broken;   // why the receiving connection ended, once it has

  std::multimap<MessageTag, Pending> stash;  // equal tags stay in arrival order
  uint64_t stash_bytes = 0;
  std::map<MessageKind, ErrorFeedback> feedback;
  LinkStats stats;

  size_t tagBytes() const { return key ? kSealTagBytes : 0; }
  std::string name() const { return "link '" + endpoint + "'"; }

  void reject(const std::string& why) {
    ++stats.rejects;
    stats.last_reject = "message to '" + endpoint + "' (peer '" + o.connect + "'): " + why;
  }

  void end(const std::string& why) {
    broken = name() + ": " + why;
    in.reset();
  }

  // Room for one more message in the receive buffer.
  bool room() const {
    return stash.size() < o.max_buffered_messages && stash_bytes < o.max_buffered_bytes;
  }

  struct Ready {
    bool out = false, in = false;
  };

  // Waits until the sending connection takes bytes (`want_out`), or the receiving one has
  // bytes (`want_in`), or a connection comes to be heard (heard here, admitted if it is
  // the peer). Messages are read only when asked for (readOne): left in the socket, they
  // hold the peer back through TCP's window, as a ZeroMQ link's high-water marks do.
  Ready pump(bool want_out, bool want_in, Clock::time_point deadline) {
    std::array<pollfd, kMaxCandidates + 3> fds{};
    size_t n = 0;
    if (want_out) fds[n++] = {out.get(), POLLOUT, 0};
    const size_t first_in = n;
    if (in.valid()) {
      if (want_in) fds[n++] = {in.get(), POLLIN, 0};
    } else if (broken.empty()) {
      if (listener) fds[n++] = {listener->get(), POLLIN, 0};
      for (const Candidate& c : candidates) fds[n++] = {c.socket.get(), POLLIN, 0};
    }
    if (n == 0) return {};
    const int k = ::poll(fds.data(), n, tcp::msLeft(deadline));
    if (k < 0 && errno != EINTR) throw IoError(name() + ": poll: " + std::strerror(errno));
    if (k <= 0) return {};
    Ready r;
    r.out = want_out && fds[0].revents != 0;
    if (in.valid()) {
      r.in = n > first_in && fds[first_in].revents != 0;
    } else if (n > first_in) {
      acceptAll();
      hearCandidates();
      r.in = in.valid();  // just admitted: its first bytes may be there
    }
    return r;
  }

  void acceptAll() {
    while (listener) {
      std::optional<tcp::Socket> s = listener->accept(Clock::now());
      if (!s) return;
      if (candidates.size() >= kMaxCandidates) {
        reject("a connection closed unheard: " + std::to_string(kMaxCandidates) +
               " newer ones came before it said hello");
        candidates.erase(candidates.begin());
      }
      candidates.push_back({std::move(*s)});
    }
  }

  void hearCandidates() {
    const LinkHello expected{key.has_value(), o.peer_stage, o.stage, o.job, endpoint};
    for (size_t i = 0; i < candidates.size();) {
      Candidate& c = candidates[i];
      std::string why;
      for (;;) {
        const ssize_t k = ::recv(c.socket.get(), c.hello.data() + c.got, c.hello.size() - c.got, 0);
        if (k > 0) {
          c.got += static_cast<size_t>(k);
          if (c.got < c.hello.size()) continue;
          why = checkHello(c.hello, expected, key);
          if (why.empty()) return admit(std::move(c));
        } else if (k == 0) {
          why = "a connection closed before its hello";
        } else if (!tcp::wouldBlock(errno)) {
          why = std::string("a connection failed before its hello: ") + std::strerror(errno);
        }
        break;
      }
      if (why.empty()) {
        ++i;
        continue;
      }
      reject(why);
      candidates.erase(candidates.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  // The sender: its connection receives from here on; no other connection is taken.
  void admit(Candidate c) {
    in = std::move(c.socket);
    if (key) in_seal.emplace(*key, c.hello);
    listener.reset();
    candidates.clear();
  }

  // Reads from the receiving connection until a message is complete (true: stashed or
  // rejected), it would block, or the connection ends (false).
  bool readOne() {
    while (in.valid()) {
      uint8_t* at = nullptr;
      size_t size = 0;
      switch (part) {
        case Part::kPrefix:
          at = prefix.data(), size = prefix.size();
          break;
        case Part::kHeader:
          at = header.data(), size = header.size();
          break;
        case Part::kPayload:
          at = payload->data(), size = payload->size();
          break;
      }
      if (got < size) {
        const ssize_t k = ::recv(in.get(), at + got, size - got, 0);
        if (k == 0) {
          const bool between = part == Part::kPrefix && got == 0;
          end("'" + o.connect + "' closed the connection" +
              (between ? "" : " in the middle of a message"));
          return false;
        }
        if (k < 0) {
          if (tcp::wouldBlock(errno)) return false;
          end("receiving from '" + o.connect + "' failed: " + std::strerror(errno));
          return false;
        }
        got += static_cast<size_t>(k);
        if (got < size) continue;
      }
      got = 0;
      switch (part) {
        case Part::kPrefix:
          completePrefix();
          break;
        case Part::kHeader:
          completeHeader();
          break;
        case Part::kPayload:
          completePayload();
          return in.valid();
      }
    }
    return false;
  }

  void completePrefix() {
    header_len = getLittle(prefix.data(), 4);
    payload_len = getLittle(prefix.data() + 8, 8);
    const uint64_t flags = getLittle(prefix.data() + 4, 4);
    if (flags != 0 || header_len == 0 || header_len > o.limits.max_header_bytes ||
        payload_len > o.limits.max_payload_bytes)
      return end("a message announcing a header of " + std::to_string(header_len) +
                 " bytes and a payload of " + std::to_string(payload_len) + " (flags " +
                 std::to_string(flags) + "; at most " + std::to_string(o.limits.max_header_bytes) +
                 " and " + std::to_string(o.limits.max_payload_bytes) +
                 "): the stream is out of step");
    header.resize(header_len + tagBytes());
    part = Part::kHeader;
  }

  void completeHeader() {
    if (key && !in_seal->open({header.data(), header_len}, header.data() + header_len, prefix))
      return end("a message from '" + o.connect +
                 "' failed to open (altered, replayed or not sealed for this link)");
    refused.clear();
    try {
      decoded = decodeHeader({header.data(), header_len}, o.limits);
    } catch (const FormatError& e) {
      refused = e.what();
    }
    payload = pool->take();
    payload->resize(payload_len + tagBytes());
    part = Part::kPayload;
  }

  void completePayload() {
    part = Part::kPrefix;
    if (key && !in_seal->open({payload->data(), payload_len}, payload->data() + payload_len, {}))
      return end("a message's payload from '" + o.connect +
                 "' failed to open (altered, replayed or not sealed for this link)");
    payload->resize(payload_len);
    if (refused.empty()) {
      try {
        checkPayload(decoded, *payload);
      } catch (const FormatError& e) {
        refused = e.what();
      }
    }
    if (!refused.empty()) {
      reject(refused);
      pool->give(std::move(payload));
      return;
    }
    const MessageTag tag{decoded.kind, decoded.microbatch};
    if (stash.size() >= o.max_buffered_messages || stash_bytes + payload_len > o.max_buffered_bytes)
      throw Error(name() + ": receive buffer full (" + std::to_string(stash.size()) +
                  " messages, " + std::to_string(stash_bytes) + " bytes) with " + describeTag(tag) +
                  " arriving from '" + o.connect +
                  "'; the peer sends messages that are not asked for");
    stash_bytes += payload_len;
    stash.emplace(tag, Pending{std::move(decoded), std::move(payload)});
  }

  // The stashed message as a tensor on `backend`: a large raw payload on a backend that
  // adopts host memory becomes its memory, returning to the pool when the tensor dies.
  Tensor take(Pending& p, Backend& backend) {
    const WireHeader& h = p.header;
    const size_t wire_bytes = p.payload->size();
    Tensor t;
    if (h.codec == Codec::kRaw && wire_bytes >= kAdoptMinBytes &&
        reinterpret_cast<uintptr_t>(p.payload->data()) % dtypeSize(h.dtype) == 0) {
      std::vector<uint8_t>* bytes = p.payload.release();
      std::weak_ptr<BufferPool> home = pool;
      auto storage = backend.adoptHost(bytes->data(), bytes->size(), [bytes, home] {
        BufferPool::Buffer b(bytes);
        if (auto to = home.lock()) to->give(std::move(b));
      });
      if (storage) {
        ++stats.received_in_place;
        t = Tensor(std::move(storage), h.shape, h.dtype);
      } else {
        p.payload.reset(bytes);
      }
    }
    if (!t.defined()) {
      t = decodePayload(h, *p.payload, backend);
      pool->give(std::move(p.payload));
    }
    ++stats.messages_received;
    stats.bytes_received_raw += t.bytes();
    stats.bytes_received_wire += wire_bytes;
    return t;
  }

  // All of `parts` into the sending connection by the deadline, taking in what arrives
  // while it is full.
  void write(const MessageTag& tag, std::array<iovec, 3> parts) {
    const auto deadline = Clock::now() + o.timeout;
    size_t first = 0;
    while (first < parts.size()) {
      msghdr m{};
      m.msg_iov = &parts[first];
      m.msg_iovlen = parts.size() - first;
      const ssize_t k = ::sendmsg(out.get(), &m, MSG_NOSIGNAL);
      if (k >= 0) {
        for (auto left = static_cast<size_t>(k); first < parts.size(); ++first) {
          if (left < parts[first].iov_len) {
            parts[first].iov_base = static_cast<uint8_t*>(parts[first].iov_base) + left;
            parts[first].iov_len -= left;
            break;
          }
          left -= parts[first].iov_len;
        }
        continue;
      }
      if (!tcp::wouldBlock(errno))
        throw IoError(name() + ": sending " + describeTag(tag) + " to '" + o.connect +
                      "' failed: " + std::strerror(errno));
      // Waiting for room, it takes in what the peer sends while the receive buffer has
      // room: a peer blocked sending to this side is then not waited on forever.
      const auto t0 = Clock::now();
      for (;;) {
        const Ready r = pump(true, room(), deadline);
        if (r.in)
          while (room() && readOne()) {
          }
        if (r.out) break;
        if (Clock::now() >= deadline)
          throw Timeout("link: sending " + describeTag(tag) + " to '" + o.connect +
                        "' blocked for " + std::to_string(o.timeout.count()) +
                        " ms (is the peer receiving?)");
      }
      stats.send_blocked_s += seconds(Clock::now() - t0);
    }
  }

  void send(const MessageTag& tag, const Tensor& t) {
    TANDEM_CHECK_MSG(out.valid(), InvalidArgument, name() << " has no peer to send to");
    WireHeader h;
    const void* host = t.bytes() ? t.backend().hostData(t) : nullptr;
    const bool raw = t.dtype() != DType::kF32 || o.codec == Codec::kRaw;
    // The payload: a host tensor's own memory when it goes raw, else encoded (or
    // downloaded) into a buffer of the pool's.
    BufferPool::Buffer encoded, sealed;
    std::span<const uint8_t> plain;
    if (raw && host) {
      plain = {static_cast<const uint8_t*>(host), t.bytes()};
    } else {
      encoded = pool->take();
      encodePayload(o, feedback, tag, t, h, *encoded);
      plain = *encoded;
    }
    addressHeader(o, tag, t, plain, h);
    std::vector<uint8_t> head = encodeHeader(h);
    const size_t head_len = head.size(), n = plain.size();
    std::array<uint8_t, kPrefixBytes> pre{};
    putLittle(pre.data(), head_len, 4);
    putLittle(pre.data() + 8, n, 8);
    std::span<const uint8_t> body = plain;
    if (key) {
      head.resize(head_len + kSealTagBytes);
      out_seal->seal({head.data(), head_len}, head.data(), head.data() + head_len, pre);
      BufferPool::Buffer& into = encoded ? encoded : (sealed = pool->take());
      into->resize(n + kSealTagBytes);  // (an encoded payload keeps its bytes)
      out_seal->seal({encoded ? into->data() : plain.data(), n}, into->data(), into->data() + n,
                     {});
      body = *into;
    }
    write(tag, {iovec{pre.data(), pre.size()}, iovec{head.data(), head.size()},
                iovec{const_cast<uint8_t*>(body.data()), body.size()}});
    ++stats.messages_sent;
    stats.bytes_sent_raw += t.bytes();
    stats.bytes_sent_wire += n;
    if (encoded) pool->give(std::move(encoded));
    if (sealed) pool->give(std::move(sealed));
  }

  Tensor recv(const MessageTag& tag, Backend& backend) {
    const auto deadline = Clock::now() + o.timeout;
    for (;;) {
      auto it = stash.find(tag);
      if (it != stash.end()) {
        Pending p = std::move(it->second);
        stash.erase(it);
        stash_bytes -= p.payload->size();
        return take(p, backend);
      }
      if (!broken.empty()) throw IoError(broken + ", before " + describeTag(tag) + " came");
      if (in.valid() && readOne()) continue;  // one message at a time, until this one
      if (!broken.empty()) continue;
      if (Clock::now() >= deadline)
        throw Timeout(name() + ": no " + describeTag(tag) + " from '" + o.connect + "' within " +
                      std::to_string(o.timeout.count()) + " ms");
      const auto t0 = Clock::now();
      pump(false, true, deadline);
      stats.recv_blocked_s += seconds(Clock::now() - t0);
    }
  }

  void connect(const std::string& to) {
    TANDEM_CHECK_MSG(!out.valid(), InvalidArgument,
                     "link: already connected to '" << o.connect << "'");
    const Where w = parseWhere(to, false);
    const auto deadline = Clock::now() + o.timeout;
    out = tcp::connectTo(w.address, tcp::SocketOptions{0, true}, deadline,
                         name() + " connecting to '" + to + "'");
    if (w.tcp) {
      tcp::setNoDelay(out.get());
      chooseLocalCongestion(out.get(), o.local_congestion);
    }
    const HelloBytes hello = writeHello({key.has_value(), o.stage, o.peer_stage, o.job, to}, key);
    if (!tcp::writeAll(out.get(), hello.data(), hello.size(), deadline, name()))
      throw Timeout(name() + ": '" + to + "' took no hello within " +
                    std::to_string(o.timeout.count()) + " ms");
    if (key) out_seal.emplace(*key, hello);
    o.connect = to;
  }
};

SocketLink::SocketLink(LinkOptions options, std::optional<LinkKey> key)
    : impl_(std::make_unique<Impl>()) {
  Impl& l = *impl_;
  l.o = std::move(options);
  l.key = key;
  TANDEM_CHECK_MSG(!l.o.bind.empty(), InvalidArgument, "link: no endpoint to bind");
  TANDEM_CHECK_MSG(l.o.timeout.count() > 0, InvalidArgument, "link: timeout must be positive");
  TANDEM_CHECK_MSG(l.o.curve_secret_key.empty() && l.o.curve_peer_public_key.empty() &&
                       l.o.curve_secret_key_file.empty() && l.o.curve_peer_public_key_file.empty(),
                   InvalidArgument,
                   "link: CurveZMQ keys given to a socket link, which is sealed by its link key");
  const Where w = parseWhere(l.o.bind, true);
  l.listener.emplace(w.address, "link at '" + l.o.bind + "'", 8);
  if (w.tcp) {
    l.endpoint = "tcp://" + Endpoint{w.host, static_cast<uint16_t>(l.listener->port())}.str();
  } else {
    l.endpoint = "ipc://" + w.path;
  }
  if (!l.o.connect.empty()) {
    const std::string peer = l.o.connect;
    l.o.connect.clear();
    l.connect(peer);
  }
}

SocketLink::~SocketLink() = default;

void SocketLink::send(const MessageTag& tag, const Tensor& t) { impl_->send(tag, t); }
Tensor SocketLink::recv(const MessageTag& tag, Backend& backend) {
  return impl_->recv(tag, backend);
}
const std::string& SocketLink::peer() const { return impl_->o.connect; }
void SocketLink::connect(const std::string& endpoint) { impl_->connect(endpoint); }
void SocketLink::setTimeout(std::chrono::milliseconds timeout) {
  TANDEM_CHECK_MSG(timeout.count() > 0, InvalidArgument, "link: timeout must be positive");
  impl_->o.timeout = timeout;
}
const std::string& SocketLink::endpoint() const { return impl_->endpoint; }
const LinkStats& SocketLink::stats() const { return impl_->stats; }
size_t SocketLink::buffered() const { return impl_->stash.size(); }

}  // namespace tandem::transport
