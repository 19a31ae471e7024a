#include "serve/http_server.h"

#include <spdlog/spdlog.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include "core/error.h"

namespace tandem::serve {

namespace beast = boost::beast;
using tcp = net::ip::tcp;
using boost::system::error_code;

void Waker::wake() {
  std::lock_guard lock(mu_);
  pending_ = true;
  if (timer_)
    net::post(timer_->get_executor(), [self = shared_from_this()] {
      std::lock_guard inner(self->mu_);
      if (self->timer_) self->timer_->cancel();
    });
}

Connection::~Connection() {
  *alive_ = false;
  if (waker_) {
    std::lock_guard lock(waker_->mu_);
    waker_->timer_ = nullptr;
  }
  if (watching_) {
    error_code ec;
    stream_.socket().cancel(ec);  // the watch's wait (nothing else is pending now)
  }
}

std::string Connection::peer() const {
  error_code ec;
  const tcp::endpoint e = stream_.socket().remote_endpoint(ec);
  return ec ? "a client" : e.address().to_string() + ":" + std::to_string(e.port());
}

net::awaitable<bool> Connection::write(const std::string& data) {
  if (gone_) co_return false;
  error_code ec;
  stream_.expires_after(limits_.write_timeout);
  co_await net::async_write(stream_, net::buffer(data),
                            net::redirect_error(net::use_awaitable, ec));
  stream_.expires_never();
  if (ec) gone_ = true;
  co_return !ec;
}

net::awaitable<bool> Connection::send(Response& r) {
  if (gone_) co_return false;
  r.prepare_payload();
  error_code ec;
  stream_.expires_after(limits_.write_timeout);
  co_await http::async_write(stream_, r, net::redirect_error(net::use_awaitable, ec));
  stream_.expires_never();
  if (ec) gone_ = true;
  co_return !ec;
}

net::awaitable<bool> Connection::beginEvents() {
  http::response<http::empty_body> r{http::status::ok, 11};
  r.set(http::field::content_type, "text/event-stream");
  r.set(http::field::cache_control, "no-cache");
  r.chunked(true);
  http::response_serializer<http::empty_body> sr{r};
  error_code ec;
  stream_.expires_after(limits_.write_timeout);
  co_await http::async_write_header(stream_, sr, net::redirect_error(net::use_awaitable, ec));
  stream_.expires_never();
  if (ec) gone_ = true;
  co_return !ec;
}

namespace {

std::string chunk(std::string_view data) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return std::string(size) + std::string(data) + "\r\n";
}

}  // namespace

net::awaitable<bool> Connection::event(std::string_view data) {
  const std::string framed = chunk("data: " + std::string(data) + "\n\n");
  co_return co_await write(framed);
}

net::awaitable<bool> Connection::endEvents() {
  const std::string last = "0\r\n\r\n";
  co_return co_await write(last);
}

std::shared_ptr<Waker> Connection::waker() {
  if (!waker_) waker_ = std::make_shared<Waker>();
  return waker_;
}

net::awaitable<void> Connection::watch(std::shared_ptr<bool> alive) {
  error_code ec;
  co_await stream_.socket().async_wait(tcp::socket::wait_read,
                                       net::redirect_error(net::use_awaitable, ec));
  if (!*alive) co_return;  // the request was answered; the connection goes on
  if (ec || stream_.socket().available(ec) == 0 || ec) {
    // Readable with nothing to read: the client closed (or reset) its side.
    gone_ = true;
    if (timer_) timer_->cancel();
  }
  // Else the client sent its next request already: it is read once this one is done.
}

