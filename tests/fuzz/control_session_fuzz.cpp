// libFuzzer target for a control session as the accepting side sees it (a daemon, a
// coordinator's listener): the handshake on an accepted connection, then sealed frames
// read as control messages. The first byte picks what the peer does:
//   even: it writes the rest as raw bytes before any handshake (hellos, proofs, frames of
//         any length) and stops writing;
//   odd:  it completes the handshake with the key, then sends the rest as sealed frames,
//         each a 2-byte little-endian length and that many bytes (any content: the
//         accepting side must decode or refuse each), and closes.
// The accepting side must end every session with a tandem Error (refused, closed, a bad
// message) and never crash, hang or raise anything else.
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/control/channel_io.h"
#include "runtime/control/handshake.h"

namespace {

using namespace std::chrono_literals;
using namespace tandem::runtime;
namespace asio = boost::asio;
using asio::ip::tcp;

struct Fixture {
  Fixture() : acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    key.bytes.fill(0x5a);
    options.timeout = 1s;  // a peer that stops mid-frame has closed its side: no wait
    options.build = "fuzz";
  }
  asio::io_context io;
  tcp::acceptor acceptor;
  ClusterKey key;
  HandshakeOptions options;
};

// The accepting side of one session: every message read until the channel ends.
void serve(Fixture& f) {
  try {
    auto conn_io = std::make_unique<asio::io_context>();
    tcp::socket accepted = f.acceptor.accept(*conn_io);
    std::unique_ptr<Channel> c =
        acceptChannel(std::move(conn_io), std::move(accepted), f.key, f.options);
    for (;;) {
      try {
        c->recv(2s);
      } catch (const tandem::FormatError&) {  // a bad message: the channel lives on
      }
    }
  } catch (const tandem::Error&) {  // refused, closed, timed out: the session is over
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture f;
  if (size == 0) return 0;
  const tandem::Endpoint at{"127.0.0.1", f.acceptor.local_endpoint().port()};
  std::thread server([] { serve(f); });
  if ((data[0] & 1) == 0) {
    asio::io_context io;
    tcp::socket s(io);
    boost::system::error_code ec;
    s.connect(tcp::endpoint(asio::ip::make_address(at.host), at.port), ec);
    if (!ec) {
      asio::write(s, asio::buffer(data + 1, size - 1), ec);
      s.shutdown(tcp::socket::shutdown_send, ec);
      // Until the accepting side has ended the session (it closes the connection).
      uint8_t sink[256];
      while (!ec) s.read_some(asio::buffer(sink), ec);
    }
  } else {
    try {
      std::unique_ptr<Channel> c = connectChannel(at, f.key, f.options);
      for (size_t i = 1; i + 2 <= size;) {
        const size_t len = std::min<size_t>(data[i] | data[i + 1] << 8, size - i - 2);
        c->sendBytes(std::span<const uint8_t>(data + i + 2, len), 2s);
        i += 2 + len;
      }
      c->close(2s);
    } catch (const tandem::Error&) {  // the accepting side may end it first
    }
  }
  server.join();
  return 0;
}
