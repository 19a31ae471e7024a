#include "transport/socket_group.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/spin.h"
#include "transport/local_tcp.h"
#include "transport/peer_group.h"

namespace tandem::transport {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMessageMagic = 0x50524754;  // "TGRP"
constexpr uint32_t kHelloMagic = 0x4c454854;    // "THEL"

// Before each transfer's values.
struct Header {
  uint32_t magic;
  uint8_t codec, collective;
  uint16_t step;
  uint64_t seq, tag, count;
};
static_assert(sizeof(Header) == 32);

// The first bytes on every connection, from the connecting (higher) rank.
struct Hello {
  uint32_t magic;
  int32_t size, from, to;
  uint64_t group_id;
};
static_assert(sizeof(Hello) == 24);

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

// A file descriptor, closed with its owner.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

std::string systemError() { return std::strerror(errno); }

int msLeft(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
}

// Waits until `fd` is ready for `events`; false once the deadline has passed.
bool waitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int k = ::poll(&p, 1, msLeft(deadline));
    if (k > 0) return true;
    if (k == 0) {
      if (Clock::now() >= deadline) return false;
      continue;
    }
    if (errno != EINTR) throw IoError("group: poll: " + systemError());
  }
}

// Moves all `n` bytes through a non-blocking socket by the deadline (false if it passed).
bool readAll(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& who) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
    } else if (k == 0) {
      throw IoError(who + " closed the connection");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!waitFor(fd, POLLIN, deadline)) return false;
    } else {
      throw IoError(who + ": " + systemError());
    }
  }
  return true;
}

bool writeAll(int fd, const void* data, size_t n, Clock::time_point deadline,
              const std::string& who) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!waitFor(fd, POLLOUT, deadline)) return false;
    } else {
      throw IoError(who + ": " + systemError());
    }
  }
  return true;
}

void setNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  TANDEM_CHECK_MSG(flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0, IoError,
                   "group: cannot make a socket non-blocking: " << systemError());
}

// A socket address, resolved from the group's options or a peer's published address.
struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_UNSPEC;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

Address tcpAddress(const std::string& host, const std::string& port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const int e = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  TANDEM_CHECK_MSG(
      e == 0 && found != nullptr, InvalidArgument,
      "group: cannot resolve '" << host << "' port " << port << ": " << ::gai_strerror(e));
  Address a;
  std::memcpy(&a.storage, found->ai_addr, found->ai_addrlen);
  a.length = found->ai_addrlen;
  a.family = found->ai_family;
  ::freeaddrinfo(found);
  return a;
}

// A Unix socket address; a path that starts with '@' is a name in Linux's abstract
// namespace (as ZeroMQ writes them): no file, so nothing is left behind by a process
// that is killed.
Address unixAddress(const std::string& path) {
  Address a;
  auto* un = reinterpret_cast<sockaddr_un*>(&a.storage);
  TANDEM_CHECK_MSG(path.size() < sizeof(un->sun_path), InvalidArgument,
                   "group: the socket path '" << path << "' is longer than "
                                              << sizeof(un->sun_path) - 1 << " bytes");
  un->sun_family = AF_UNIX;
  std::memcpy(un->sun_path, path.c_str(), path.size() + 1);
  const bool abstract = !path.empty() && path[0] == '@';
  if (abstract) un->sun_path[0] = '\0';
  a.length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + !abstract);
  a.family = AF_UNIX;
  return a;
}

