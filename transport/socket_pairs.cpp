#include "transport/socket_pairs.h"

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "core/spin.h"

namespace tandem::transport {

namespace {

using Clock = Transfer::Clock;

constexpr uint32_t kMessageMagic = 0x50524754;  // "TGRP"

// Received pieces are handed on (reduced, decoded) this many bytes at a time.
constexpr size_t kStageBytes = size_t{1} << 18;
// Payloads from this size on go out after their header, in sends of their own, rather
// than behind the header in one sendmsg: with the 32 header bytes in front, loopback TCP
// moved the payload a third slower (the kernel's copy into the socket buffers). Small
// payloads still share their header's send.
constexpr size_t kHeaderAloneBytes = size_t{1} << 12;

constexpr const char* kCollectives[] = {"allreduce", "reduce-scatter", "all-gather", "broadcast",
                                        "reduce",    "gather",         "scatter",    "barrier"};
constexpr uint8_t kCollectiveCount = sizeof(kCollectives) / sizeof(kCollectives[0]);

uint8_t collectiveId(const char* what) {
  for (uint8_t i = 0; i < kCollectiveCount; ++i)
    if (std::strcmp(kCollectives[i], what) == 0) return i;
  throw InvalidArgument(std::string("group: no wire id for collective '") + what + "'");
}

std::string collectiveName(uint8_t id) {
  return id < kCollectiveCount ? kCollectives[id] : "collective #" + std::to_string(id);
}

bool knownCodec(uint8_t c) {
  return c == static_cast<uint8_t>(Codec::kRaw) || c == static_cast<uint8_t>(Codec::kF16) ||
         c == static_cast<uint8_t>(Codec::kBF16);
}
size_t bytesPerValue(uint8_t codec) { return codec == static_cast<uint8_t>(Codec::kRaw) ? 4 : 2; }

int msLeft(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
}

std::string systemError() { return std::strerror(errno); }

}  // namespace

// Before each transfer's values.
struct SocketPairs::Header {
  uint32_t magic;
  uint8_t codec, collective;
  uint16_t step;
  uint64_t seq, tag, count;
};

struct SocketPairs::Out {
  static_assert(sizeof(Header) == 32);
  int peer;
  Header header;
  std::span<const float> values;
  size_t bytes, done = 0;  // payload bytes; bytes of header and payload sent
  // fp16/bf16: the payload is encoded a piece at a time as it goes, so the first bytes
  // leave at once; payload bytes [piece_begin, piece_end) are in encoded_[peer].
  size_t piece_begin = 0, piece_end = 0;
  bool finished() const { return done == sizeof(Header) + bytes; }
};

struct SocketPairs::In {
  const PairRecv* recv = nullptr;
  Header header{};
  size_t header_done = 0;
  size_t bytes = 0, done = 0;  // payload bytes (from the header) and received
  size_t fill = 0, taken = 0;  // bytes in the peer's stage; values handed on
  std::string error;           // a mismatch: the payload is dropped, then this raised
  bool finished() const { return header_done == sizeof(Header) && done == bytes; }
};

SocketPairs::SocketPairs(const SocketGroupOptions& o, SocketMesh mesh)
    : CodecPairs(o.rank, o.size, o.codec),
      ranks_here_(mesh.ranks_here),
      spin_(o.spin ? *o.spin : waitBeforeSleeping(mesh.ranks_here)),
      peers_(std::move(mesh.peers)) {
  TANDEM_CHECK_MSG(peers_.size() == static_cast<size_t>(size_), InvalidArgument,
                   "group: " << peers_.size() << " connections for " << size_ << " ranks");
  stages_.resize(static_cast<size_t>(size_));
  decoded_.resize(static_cast<size_t>(size_));
  encoded_.resize(static_cast<size_t>(size_));
}

void SocketPairs::transfer(const Transfer& t, std::span<const PairSend> sends,
                           std::span<const PairRecv> recvs) {
  if (!broken_.empty()) {
    const std::string m = callName(t) + ": the group is broken: " + broken_;
    if (broken_by_timeout_) throw Timeout(m);
    throw IoError(m);
  }
  const uint8_t collective = collectiveId(t.what);
  std::vector<Out> outs;
  outs.reserve(sends.size());
  for (const PairSend& s : sends)
    outs.push_back({s.peer,
                    {kMessageMagic, static_cast<uint8_t>(codec_), collective,
                     static_cast<uint16_t>(t.step), t.seq, t.tag, s.data.size()},
                    s.data,
                    s.data.size() * bytesPerValue(static_cast<uint8_t>(codec_))});
  std::vector<In> ins(recvs.size());
  for (size_t i = 0; i < recvs.size(); ++i) ins[i].recv = &recvs[i];

  size_t pending = outs.size() + ins.size();
  Clock::time_point idle_since{};
  while (pending > 0) {
    bool progress = false;
    for (Out& o : outs) {
      if (o.finished()) continue;
      if (sendSome(t, o)) {
        progress = true;
        pending -= o.finished() ? 1 : 0;
      }
    }
    for (In& in : ins) {
      if (in.finished()) continue;
      if (receiveSome(t, collective, in)) {
        progress = true;
        pending -= in.finished() ? 1 : 0;
      }
    }
    if (progress) {
      idle_since = Clock::time_point{};
    } else {
      const auto now = Clock::now();
      if (idle_since == Clock::time_point{}) idle_since = now;
      // Keep trying for a while, giving the core to any other runnable thread between
      // tries, before sleeping in poll: a sleep and wake-up per piece leaves the core
      // idle, and a rank woken by its local peer's send is often moved onto the peer's
      // CPU (SocketGroupOptions::spin).
      if (now - idle_since >= spin_) {
        wait(t, outs, ins);
      } else {
        sched_yield();
      }
    }
  }
  for (const In& in : ins)
    if (!in.error.empty()) throw InvalidArgument(in.error);
}

// Sends what the peer's socket will take now; true if it took anything.
bool SocketPairs::sendSome(const Transfer& t, Out& o) {
  iovec parts[2];
  int n = 0;
  if (o.done < sizeof(Header))
    parts[n++] = {reinterpret_cast<uint8_t*>(&o.header) + o.done, sizeof(Header) - o.done};
  const size_t at = o.done > sizeof(Header) ? o.done - sizeof(Header) : 0;
  if (n == 1 && o.bytes >= kHeaderAloneBytes) {
    // The header alone, so that the payload starts a segment of its own.
  } else if (codec_ == Codec::kRaw) {
    if (at < o.bytes)
      parts[n++] = {reinterpret_cast<uint8_t*>(const_cast<float*>(o.values.data())) + at,
                    o.bytes - at};
  } else {
    Encoded& e = encoded_[static_cast<size_t>(o.peer)];
    if (at == o.piece_end && at < o.bytes) {  // the next piece
      const size_t first = at / 2, count = std::min(kStageBytes / 2, o.values.size() - first);
      encode(codec_, o.values.subspan(first, count), e);
      o.piece_begin = at;
      o.piece_end = at + e.payload.size();
    }
    if (at < o.piece_end)
      parts[n++] = {e.payload.data() + (at - o.piece_begin), o.piece_end - at};
  }
  msghdr m{};
  m.msg_iov = parts;
  m.msg_iovlen = static_cast<size_t>(n);
  const ssize_t k = ::sendmsg(fd(o.peer), &m, MSG_NOSIGNAL);
  if (k > 0) {
    o.done += static_cast<size_t>(k);
    return true;
  }
  if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
    fail(t, rankName(o.peer) + ": sending failed: " + systemError());
  return false;
}

// Receives what has arrived from the peer; true if anything had.
bool SocketPairs::receiveSome(const Transfer& t, uint8_t collective, In& in) {
  const PairRecv& r = *in.recv;
  const int from = fd(r.peer);
  ssize_t k;
  if (in.header_done < sizeof(Header)) {
    k = ::recv(from, reinterpret_cast<uint8_t*>(&in.header) + in.header_done,
               sizeof(Header) - in.header_done, 0);
    if (!received(t, r.peer, k)) return false;
    in.header_done += static_cast<size_t>(k);
    if (in.header_done == sizeof(Header)) checkHeader(t, collective, in);
    return true;
  }
  const bool raw = in.header.codec == static_cast<uint8_t>(Codec::kRaw);
  if (!in.error.empty()) {  // drop the rest of a message that does not fit
    drop_.resize(kStageBytes);
    k = ::recv(from, drop_.data(), std::min(drop_.size(), in.bytes - in.done), 0);
    if (!received(t, r.peer, k)) return false;
    in.done += static_cast<size_t>(k);
    return true;
  }
  if (raw && !r.take) {  // straight into the caller's buffer
    k = ::recv(from, reinterpret_cast<uint8_t*>(r.into.data()) + in.done, in.bytes - in.done, 0);
    if (!received(t, r.peer, k)) return false;
    in.done += static_cast<size_t>(k);
    return true;
  }
  std::vector<float>& stage = stages_[static_cast<size_t>(r.peer)];
  stage.resize(kStageBytes / sizeof(float));
  auto* bytes = reinterpret_cast<uint8_t*>(stage.data());
  k = ::recv(from, bytes + in.fill, std::min(kStageBytes - in.fill, in.bytes - in.done), 0);
  if (!received(t, r.peer, k)) return false;
  in.fill += static_cast<size_t>(k);
  in.done += static_cast<size_t>(k);
  if (in.fill == kStageBytes || in.done == in.bytes) {
    const size_t values = in.fill / bytesPerValue(in.header.codec);
    std::span<const float> piece(stage.data(), values);
    if (!raw) {
      std::vector<float>& decoded = decoded_[static_cast<size_t>(r.peer)];
      const std::span<float> out = r.take ? (decoded.resize(values), std::span<float>(decoded))
                                          : r.into.subspan(in.taken, values);
      decode(codec_, {bytes, in.fill}, {}, 0, out);
      piece = out;
    }
    if (r.take) r.take(in.taken, piece);
    in.taken += values;
    in.fill = 0;
  }
  return true;
}

// What recv() returned: true for bytes, false for none yet; raises when the peer has gone.
bool SocketPairs::received(const Transfer& t, int peer, ssize_t k) {
  if (k > 0) return true;
  if (k == 0) fail(t, rankName(peer) + " closed its connection");
  if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
    fail(t, rankName(peer) + ": receiving failed: " + systemError());
  return false;
}

void SocketPairs::checkHeader(const Transfer& t, uint8_t collective, In& in) {
  const Header& h = in.header;
  const int peer = in.recv->peer;
  const std::string call = callName(t) + ": ";
  if (h.magic != kMessageMagic || !knownCodec(h.codec) || h.count > (uint64_t{1} << 60)) {
    broken_ = call + rankName(peer) + " sent bytes that are not a collective's message";
    throw FormatError(broken_);
  }
  in.bytes = h.count * bytesPerValue(h.codec);
  std::ostringstream e;
  if (h.collective != collective || h.tag != t.tag || h.seq != t.seq || h.step != t.step) {
    e << "collectives out of step: rank " << peer << " called " << collectiveName(h.collective)
      << " (tag " << h.tag << ", call " << h.seq << ", step " << h.step << ") where rank "
      << rank_ << " called " << t.what << " (tag " << t.tag << ", call " << t.seq << ", step "
      << t.step << ")";
  } else if (h.codec != static_cast<uint8_t>(codec_)) {
    e << call << "rank " << peer << " sends " << codecName(static_cast<Codec>(h.codec))
      << " values, this rank " << codecName(codec_);
  } else if (h.count != in.recv->count) {
    e << call << "rank " << peer << " sent " << h.count << " values where this rank has "
      << in.recv->count;
  }
  in.error = e.str();
}

// Nothing moved: waits for any of the transfer's sockets, or names who is late.
void SocketPairs::wait(const Transfer& t, const std::vector<Out>& outs,
                       const std::vector<In>& ins) {
  std::vector<pollfd> polled;
  auto want = [&](int peer, short events) {
    for (pollfd& p : polled)
      if (p.fd == fd(peer)) {
        p.events = static_cast<short>(p.events | events);
        return;
      }
    polled.push_back({fd(peer), events, 0});
  };
  for (const Out& o : outs)
    if (!o.finished()) want(o.peer, POLLOUT);
  for (const In& in : ins)
    if (!in.finished()) want(in.recv->peer, POLLIN);
  const int k = ::poll(polled.data(), polled.size(), msLeft(t.deadline));
  if (k < 0 && errno != EINTR) fail(t, "poll failed: " + systemError());
  if (k != 0 || Clock::now() < t.deadline) return;
  std::string late;
  const std::string within = " bytes within " + std::to_string(t.timeout.count()) + " ms";
  for (const In& in : ins) {
    if (in.finished()) continue;
    const int peer = in.recv->peer;
    late = in.header_done == 0 ? silentPeer(t, peer, size_)
                               : callName(t) + ": " + rankName(peer) + " sent " +
                                     std::to_string(in.header_done + in.done) + " of " +
                                     std::to_string(sizeof(Header) + in.bytes) + within;
    break;
  }
  for (const Out& o : outs) {
    if (!late.empty()) break;
    if (o.finished()) continue;
    late = callName(t) + ": " + rankName(o.peer) + " took " + std::to_string(o.done) + " of " +
           std::to_string(sizeof(Header) + o.bytes) + within;
  }
  broken_ = late;
  broken_by_timeout_ = true;
  throw Timeout(late);
}

void SocketPairs::fail(const Transfer& t, const std::string& what) {
  broken_ = callName(t) + ": " + what;
  broken_by_timeout_ = false;
  throw IoError(broken_);
}

}  // namespace tandem::transport
