#include "transport/tcp/socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace tandem::transport::tcp {

namespace {

std::string systemError(int error = errno) { return std::strerror(error); }

Address addressOf(int fd, bool peer) {
  Address a;
  socklen_t length = sizeof(a.storage);
  auto* s = reinterpret_cast<sockaddr*>(&a.storage);
  if ((peer ? ::getpeername(fd, s, &length) : ::getsockname(fd, s, &length)) != 0) return {};
  a.length = length;
  a.family = a.storage.ss_family;
  return a;
}

}  // namespace

int msLeft(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
}

bool wouldBlock(int error) { return error == EAGAIN || error == EWOULDBLOCK || error == EINTR; }

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

void Socket::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int Address::port() const {
  if (family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

Address Address::resolve(const std::string& host, const std::string& port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const int e = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  TANDEM_CHECK_MSG(e == 0 && found != nullptr, InvalidArgument,
                   "cannot resolve '" << host << "' port " << port << ": " << ::gai_strerror(e));
  Address a;
  std::memcpy(&a.storage, found->ai_addr, found->ai_addrlen);
  a.length = found->ai_addrlen;
  a.family = found->ai_family;
  ::freeaddrinfo(found);
  return a;
}

Address Address::loopback(int family) {
  TANDEM_CHECK_MSG(family == AF_INET || family == AF_INET6, InvalidArgument,
                   "loopback: address family " << family << " (expected IPv4 or IPv6)");
  Address a;
  a.family = family;
  if (family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = in6addr_loopback;
    a.length = sizeof(sockaddr_in6);
  } else {
    auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.length = sizeof(sockaddr_in);
  }
  return a;
}

Address Address::unixPath(const std::string& path) {
  Address a;
  auto* un = reinterpret_cast<sockaddr_un*>(&a.storage);
  TANDEM_CHECK_MSG(
      path.size() < sizeof(un->sun_path), InvalidArgument,
      "the socket path '" << path << "' is longer than " << sizeof(un->sun_path) - 1 << " bytes");
  un->sun_family = AF_UNIX;
  std::memcpy(un->sun_path, path.c_str(), path.size() + 1);
  const bool abstract = !path.empty() && path[0] == '@';
  if (abstract) un->sun_path[0] = '\0';
  a.length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + !abstract);
  a.family = AF_UNIX;
  return a;
}

Address localAddress(int fd) { return addressOf(fd, false); }
Address peerAddress(int fd) { return addressOf(fd, true); }

Socket openSocket(int family, const SocketOptions& options) {
  Socket s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  TANDEM_CHECK_MSG(s.valid(), IoError, "socket: " << systemError());
  if (options.buffer_bytes > 0) {
    ::setsockopt(s.get(), SOL_SOCKET, SO_SNDBUF, &options.buffer_bytes,
                 sizeof(options.buffer_bytes));
    ::setsockopt(s.get(), SOL_SOCKET, SO_RCVBUF, &options.buffer_bytes,
                 sizeof(options.buffer_bytes));
  }
  if (options.non_blocking) setNonBlocking(s.get());
  return s;
}

void setNoDelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // fails harmlessly off TCP
}

void setNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  TANDEM_CHECK_MSG(flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0, IoError,
                   "cannot make a socket non-blocking: " << systemError());
}

bool waitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int k = ::poll(&p, 1, msLeft(deadline));
    if (k > 0) return true;
    if (k == 0) {
      if (Clock::now() >= deadline) return false;
      continue;
    }
    if (errno != EINTR) throw IoError("poll: " + systemError());
  }
}

bool readAll(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& who) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
    } else if (k == 0) {
      throw IoError(who + " closed the connection");
    } else if (wouldBlock(errno)) {
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
    } else if (k < 0 && wouldBlock(errno)) {
      if (!waitFor(fd, POLLOUT, deadline)) return false;
    } else {
      throw IoError(who + ": " + systemError());
    }
  }
  return true;
}

Listener::Listener(const Address& where, const std::string& where_name, int backlog,
                   const SocketOptions& options)
    : socket_(openSocket(where.family, options)) {
  if (where.family == AF_UNIX) {
    const auto* un = reinterpret_cast<const sockaddr_un*>(&where.storage);
    if (un->sun_path[0] != '\0') {
      unlink_path_ = un->sun_path;
      ::unlink(unlink_path_.c_str());
    }
  }
  TANDEM_CHECK_MSG(::bind(socket_.get(), where.get(), where.length) == 0 &&
                       ::listen(socket_.get(), backlog) == 0,
                   IoError, "cannot listen on " << where_name << ": " << systemError());
  bound_ = where.family == AF_UNIX ? where : localAddress(socket_.get());
}

Listener::~Listener() {
  if (!unlink_path_.empty()) ::unlink(unlink_path_.c_str());
}

std::optional<Socket> Listener::accept(Clock::time_point deadline, const SocketOptions& options) {
  const int flags = SOCK_CLOEXEC | (options.non_blocking ? SOCK_NONBLOCK : 0);
  while (waitFor(socket_.get(), POLLIN, deadline)) {
    Socket s(::accept4(socket_.get(), nullptr, nullptr, flags));
    if (s.valid()) return s;
    // The client gave up, or a signal: wait on.
  }
  return std::nullopt;
}

Socket connectTo(const Address& there, const SocketOptions& options, Clock::time_point deadline,
                 const std::string& who, bool retry_refused) {
  SocketOptions pending = options;
  pending.non_blocking = true;  // so the deadline holds; restored below
  for (;;) {
    Socket s = openSocket(there.family, pending);
    int error = 0;
    if (::connect(s.get(), there.get(), there.length) != 0) {
      error = errno;
      if (error == EINPROGRESS) {
        if (!waitFor(s.get(), POLLOUT, deadline))
          throw Timeout(who + ": no connection by the deadline");
        socklen_t length = sizeof(error);
        ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &error, &length);
      }
    }
    // Refused: nobody listens there yet (a Unix path not made yet: ENOENT).
    const bool refused = error == ECONNREFUSED || error == EAGAIN || error == ENOENT;
    if (refused && retry_refused) {
      if (Clock::now() >= deadline) throw Timeout(who + ": refused until the deadline");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    TANDEM_CHECK_MSG(error == 0, IoError, who << ": " << systemError(error));
    if (!options.non_blocking) {
      const int flags = ::fcntl(s.get(), F_GETFL);
      ::fcntl(s.get(), F_SETFL, flags & ~O_NONBLOCK);
    }
    return s;
  }
}

std::optional<std::pair<Socket, Socket>> loopbackPair(int family, const SocketOptions& options) {
  const Address here = Address::loopback(family);
  // A family without loopback (IPv6 switched off) cannot bind it.
  {
    Socket probe(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!probe.valid() || ::bind(probe.get(), here.get(), here.length) != 0) return std::nullopt;
  }
  Listener listener(here, "the loopback", 1, options);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  Socket client = connectTo(listener.address(), options, deadline, "loopback pair", false);
  std::optional<Socket> accepted = listener.accept(deadline, options);
  TANDEM_CHECK_MSG(accepted.has_value(), Timeout, "loopback pair: no connection to accept");
  return std::make_pair(std::move(client), std::move(*accepted));
}

}  // namespace tandem::transport::tcp