net::awaitable<void> Connection::wait() {
  if (gone_) co_return;
  auto w = waker();
  if (!timer_) timer_ = std::make_unique<net::steady_timer>(stream_.get_executor());
  {
    std::lock_guard lock(w->mu_);
    if (w->pending_) {
      w->pending_ = false;
      co_return;
    }
    w->timer_ = timer_.get();
  }
  if (!watching_) {
    watching_ = true;
    net::co_spawn(stream_.get_executor(), watch(alive_), net::detached);
  }
  timer_->expires_at(net::steady_timer::time_point::max());
  error_code ec;
  co_await timer_->async_wait(net::redirect_error(net::use_awaitable, ec));
  std::lock_guard lock(w->mu_);
  w->timer_ = nullptr;
  w->pending_ = false;
}

Response respond(const Request& req, http::status status, std::string content_type,
                 std::string body) {
  Response r{status, req.version()};
  r.set(http::field::server, "tandem");
  r.set(http::field::content_type, content_type);
  r.keep_alive(req.keep_alive());
  r.body() = std::move(body);
  return r;
}

HttpServer::HttpServer(const std::string& host, uint16_t port, HttpLimits limits, Handler handler)
    : limits_(limits), handler_(std::move(handler)) {
  error_code ec;
  const net::ip::address address =
      net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  TANDEM_CHECK_MSG(!ec, InvalidArgument,
                   "'" << host << "' is not an IP address to listen on (" << ec.message() << ")");
  acceptor_ = std::make_unique<tcp::acceptor>(io_);
  const tcp::endpoint at(address, port);
  acceptor_->open(at.protocol(), ec);
  if (!ec) acceptor_->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_->bind(at, ec);
  if (!ec) acceptor_->listen(net::socket_base::max_listen_connections, ec);
  TANDEM_CHECK_MSG(!ec, IoError,
                   "cannot listen on " << host << ":" << port << ": " << ec.message());
  port_ = acceptor_->local_endpoint().port();
  net::co_spawn(io_, accept(), net::detached);
}

HttpServer::~HttpServer() = default;

void HttpServer::run() { io_.run(); }

void HttpServer::stop() { io_.stop(); }

net::awaitable<void> HttpServer::accept() {
  net::steady_timer pause(io_);
  for (;;) {
    error_code ec;
    tcp::socket socket =
        co_await acceptor_->async_accept(net::redirect_error(net::use_awaitable, ec));
    if (ec == net::error::operation_aborted) co_return;
    if (ec) {  // out of descriptors, say: wait a little rather than spin
      spdlog::warn("serve: accepting a connection: {}", ec.message());
      pause.expires_after(std::chrono::milliseconds(50));
      co_await pause.async_wait(net::redirect_error(net::use_awaitable, ec));
      continue;
    }
    const tcp::endpoint from = socket.remote_endpoint(ec);
    if (ec) continue;
    std::string source = from.address().to_string();
    beast::tcp_stream stream(std::move(socket));
    if (connections_ >= limits_.max_connections) {
      net::co_spawn(
          io_,
          refuse(std::move(stream), http::status::service_unavailable,
                 "the server holds " + std::to_string(connections_) + " connections, its most"),
          net::detached);
    } else if (per_source_[source] >= limits_.max_per_source) {
      net::co_spawn(io_,
                    refuse(std::move(stream), http::status::too_many_requests,
                           source + " holds " + std::to_string(per_source_[source]) +
                               " connections, the most one address may"),
                    net::detached);
    } else {
      ++connections_;
      ++per_source_[source];
      net::co_spawn(io_, session(std::move(stream), std::move(source)), net::detached);
    }
  }
}

namespace {

// An OpenAI-style error body (serve/completion.h's shape, without its dependencies).
std::string errorJson(std::string_view message, std::string_view type) {
  std::string m;
  for (const char c : message) {
    if (c == '"' || c == '\\') {
      m += '\\';
      m += c;
    } else if (static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7F) {
      m += c;
    }
  }
  return "{\"error\":{\"message\":\"" + m + "\",\"type\":\"" + std::string(type) +
         "\",\"param\":null,\"code\":null}}";
}

}  // namespace

