// Plain stream sockets, owned: the one place tandem opens, binds, connects and accepts
// a TCP or Unix-domain socket by hand (the socket links, the socket group, the
// benchmarks' raw-socket peers and the transport tests all go through here). ZeroMQ and
// Boost.Asio own their sockets themselves.
//
// Every blocking step takes a deadline on the steady clock: a step that cannot finish
// by then returns false (or raises Timeout where it says so); a failing system call
// raises IoError with the errno text and the `who` the caller names. A socket made here
// is close-on-exec; non-blocking unless its options say otherwise.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>

namespace tandem::transport::tcp {

using Clock = std::chrono::steady_clock;

// A file descriptor, closed with its owner.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }

  void reset();
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// A socket address: an IPv4/IPv6 host and port, or a Unix socket path.
struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_UNSPEC;

  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  // The port of an IPv4/IPv6 address, 0 for others.
  int port() const;

  // `host` (a name or a numeric address) and `port` resolved; `passive` for an address
  // to listen on. InvalidArgument naming both when it does not resolve.
  static Address resolve(const std::string& host, const std::string& port, bool passive);
  // The loopback address of `family` (AF_INET or AF_INET6), port 0 (the system's choice).
  static Address loopback(int family = AF_INET);
  // A Unix socket path; one that starts with '@' is a name in Linux's abstract namespace
  // (as ZeroMQ writes them): no file, so nothing is left behind by a killed process.
  // InvalidArgument when it is too long for sockaddr_un.
  static Address unixPath(const std::string& path);
};

// The address a socket is bound to (`peer`: that of its peer); family AF_UNSPEC when the
// call fails.
Address localAddress(int fd);
Address peerAddress(int fd);

struct SocketOptions {
  // SO_SNDBUF and SO_RCVBUF, set before listen/connect so that TCP's window scaling is
  // chosen for them (the kernel caps them at net.core.wmem_max / rmem_max); 0 leaves
  // them to the kernel's autotuning.
  int buffer_bytes = 0;
  bool non_blocking = true;
};

// A new stream socket of `family` with `options`; IoError if the system refuses one.
Socket openSocket(int family, const SocketOptions& options = {});

// No Nagle delay on a TCP socket (nothing for other sockets).
void setNoDelay(int fd);
void setNonBlocking(int fd);

// Milliseconds from now to the deadline, for poll (0 once it has passed).
int msLeft(Clock::time_point deadline);
// A non-blocking call's errno that means "not now, try again" (EAGAIN, EINTR).
bool wouldBlock(int error);

// Waits until `fd` is ready for `events` (POLLIN, POLLOUT); false once the deadline has
// passed. Signals do not end the wait.
bool waitFor(int fd, short events, Clock::time_point deadline);

// All `n` bytes through a socket by the deadline (false if it passed first). A peer that
// closes the connection before all is read raises IoError "`who` closed the connection".
bool readAll(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& who);
bool writeAll(int fd, const void* data, size_t n, Clock::time_point deadline,
              const std::string& who);

// A listening socket.
class Listener {
 public:
  // Binds `where` and listens; IoError naming `where_name` when it cannot. A Unix path is
  // unlinked first and again when the listener is destroyed (abstract names need not be).
  Listener(const Address& where, const std::string& where_name, int backlog,
           const SocketOptions& options = {});
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  int get() const { return socket_.get(); }
  // The bound address, with the port the system chose for port 0.
  const Address& address() const { return bound_; }
  int port() const { return bound_.port(); }

  // The next connection, made non-blocking unless `options` say otherwise; nullopt when
  // none came by the deadline. A client that gave up before it was accepted is skipped.
  std::optional<Socket> accept(Clock::time_point deadline, const SocketOptions& options = {});

 private:
  Socket socket_;
  Address bound_;
  std::string unlink_path_;
};

// Connects a new socket with `options` to `there` by the deadline. While the peer
// refuses (not listening yet) it tries again every 10 ms when `retry_refused`, else
// raises IoError at once; past the deadline, Timeout. Messages start with `who`.
Socket connectTo(const Address& there, const SocketOptions& options, Clock::time_point deadline,
                 const std::string& who, bool retry_refused = true);

// A connected pair over the loopback of `family`: {client, accepted}, blocking unless
// `options` say otherwise. nullopt where the family has no loopback (IPv6 off); IoError
// for any other failure.
std::optional<std::pair<Socket, Socket>> loopbackPair(int family = AF_INET,
                                                      const SocketOptions& options = {0, false});

}  // namespace tandem::transport::tcp
