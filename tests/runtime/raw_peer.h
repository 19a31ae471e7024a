// A control-protocol peer that follows no rules: the tests speak the handshake by hand
// through it (right, wrong, replayed, malformed) and read back what the other side says.
// Plain Boost.Asio blocking calls; every read gives up after 10 s, so a test that waits
// for an answer that never comes fails instead of hanging.
#pragma once

#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/endpoint.h"
#include "runtime/control/messages.h"

namespace tandem::testing {

class RawPeer {
 public:
  explicit RawPeer(const Endpoint& to) : socket_(io_) {
    boost::asio::ip::tcp::resolver resolver(io_);
    boost::asio::connect(socket_, resolver.resolve(to.host, std::to_string(to.port)));
    timeval tv{10, 0};
    ::setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }

  // One frame holding `bytes` (its length said as `claimed` when given).
  void writeFrame(const std::vector<uint8_t>& bytes, std::optional<uint32_t> claimed = {}) {
    const uint32_t len = claimed.value_or(static_cast<uint32_t>(bytes.size()));
    std::vector<uint8_t> frame = {static_cast<uint8_t>(len), static_cast<uint8_t>(len >> 8),
                                  static_cast<uint8_t>(len >> 16), static_cast<uint8_t>(len >> 24)};
    frame.insert(frame.end(), bytes.begin(), bytes.end());
    boost::system::error_code ignored;
    boost::asio::write(socket_, boost::asio::buffer(frame), ignored);
  }
  void write(const runtime::Message& m) { writeFrame(runtime::encodeMessage(m)); }

  // The next clear frame's bytes; nullopt if the peer closed (or 10 s passed).
  std::optional<std::vector<uint8_t>> readFrame() {
    uint8_t header[4];
    boost::system::error_code ec;
    boost::asio::read(socket_, boost::asio::buffer(header), ec);
    if (ec) return std::nullopt;
    const uint32_t len =
        header[0] | header[1] << 8 | header[2] << 16 | static_cast<uint32_t>(header[3]) << 24;
    if (len > (1u << 20)) return std::nullopt;
    std::vector<uint8_t> body(len);
    boost::asio::read(socket_, boost::asio::buffer(body), ec);
    if (ec) return std::nullopt;
    return body;
  }
  std::optional<runtime::Message> read() {
    const auto bytes = readFrame();
    if (!bytes) return std::nullopt;
    return runtime::decodeMessage(*bytes);
  }
  // True once the peer has closed the connection (reads end).
  bool closedByPeer() {
    uint8_t byte;
    boost::system::error_code ec;
    for (int i = 0; i < 1 << 20 && !ec; ++i) socket_.read_some(boost::asio::buffer(&byte, 1), ec);
    return ec == boost::asio::error::eof || ec == boost::asio::error::connection_reset;
  }

 private:
  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_;
};

}  // namespace tandem::testing
