#include "targets/runtime/listener.h"

#include "core/error.h"
#include "targets/runtime/channel_io.h"

namespace tandem::runtime {

namespace asio = boost::asio;
using asio::ip::tcp;

struct Listener::Impl {
  Impl(const std::string& listen, const ClusterKey& k, const HandshakeOptions& o)
      : key(k), options(o), acceptor(io) {
    const Endpoint at = parseEndpoint(listen, /*allow_any_port=*/true);
    boost::system::error_code ec;
    const asio::ip::address address = asio::ip::make_address(at.host, ec);
    if (ec) throw IoError("cannot listen on " + at.str() + ": not an IP address");
    const tcp::endpoint e(address, at.port);
    acceptor.open(e.protocol(), ec);
    if (!ec) acceptor.bind(e, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) throw IoError("cannot listen on " + at.str() + ": " + ec.message());
  }

  ClusterKey key;
  HandshakeOptions options;
  asio::io_context io;
  tcp::acceptor acceptor;
};

Listener::Listener(const std::string& listen, const ClusterKey& key,
                   const HandshakeOptions& options)
    : impl_(std::make_unique<Impl>(listen, key, options)) {}

Listener::~Listener() = default;

Endpoint Listener::endpoint() const {
  const tcp::endpoint e = impl_->acceptor.local_endpoint();
  return {e.address().to_string(), e.port()};
}

std::unique_ptr<Channel> Listener::accept(std::chrono::milliseconds timeout) {
  auto conn_io = std::make_unique<asio::io_context>();
  std::optional<tcp::socket> accepted;
  boost::system::error_code error;
  impl_->acceptor.async_accept(*conn_io, [&](boost::system::error_code ec, tcp::socket s) {
    error = ec;
    if (!ec) accepted.emplace(std::move(s));
  });
  impl_->io.restart();
  impl_->io.run_for(timeout);
  if (!accepted && !error) {  // the deadline: take the pending accept back
    impl_->acceptor.cancel();
    impl_->io.restart();
    impl_->io.run();
  }
  if (!accepted) {
    if (!error || error == asio::error::operation_aborted) return nullptr;
    throw IoError("accepting a connection on " + endpoint().str() + " failed: " + error.message());
  }
  return acceptChannel(std::move(conn_io), std::move(*accepted), impl_->key, impl_->options);
}

}  // namespace tandem::runtime
