// HTTP/1.1 for `tandem serve`, on Boost.Beast over the Asio the control plane already
// uses (docs/serve.md says why Beast and not cpp-httplib: no new dependency, and
// coroutines on one I/O thread give each streaming client a cheap session rather than a
// thread). One I/O thread runs every connection as a coroutine; generation runs on the
// engine's thread and wakes a session through its Waker.
//
// What a client cannot do to it: send a header over `max_header` (431) or a body over
// `max_body` (413, before the body is read), take longer than `request_timeout` to send a
// request (408: headers a byte a second), idle past `idle_timeout` between requests, stall
// a response past `write_timeout` (it is dropped), open more than `max_per_source`
// connections from one address or `max_connections` in all (429 / 503, then closed).
// Malformed HTTP gets 400 and the connection closes; nothing a client sends ends the
// server.
#pragma once

// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace tandem::serve {

namespace net = boost::asio;
namespace http = boost::beast::http;

struct HttpLimits {
  size_t max_header = 16 * 1024;
  size_t max_body = 1 << 20;
  std::chrono::milliseconds request_timeout{30000};  // to receive one whole request
  std::chrono::milliseconds idle_timeout{60000};     // between requests on one connection
  std::chrono::milliseconds write_timeout{30000};    // for a client to take what is sent
  int max_connections = 256;
  int max_per_source = 64;
};

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

// Wakes a session waiting in Connection::wait from another thread. Once the session has
// left (its WaitScope gone) a wake does nothing.
class Waker : public std::enable_shared_from_this<Waker> {
 public:
  void wake();

 private:
  friend class Connection;
  std::mutex mu_;
  net::steady_timer* timer_ = nullptr;
  bool pending_ = false;
};

// The connection a handler answers on (one request at a time).
class Connection {
 public:
  explicit Connection(boost::beast::tcp_stream& stream, const HttpLimits& limits)
      : stream_(stream), limits_(limits) {}
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  // Each returns false once the client is gone (the write failed or timed out).
  net::awaitable<bool> send(Response& r);
  // A stream of server-sent events: the header (chunked), then each event's data as
  // "data: {data}\n\n", then the last chunk.
  net::awaitable<bool> beginEvents();
  net::awaitable<bool> event(std::string_view data);
  net::awaitable<bool> endEvents();

  // A waker for a producer on another thread; `wait` returns once it wakes (or at once if
  // it woke since the last wait) or the client closes its side of the connection.
  std::shared_ptr<Waker> waker();
  net::awaitable<void> wait();
  bool clientGone() const { return gone_; }
  std::string peer() const;

 private:
  net::awaitable<bool> write(const std::string& data);

  boost::beast::tcp_stream& stream_;
  const HttpLimits& limits_;
  std::shared_ptr<Waker> waker_;
  std::unique_ptr<net::steady_timer> timer_;
  bool gone_ = false, watching_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  net::awaitable<void> watch(std::shared_ptr<bool> alive);
};

// Answers one request on `c`; returns whether the connection may be kept for another.
using Handler = std::function<net::awaitable<bool>(Request&, Connection&)>;

class HttpServer {
 public:
  // Binds host:port (port 0: any free one); IoError naming the address if it cannot.
  HttpServer(const std::string& host, uint16_t port, HttpLimits limits, Handler handler);
  ~HttpServer();
  uint16_t port() const { return port_; }
  // Serves until stop() (from any thread, or a signal handler's thread).
  void run();
  void stop();

 private:
  net::awaitable<void> accept();
  net::awaitable<void> session(boost::beast::tcp_stream stream, std::string source);
  net::awaitable<void> refuse(boost::beast::tcp_stream stream, http::status status,
                              std::string why);

  net::io_context io_{1};
  HttpLimits limits_;
  Handler handler_;
  std::unique_ptr<net::ip::tcp::acceptor> acceptor_;
  uint16_t port_ = 0;
  int connections_ = 0;
  std::map<std::string, int> per_source_;
};

// A plain response: status, content type and body (keep-alive as the request asked).
Response respond(const Request& req, http::status status, std::string content_type,
                 std::string body);

}  // namespace tandem::serve
