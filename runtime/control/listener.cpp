#include "runtime/control/listener.h"

#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "runtime/control/admission.h"
#include "runtime/control/channel_io.h"

namespace tandem::runtime {

namespace asio = boost::asio;
using asio::ip::tcp;

struct Listener::Impl {
  Impl(const std::string& listen, const ClusterKey& k, const HandshakeOptions& o,
       AdmissionOptions a)
      : key(k),
        options(o),
        acceptor(io),
        admission(io, withTimeout(a, o), "the run's listener",
                  [this](std::unique_ptr<asio::io_context> conn_io, tcp::socket s,
                         std::shared_ptr<Admission::Ticket> t) {
                    startHandshake(std::move(conn_io), std::move(s), std::move(t));
                  }) {
    const Endpoint at = parseEndpoint(listen, /*allow_any_port=*/true);
    boost::system::error_code ec;
    const asio::ip::address address = asio::ip::make_address(at.host, ec);
    if (ec) throw IoError("cannot listen on " + at.str() + ": not an IP address");
    const tcp::endpoint e(address, at.port);
    acceptor.open(e.protocol(), ec);
    if (!ec) acceptor.bind(e, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) throw IoError("cannot listen on " + at.str() + ": " + ec.message());
    admission.acceptFrom(acceptor);
    io_thread = std::thread([this] { io.run(); });
  }

  ~Impl() {
    asio::post(io, [this] {
      stopping = true;
      boost::system::error_code ignored;
      acceptor.close(ignored);
      admission.stop();  // waiting connections closed, handshakes in progress shut down
    });
    io_thread.join();
    for (Handshake& h : handshakes) h.thread.join();
  }

  static AdmissionOptions withTimeout(AdmissionOptions a, const HandshakeOptions& o) {
    a.hello_timeout = o.timeout;
    return a;
  }

  // A connection that holds a handshake slot: its handshake on a thread of its own, so
  // that a slow or silent peer holds up no other. On the io thread.
  void startHandshake(std::unique_ptr<asio::io_context> conn_io, tcp::socket moved,
                      std::shared_ptr<Admission::Ticket> ticket) {
    handshakes.remove_if([](Handshake& h) {
      if (!h.done) return false;
      h.thread.join();
      return true;
    });
    if (stopping) {
      // Closed here: the parameters may go in any order, and an open socket must not
      // outlive its io_context.
      boost::system::error_code ignored;
      moved.close(ignored);
      return;
    }
    Handshake& h = handshakes.emplace_back();
    h.thread = std::thread([this, &h, conn_io = std::move(conn_io), s = std::move(moved),
                            t = std::move(ticket)]() mutable {
      try {
        HandshakeOptions o = options;
        o.on_hello = [&t] { t->hello(); };
        std::unique_ptr<Channel> c = acceptChannel(std::move(conn_io), std::move(s), key, o);
        t->settle();
        {
          std::lock_guard lock(mu);
          ready.push_back(std::move(c));
        }
        ready_cv.notify_all();
      } catch (const std::exception& e) {
        t->settle();
        admission.refused(e.what(), t->evicted());
      }
      t.reset();
      h.done = true;
    });
  }

  struct Handshake {
    std::thread thread;
    std::atomic<bool> done{false};
  };

  ClusterKey key;
  HandshakeOptions options;
  asio::io_context io;
  tcp::acceptor acceptor;
  Admission admission;
  bool stopping = false;            // io thread only
  std::list<Handshake> handshakes;  // io thread only (and the destructor, after it)
  std::mutex mu;                    // ready
  std::condition_variable ready_cv;
  std::deque<std::unique_ptr<Channel>> ready;  // authenticated, not yet taken
  std::thread io_thread;
};

Listener::Listener(const std::string& listen, const ClusterKey& key,
                   const HandshakeOptions& options, AdmissionOptions admission)
    : impl_(std::make_unique<Impl>(listen, key, options, admission)) {}

Listener::~Listener() = default;

Endpoint Listener::endpoint() const {
  boost::system::error_code ec;
  const tcp::endpoint e = impl_->acceptor.local_endpoint(ec);
  return {e.address().to_string(), e.port()};
}

std::unique_ptr<Channel> Listener::accept(std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->mu);
  if (!impl_->ready_cv.wait_for(lock, timeout, [&] { return !impl_->ready.empty(); }))
    return nullptr;
  std::unique_ptr<Channel> c = std::move(impl_->ready.front());
  impl_->ready.pop_front();
  return c;
}

AdmissionStats Listener::stats() const { return impl_->admission.stats(); }

}  // namespace tandem::runtime