class SocketGroup final : public PeerGroup {
 public:
  SocketGroup(const SocketGroupOptions& o, const Exchange& exchange)
      : PeerGroup(o.rank, o.size, o.codec),
        tcp_(o.transport == "tcp"),
        buffer_(o.socket_buffer_bytes),
        local_congestion_(o.local_congestion) {
    TANDEM_CHECK_MSG(o.transport == "tcp" || o.transport == "ipc", InvalidArgument,
                     "group: transport '" << o.transport << "' (expected tcp or ipc)");
    TANDEM_CHECK_MSG(o.connect_timeout.count() > 0, InvalidArgument,
                     "group: the connect timeout must be positive");
    TANDEM_CHECK_MSG(!o.spin || o.spin->count() >= 0, InvalidArgument,
                     "group: spin " << o.spin.value_or(std::chrono::microseconds(0)).count()
                                    << " us is negative");
    TANDEM_CHECK_MSG(o.socket_buffer_bytes >= 0, InvalidArgument,
                     "group: socket_buffer_bytes " << o.socket_buffer_bytes << " is negative");
    fds_.resize(static_cast<size_t>(size_));
    stages_.resize(static_cast<size_t>(size_));
    decoded_.resize(static_cast<size_t>(size_));
    encoded_.resize(static_cast<size_t>(size_));

    // Listen first, so that a peer that learns this address can connect at once.
    std::string path;
    Address here;
    if (tcp_) {
      here = tcpAddress(o.host, "0", true);
    } else {
      path = (std::filesystem::path(o.ipc_dir) /
              ("tandem-group-" + std::to_string(::getpid()) + "-" + std::to_string(o.group_id) +
               "-" + std::to_string(rank_)))
                 .string();
      here = unixAddress(path);
      ::unlink(path.c_str());
    }
    const std::shared_ptr<void> remove_path(nullptr, [path](void*) {
      if (!path.empty()) ::unlink(path.c_str());
    });
    Fd listener = openSocket(here.family);
    TANDEM_CHECK_MSG(::bind(listener.get(), here.get(), here.length) == 0 &&
                         ::listen(listener.get(), size_) == 0,
                     IoError,
                     "group: rank " << rank_ << " cannot listen on " << (tcp_ ? o.host : path)
                                    << ": " << systemError());
    std::string mine = "ipc " + path;
    if (tcp_) {
      sockaddr_storage bound{};
      socklen_t length = sizeof(bound);
      ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &length);
      const uint16_t port = bound.ss_family == AF_INET6
                                ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port;
      mine = "tcp " + o.host + " " + std::to_string(ntohs(port));
    }