net::awaitable<void> HttpServer::refuse(beast::tcp_stream stream, http::status status,
                                        std::string why) {
  Response r{status, 11};
  r.set(http::field::content_type, "application/json");
  r.set(http::field::retry_after, "1");
  r.keep_alive(false);
  r.body() = errorJson(why, "server_busy");
  r.prepare_payload();
  error_code ec;
  stream.expires_after(std::chrono::seconds(1));
  co_await http::async_write(stream, r, net::redirect_error(net::use_awaitable, ec));
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
}

net::awaitable<void> HttpServer::session(beast::tcp_stream stream, std::string source) {
  struct Counted {  // this connection, counted until it ends
    HttpServer& s;
    std::string source;
    ~Counted() {
      --s.connections_;
      if (--s.per_source_[source] == 0) s.per_source_.erase(source);
    }
  } counted{*this, source};
  beast::flat_buffer buffer;
  for (bool first = true;; first = false) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(static_cast<uint32_t>(limits_.max_header));
    parser.body_limit(limits_.max_body);
    // The request's time runs on a timer of its own, not the stream's (a stream that times
    // out closes its socket, and a slow client is owed its 408).
    auto reading = std::make_shared<bool>(true);
    auto timed_out = std::make_shared<bool>(false);
    net::steady_timer deadline(io_);
    deadline.expires_after(first ? limits_.request_timeout : limits_.idle_timeout);
    deadline.async_wait([&stream, reading, timed_out](error_code e) {
      if (e || !*reading) return;
      *timed_out = true;
      error_code ignored;
      stream.socket().cancel(ignored);
    });
    error_code ec;
    co_await http::async_read_header(stream, buffer, parser,
                                     net::redirect_error(net::use_awaitable, ec));
    if (!ec && parser.get()[http::field::expect] == "100-continue" && !parser.is_done()) {
      co_await net::async_write(stream,
                                net::buffer(std::string_view("HTTP/1.1 100 Continue\r\n\r\n")),
                                net::redirect_error(net::use_awaitable, ec));
    }
    if (!ec && !parser.is_done())
      co_await http::async_read(stream, buffer, parser,
                                net::redirect_error(net::use_awaitable, ec));
    *reading = false;
    deadline.cancel();
    if (*timed_out && ec == net::error::operation_aborted) ec = beast::error::timeout;
    if (ec) {
      http::status status = http::status::bad_request;
      std::string why = "malformed request: " + ec.message();
      if (ec == http::error::end_of_stream || ec == net::error::eof ||
          ec == net::error::connection_reset || ec == net::error::operation_aborted)
        break;  // the client closed, or the server stops
      if (ec == beast::error::timeout) {
        if (buffer.size() == 0 && !parser.got_some()) break;  // an idle connection
        status = http::status::request_timeout;
        why = "the request did not arrive within " +
              std::to_string(limits_.request_timeout.count()) + " ms";
      } else if (ec == http::error::body_limit) {
        status = http::status::payload_too_large;
        why = "the body is over " + std::to_string(limits_.max_body) + " bytes";
      } else if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
        status = http::status::request_header_fields_too_large;
        why = "the header is over " + std::to_string(limits_.max_header) + " bytes";
      }
      Response r{status, 11};
      r.set(http::field::content_type, "application/json");
      r.keep_alive(false);
      r.body() = errorJson(why, "invalid_request_error");
      r.prepare_payload();
      stream.expires_after(limits_.write_timeout);
      co_await http::async_write(stream, r, net::redirect_error(net::use_awaitable, ec));
      break;
    }
    stream.expires_never();
    Request req = parser.release();
    bool keep = false;
    try {
      Connection c(stream, limits_);
      keep = co_await handler_(req, c);
      keep = keep && req.keep_alive() && !c.clientGone();
    } catch (const std::exception& e) {  // a handler's fault: this connection only
      spdlog::error("serve: {} {} from {}: {}", std::string(req.method_string()),
                    std::string(req.target()), source, e.what());
    }
    if (!keep) break;
  }
  error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
}

}  // namespace tandem::serve
