// The channel against a hand-driven peer that completes the handshake and then misbehaves:
// goes silent, closes, or sends frames that were not sealed with the session key.
#include "targets/runtime/channel.h"

#include <gtest/gtest.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <future>

#include "core/error.h"
#include "targets/runtime/handshake.h"
#include "tests/test_util.h"

namespace tandem::runtime {
namespace {

using namespace std::chrono_literals;
namespace asio = boost::asio;
using asio::ip::tcp;
using testing::expectThrowWith;

// The server side of the handshake done by hand on a blocking socket, then left to the
// test: it neither sends heartbeats nor reads.
class HandServer {
 public:
  HandServer() : acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {}
  Endpoint endpoint() const { return {"127.0.0.1", acceptor_.local_endpoint().port()}; }

  // Accepts one client and answers its handshake with `key`.
  void handshake(const ClusterKey& key) {
    socket_ = std::make_unique<tcp::socket>(acceptor_.accept());
    const Hello client = std::get<Hello>(decodeMessage(readFrame()));
    Hello mine{kProtocolVersion, "hand", {}};
    mine.nonce.fill(5);
    writeFrame(encodeMessage(mine));
    decodeMessage(readFrame());  // the client's proof (the test trusts it)
    writeFrame(encodeMessage(Proof{handshakeProof(key, Side::kServer, client, mine)}));
  }
  void writeFrame(const std::vector<uint8_t>& body) {
    std::vector<uint8_t> f = {static_cast<uint8_t>(body.size()),
                              static_cast<uint8_t>(body.size() >> 8), 0, 0};
    f.insert(f.end(), body.begin(), body.end());
    asio::write(*socket_, asio::buffer(f));
  }
  void close() { socket_->close(); }

 private:
  std::vector<uint8_t> readFrame() {
    uint8_t h[4];
    asio::read(*socket_, asio::buffer(h));
    std::vector<uint8_t> body(h[0] | h[1] << 8);
    asio::read(*socket_, asio::buffer(body));
    return body;
  }
  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::unique_ptr<tcp::socket> socket_;
};

HandshakeOptions fastHeartbeats() {
  HandshakeOptions o;
  o.channel.heartbeat = 50ms;
  o.channel.strikes = 3;
  return o;
}

std::unique_ptr<Channel> connectTo(HandServer& server, const ClusterKey& key,
                                   const HandshakeOptions& o) {
  auto client =
      std::async(std::launch::async, [&] { return connectChannel(server.endpoint(), key, o); });
  server.handshake(key);
  return client.get();
}

TEST(ChannelTest, APeerThatFallsSilentIsDeclaredGoneAfterItsStrikes) {
  const ClusterKey key = generateClusterKey();
  HandServer server;
  std::unique_ptr<Channel> c = connectTo(server, key, fastHeartbeats());
  // The hand server never sends a heartbeat: within 3 x 50 ms (plus a tick) the channel
  // ends. The bound here only keeps a broken build from waiting forever.
  const auto start = std::chrono::steady_clock::now();
  expectThrowWith<IoError>(
      [&] {
        while (std::chrono::steady_clock::now() - start < 10s) c->recv(100ms);
      },
      {"no word from 127.0.0.1:", "3 heartbeats of 50 ms missed"});
  EXPECT_NE(c->failure().find("heartbeats"), std::string::npos);
}

TEST(ChannelTest, APeerThatClosesIsNoticedAtOnce) {
  const ClusterKey key = generateClusterKey();
  HandServer server;
  HandshakeOptions o;
  o.channel.heartbeat = 60s;  // so only the closed connection can end it
  std::unique_ptr<Channel> c = connectTo(server, key, o);
  server.close();
  expectThrowWith<IoError>([&] { c->recv(10s); }, {"closed the connection"});
  expectThrowWith<IoError>([&] { c->send(Ping{}); }, {"has ended"});
}

TEST(ChannelTest, AFrameNotSealedWithTheSessionKeyEndsTheChannel) {
  const ClusterKey key = generateClusterKey();
  HandServer server;
  HandshakeOptions o;
  o.channel.heartbeat = 60s;
  std::unique_ptr<Channel> c = connectTo(server, key, o);
  // A well-formed message in a frame whose "tag" is made up: what an attacker on the
  // path who does not hold the session key can inject.
  std::vector<uint8_t> forged = encodeMessage(Leave{"forged"});
  forged.resize(forged.size() + 16, 0);
  server.writeFrame(forged);
  expectThrowWith<IoError>([&] { c->recv(10s); }, {"failed authentication"});
}

TEST(ChannelTest, AnOversizedFrameEndsTheChannel) {
  const ClusterKey key = generateClusterKey();
  HandServer server;
  HandshakeOptions o;
  o.channel.heartbeat = 60s;
  o.channel.max_message_bytes = 100;
  std::unique_ptr<Channel> c = connectTo(server, key, o);
  server.writeFrame(std::vector<uint8_t>(1000, 1));
  expectThrowWith<IoError>([&] { c->recv(10s); }, {"frame of 1000 bytes", "limit is 100"});
  expectThrowWith<InvalidArgument>([&] { c->sendBytes(std::vector<uint8_t>(101, 1)); },
                                   {"101 bytes exceeds the limit of 100"});
}

}  // namespace
}  // namespace tandem::runtime
