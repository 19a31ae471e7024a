// The channel against a hand-driven peer that completes the handshake and then misbehaves:
// goes silent, closes, or sends frames that were not sealed with the session key.
#include "runtime/control/channel.h"

#include <gtest/gtest.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <future>
#include <thread>

#include "core/error.h"
#include "runtime/control/handshake.h"
#include "runtime/control/listener.h"
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

// Two live channels that say nothing for 10 of their strike windows stay up: each side's
// heartbeats reach the other well inside the window (a false alarm would end them), and
// messages then pass both ways.
TEST(ChannelTest, HeartbeatsKeepAQuietChannelAlive) {
  const ClusterKey key = generateClusterKey();
  HandshakeOptions o;
  o.channel.heartbeat = 100ms;
  o.channel.strikes = 3;
  Listener listener("127.0.0.1:0", key, o);
  auto client =
      std::async(std::launch::async, [&] { return connectChannel(listener.endpoint(), key, o); });
  std::unique_ptr<Channel> server = listener.accept(5s);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Channel> c = client.get();
  EXPECT_FALSE(c->recv(3s).has_value());  // nothing but heartbeats for 3 s
  EXPECT_FALSE(server->recv(10ms).has_value());
  EXPECT_EQ(c->failure(), "");
  EXPECT_EQ(server->failure(), "");
  c->send(Leave{"from the client"});
  const std::optional<Message> got = server->recv(5s);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(std::get<Leave>(*got).reason, "from the client");
  server->send(Leave{"from the server"});
  const std::optional<Message> back = c->recv(5s);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(std::get<Leave>(*back).reason, "from the server");
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

// A peer that sends faster than the channel's reader takes fills the receive queue only
// to its byte limit (then TCP pushes back on the peer), and nothing is lost.
TEST(ChannelTest, TheReceiveQueueHoldsNoMoreThanItsBytes) {
  const ClusterKey key = generateClusterKey();
  HandshakeOptions o;
  o.channel.max_queued_bytes = size_t{2} << 20;
  Listener listener("127.0.0.1:0", key, o);
  auto client = std::async(std::launch::async, [&] {
    return connectChannel(listener.endpoint(), key, HandshakeOptions{});
  });
  std::unique_ptr<Channel> server = listener.accept(10s);
  ASSERT_TRUE(server);
  std::unique_ptr<Channel> c = client.get();
  constexpr int kMessages = 24;
  constexpr int64_t kBytes = int64_t{1} << 20;
  constexpr size_t kSize = size_t{1} << 20;
  for (int i = 0; i < kMessages; ++i)
    c->send(WeightsChunk{std::string(64, 'a'), static_cast<int64_t>(i) * kBytes, kMessages * kBytes,
                         std::vector<uint8_t>(kSize, static_cast<uint8_t>(i))},
            10s);
  // Let the frames that can arrive arrive: the queue stops at its limit plus one message.
  // (Up to 5 s for it to fill on a loaded machine, then a while longer to see it stay.)
  size_t most = 0;
  for (int i = 0, after = 0; i < 200 && after < 10; ++i) {
    std::this_thread::sleep_for(25ms);
    most = std::max(most, server->queuedBytes());
    if (most >= o.channel.max_queued_bytes) ++after;
  }
  EXPECT_GE(most, o.channel.max_queued_bytes);  // it did fill up to the limit
  EXPECT_LT(most, o.channel.max_queued_bytes + 2 * kSize);
  for (int i = 0; i < kMessages; ++i) {
    const std::optional<Message> m = server->recv(10s);
    ASSERT_TRUE(m) << i;
    const auto* chunk = std::get_if<WeightsChunk>(&*m);
    ASSERT_TRUE(chunk) << i;
    EXPECT_EQ(chunk->offset, static_cast<int64_t>(i) * kBytes);
    ASSERT_EQ(chunk->bytes.size(), kSize);
    EXPECT_EQ(chunk->bytes.front(), static_cast<uint8_t>(i));
    EXPECT_LT(server->queuedBytes(), o.channel.max_queued_bytes + 2 * kSize);
  }
  EXPECT_EQ(server->queuedBytes(), 0u);
}

}  // namespace
}  // namespace tandem::runtime