    const std::vector<std::string> all = exchange(mine);
    TANDEM_CHECK_MSG(all.size() == static_cast<size_t>(size_), FormatError,
                     "group: the exchange returned " << all.size() << " ranks, not " << size_);
    const auto deadline = Clock::now() + o.connect_timeout;
    for (int p = 0; p < rank_; ++p) connectTo(p, all[static_cast<size_t>(p)], o, deadline);
    acceptFromAbove(listener, o, deadline);
    for (const Fd& fd : fds_)
      if (fd.get() >= 0 && (!tcp_ || peerIsLocal(fd.get()))) ++ranks_here_;
    spin_ = o.spin ? *o.spin : waitBeforeSleeping(ranks_here_);
  }

  SocketGroupChoices choices() const { return {ranks_here_, spin_}; }

 private:
  static constexpr size_t kStageBytes = size_t{1} << 18;  // received pieces handed on
  // Payloads from this size on go out after their header, in sends of their own, rather
  // than behind the header in one sendmsg: with the 32 header bytes in front, loopback
  // TCP moved the payload a third slower (allreduce, median of alternated runs: 16 MiB x
  // 2 ranks 17.6 -> 12.9 ms, 64 MiB x 2 71.3 -> 52.6 ms with the header alone; perf put the
  // difference in the kernel's copy into the socket buffers). Small payloads still share
  // their header's send.
  static constexpr size_t kHeaderAloneBytes = size_t{1} << 12;

  Fd openSocket(int family) const {
    Fd s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    TANDEM_CHECK_MSG(s.get() >= 0, IoError, "group: socket: " << systemError());
    if (buffer_ > 0) {
      // Before listen/connect, so that TCP's window scaling is chosen for them.
      ::setsockopt(s.get(), SOL_SOCKET, SO_SNDBUF, &buffer_, sizeof(buffer_));
      ::setsockopt(s.get(), SOL_SOCKET, SO_RCVBUF, &buffer_, sizeof(buffer_));
    }
    setNonBlocking(s.get());
    return s;
  }

  // A new connection's TCP options: no Nagle delay; the local congestion control.
  void tune(int fd) const {
    if (!tcp_) return;
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    chooseLocalCongestion(fd, local_congestion_);
  }

  void connectTo(int p, const std::string& published, const SocketGroupOptions& o,
                 Clock::time_point deadline) {
    // "tcp HOST PORT", or "ipc PATH" (the path may hold spaces).
    std::istringstream words(published);
    std::string kind, where, port, extra;
    words >> kind;
    if (kind == "tcp") {
      words >> where >> port;
      if (words >> extra) where.clear();
    } else if (kind == "ipc" && published.size() > 4) {
      where = published.substr(4);
    }
    TANDEM_CHECK_MSG(kind == o.transport && !where.empty() && (kind != "tcp" || !port.empty()),
                     FormatError,
                     "group: rank " << p << " published '" << published << "', not a "
                                    << o.transport << " address");
    const Address there = kind == "tcp" ? tcpAddress(where, port, false) : unixAddress(where);
    const std::string who = "group: connecting to " + rankName(p) + " at " + published;
    for (;;) {
      Fd s = openSocket(there.family);
      if (::connect(s.get(), there.get(), there.length) != 0) {
        int error = errno;
        if (error == EINPROGRESS) {
          if (!waitFor(s.get(), POLLOUT, deadline))
            throw Timeout(who + ": no connection within " +
                          std::to_string(o.connect_timeout.count()) + " ms");
          socklen_t length = sizeof(error);
          ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &error, &length);
        }
        if (error == ECONNREFUSED || error == EAGAIN || error == ENOENT) {  // not listening yet
          if (Clock::now() >= deadline)
            throw Timeout(who + ": refused until the connect timeout (" +
                          std::to_string(o.connect_timeout.count()) + " ms)");
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          continue;
        }
        TANDEM_CHECK_MSG(error == 0, IoError, who << ": " << std::strerror(error));
      }
      tune(s.get());
      const Hello hello{kHelloMagic, size_, rank_, p, o.group_id};
      if (!writeAll(s.get(), &hello, sizeof(hello), deadline, who))
        throw Timeout(who + ": it took no greeting within " +
                      std::to_string(o.connect_timeout.count()) + " ms");
      fds_[static_cast<size_t>(p)] = std::move(s);
      return;
    }
  }

  // Every higher rank connects here; a connection that does not greet as one of them (a
  // stray client, another group's rank) is closed and the wait goes on.
  void acceptFromAbove(const Fd& listener, const SocketGroupOptions& o,
                       Clock::time_point deadline) {
    int missing = size_ - 1 - rank_;
    std::string turned_away;
    while (missing > 0) {
      if (!waitFor(listener.get(), POLLIN, deadline)) {
        std::string names;
        for (int p = rank_ + 1; p < size_; ++p)
          if (fds_[static_cast<size_t>(p)].get() < 0) names.append(" ").append(std::to_string(p));
        throw Timeout("group rendezvous: rank(s)" + names + " of " + std::to_string(size_) +
                      " did not connect to rank " + std::to_string(rank_) + " within " +
                      std::to_string(o.connect_timeout.count()) + " ms" + turned_away);
      }
      Fd s(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (s.get() < 0) continue;  // the client gave up, or a signal: wait on
      Hello hello{};
      try {
        if (!readAll(s.get(), &hello, sizeof(hello), deadline, "a connecting peer")) continue;
      } catch (const IoError&) {
        continue;
      }
      std::ostringstream why;
      if (hello.magic != kHelloMagic) {
        why << "a connection that is not a tandem group's";
      } else if (hello.group_id != o.group_id || hello.size != size_ || hello.to != rank_) {
        why << "rank " << hello.from << " of " << hello.size << " of group " << hello.group_id
            << " looking for rank " << hello.to;
      } else if (hello.from <= rank_ || hello.from >= size_ ||
                 fds_[static_cast<size_t>(hello.from)].get() >= 0) {
        why << "a second or unexpected rank " << hello.from;
      }
      if (!why.str().empty()) {
        turned_away = " (turned away: " + why.str() + ")";
        continue;
      }
      tune(s.get());
      fds_[static_cast<size_t>(hello.from)] = std::move(s);
      --missing;
    }
  }

  struct Out {
    int peer;
    Header header;
    std::span<const float> values;
    size_t bytes, done = 0;  // payload bytes; bytes of header and payload sent
    // fp16/bf16: the payload is encoded a piece at a time as it goes, so the first bytes
    // leave at once; payload bytes [piece_begin, piece_end) are in encoded_[peer].
    size_t piece_begin = 0, piece_end = 0;
    bool finished() const { return done == sizeof(Header) + bytes; }
  };

  struct In {
    const Recv* recv = nullptr;
    Header header{};
    size_t header_done = 0;
    size_t bytes = 0, done = 0;  // payload bytes (from the header) and received
    size_t fill = 0, taken = 0;  // bytes in the peer's stage; values handed on
    std::string error;           // a mismatch: the payload is dropped, then this raised
    bool finished() const { return header_done == sizeof(Header) && done == bytes; }
  };

  void transfer(const Call& c, int step, std::span<const Send> sends,
                std::span<const Recv> recvs) override {
    if (!broken_.empty()) {
      const std::string m = callName(c) + ": the group is broken: " + broken_;
      if (broken_by_timeout_) throw Timeout(m);
      throw IoError(m);
    }
    const uint8_t collective = collectiveId(c.what);
    std::vector<Out> outs;
    outs.reserve(sends.size());
    for (const Send& s : sends)
      outs.push_back({s.peer,
                      {kMessageMagic, static_cast<uint8_t>(codec_), collective,
                       static_cast<uint16_t>(step), c.seq, c.tag, s.data.size()},
                      s.data,
                      s.data.size() * bytesPerValue(static_cast<uint8_t>(codec_))});
    std::vector<In> ins;
    ins.reserve(recvs.size());
    for (const Recv& r : recvs) {
      In in;
      in.recv = &r;
      ins.push_back(std::move(in));
    }

    size_t pending = outs.size() + ins.size();
    Clock::time_point idle_since{};
    while (pending > 0) {
      bool progress = false;
      for (Out& o : outs) {
        if (o.finished()) continue;
        if (sendSome(c, o)) {
          progress = true;
          pending -= o.finished() ? 1 : 0;
        }
      }
      for (In& in : ins) {
        if (in.finished()) continue;
        if (receiveSome(c, step, collective, in)) {
          progress = true;
          pending -= in.finished() ? 1 : 0;
        }
      }
      if (progress) {
        idle_since = Clock::time_point{};
      } else {
        const auto now = Clock::now();
        if (idle_since == Clock::time_point{}) idle_since = now;
        // Keep trying for a while, giving the core to any other runnable thread
        // between tries, before sleeping in poll: a sleep and wake-up per piece left
        // the core idle 15% of the time (measured: 16 MiB, 2 ranks, 14.5 -> 11.9 ms
        // median with 50 us; 64 MiB 76 -> 64 ms), and a rank woken by its local peer's
        // send was often moved onto the peer's CPU (SocketGroupOptions::spin).
        if (now - idle_since >= spin_) {
          wait(c, outs, ins);
        } else {
          sched_yield();
        }
      }
    }
    for (const In& in : ins)
      if (!in.error.empty()) throw InvalidArgument(in.error);
  }

  // Sends what the peer's socket will take now; true if it took anything.
  bool sendSome(const Call& c, Out& o) {
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
    const ssize_t k = ::sendmsg(fds_[static_cast<size_t>(o.peer)].get(), &m, MSG_NOSIGNAL);
    if (k > 0) {
      o.done += static_cast<size_t>(k);
      return true;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      fail(c, rankName(o.peer) + ": sending failed: " + systemError());
    return false;
  }

  // Receives what has arrived from the peer; true if anything had.
  bool receiveSome(const Call& c, int step, uint8_t collective, In& in) {
    const Recv& r = *in.recv;
    const int fd = fds_[static_cast<size_t>(r.peer)].get();
    ssize_t k;
    if (in.header_done < sizeof(Header)) {
      k = ::recv(fd, reinterpret_cast<uint8_t*>(&in.header) + in.header_done,
                 sizeof(Header) - in.header_done, 0);
      if (!received(c, r.peer, k)) return false;
      in.header_done += static_cast<size_t>(k);
      if (in.header_done == sizeof(Header)) checkHeader(c, step, collective, in);
      return true;
    }
    const bool raw = in.header.codec == static_cast<uint8_t>(Codec::kRaw);
    if (!in.error.empty()) {  // drop the rest of a message that does not fit
      drop_.resize(kStageBytes);
      k = ::recv(fd, drop_.data(), std::min(drop_.size(), in.bytes - in.done), 0);
      if (!received(c, r.peer, k)) return false;
      in.done += static_cast<size_t>(k);
      return true;
    }
    if (raw && !r.take) {  // straight into the caller's buffer
      k = ::recv(fd, reinterpret_cast<uint8_t*>(r.into.data()) + in.done, in.bytes - in.done, 0);
      if (!received(c, r.peer, k)) return false;
      in.done += static_cast<size_t>(k);
      return true;
    }
    std::vector<float>& stage = stages_[static_cast<size_t>(r.peer)];
    stage.resize(kStageBytes / sizeof(float));
    auto* bytes = reinterpret_cast<uint8_t*>(stage.data());
    k = ::recv(fd, bytes + in.fill, std::min(kStageBytes - in.fill, in.bytes - in.done), 0);
    if (!received(c, r.peer, k)) return false;
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

  // What recv() returned: true for bytes, false for none yet; raises when the peer has
  // gone.
  bool received(const Call& c, int peer, ssize_t k) {
    if (k > 0) return true;
    if (k == 0) fail(c, rankName(peer) + " closed its connection");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      fail(c, rankName(peer) + ": receiving failed: " + systemError());
    return false;
  }

  void checkHeader(const Call& c, int step, uint8_t collective, In& in) {
    const Header& h = in.header;
    const int peer = in.recv->peer;
    const std::string call = callName(c) + ": ";
    if (h.magic != kMessageMagic || !knownCodec(h.codec) || h.count > (uint64_t{1} << 60)) {
      broken_ = call + rankName(peer) + " sent bytes that are not a collective's message";
      throw FormatError(broken_);
    }
    in.bytes = h.count * bytesPerValue(h.codec);
    std::ostringstream e;
    if (h.collective != collective || h.tag != c.tag || h.seq != c.seq || h.step != step) {
      e << "collectives out of step: rank " << peer << " called " << collectiveName(h.collective)
        << " (tag " << h.tag << ", call " << h.seq << ", step " << h.step << ") where rank "
        << rank_ << " called " << c.what << " (tag " << c.tag << ", call " << c.seq << ", step "
        << step << ")";
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
  void wait(const Call& c, const std::vector<Out>& outs, const std::vector<In>& ins) {
    std::vector<pollfd> polled;
    auto want = [&](int peer, short events) {
      const int fd = fds_[static_cast<size_t>(peer)].get();
      for (pollfd& p : polled)
        if (p.fd == fd) {
          p.events = static_cast<short>(p.events | events);
          return;
        }
      polled.push_back({fd, events, 0});
    };
    for (const Out& o : outs)
      if (!o.finished()) want(o.peer, POLLOUT);
    for (const In& in : ins)
      if (!in.finished()) want(in.recv->peer, POLLIN);
    const int k = ::poll(polled.data(), polled.size(), msLeft(c.deadline));
    if (k < 0 && errno != EINTR) fail(c, "poll failed: " + systemError());
    if (k != 0 || Clock::now() < c.deadline) return;
    std::string late;
    for (const In& in : ins) {
      if (in.finished()) continue;
      const int peer = in.recv->peer;
      late = in.header_done == 0 ? silentPeer(c, peer)
                                 : callName(c) + ": " + rankName(peer) + " sent " +
                                       std::to_string(in.header_done + in.done) + " of " +
                                       std::to_string(sizeof(Header) + in.bytes) +
                                       " bytes within " + std::to_string(c.timeout.count()) + " ms";
      break;
    }
    for (const Out& o : outs) {
      if (!late.empty()) break;
      if (o.finished()) continue;
      late = callName(c) + ": " + rankName(o.peer) + " took " + std::to_string(o.done) + " of " +
             std::to_string(sizeof(Header) + o.bytes) + " bytes within " +
             std::to_string(c.timeout.count()) + " ms";
    }
    broken_ = late;
    broken_by_timeout_ = true;
    throw Timeout(late);
  }

  [[noreturn]] void fail(const Call& c, const std::string& what) {
    broken_ = callName(c) + ": " + what;
    broken_by_timeout_ = false;
    throw IoError(broken_);
  }

  const bool tcp_;
  const int buffer_;
  const std::string local_congestion_;
  int ranks_here_ = 1;  // this one and the peers on this machine
  std::chrono::microseconds spin_{0};
  std::vector<Fd> fds_;                               // by peer rank; none for this one
  std::vector<std::vector<float>> stages_, decoded_;  // by peer: received pieces
  std::vector<Encoded> encoded_;                      // by peer: the piece being sent, encoded
  std::vector<uint8_t> drop_;
  std::string broken_;  // why the connections are out of step, once they are
  bool broken_by_timeout_ = false;
};

}  // namespace

std::unique_ptr<Group> makeSocketGroup(const SocketGroupOptions& options,
                                       const Exchange& exchange) {
  return std::make_unique<SocketGroup>(options, exchange);
}

SocketGroupChoices socketGroupChoices(const Group& group) {
  const auto* g = dynamic_cast<const SocketGroup*>(&group);
  TANDEM_CHECK_MSG(g != nullptr, InvalidArgument, "socketGroupChoices: not a socket group");
  return g->choices();
}

}  // namespace tandem::transport
