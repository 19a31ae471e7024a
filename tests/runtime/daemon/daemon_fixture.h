// The daemon's server in this process, on a free loopback port, for the daemon's tests
// and the node profile's: a fixture that starts and stops it, and clients that talk to it.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "core/error.h"
#include "runtime/daemon/daemon.h"
#include "runtime/node/node_info.h"
#include "tests/runtime/raw_peer.h"

namespace tandem::runtime {

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override { start(DaemonOptions{}); }
  void TearDown() override { finish(); }

  void start(DaemonOptions o) {
    o.listen = "127.0.0.1:0";
    o.key = key_;
    o.name = "alpha";
    daemon_ = std::make_unique<Daemon>(o);
    runner_ = std::thread([this] { daemon_->run(); });
  }
  void finish() {
    daemon_->stop();
    runner_.join();
  }

  HandshakeOptions options() const {
    HandshakeOptions o;
    o.build = "test client";
    o.timeout = std::chrono::seconds(5);
    return o;
  }

  // A good client: connects, reads the node info, pings once, leaves.
  void expectServed() {
    std::unique_ptr<Channel> c = connectChannel(daemon_->endpoint(), key_, options());
    const std::optional<Message> info = c->recv(std::chrono::seconds(5));
    ASSERT_TRUE(info.has_value());
    ASSERT_TRUE(std::holds_alternative<NodeInfo>(*info)) << messageName(*info);
    EXPECT_EQ(std::get<NodeInfo>(*info).name, "alpha");
    EXPECT_EQ(estimateClock(*c, 1).rounds, 1);
    c->send(Leave{"test over"});
    c->close();
  }

  // Speaks the handshake by hand with this nonce and proof; returns the daemon's hello.
  Hello handHello(testing::RawPeer& raw, const Hello& mine) {
    raw.write(mine);
    const std::optional<Message> m = raw.read();
    EXPECT_TRUE(m && std::holds_alternative<Hello>(*m));
    return m && std::holds_alternative<Hello>(*m) ? std::get<Hello>(*m) : Hello{};
  }

  // The daemon anew with its profile cache in `cache_dir`, and a client past its node info.
  std::unique_ptr<Channel> restartWithCache(const std::string& cache_dir) {
    finish();
    DaemonOptions o;
    o.cache_dir = cache_dir;
    start(o);
    std::unique_ptr<Channel> c = connectChannel(daemon_->endpoint(), key_, options());
    if (!c->recv(std::chrono::seconds(10))) throw Timeout("no node info within 10 s");
    return c;
  }

  // The daemon counts a refusal just after it has closed the connection: wait for it.
  uint64_t refusedSoon(uint64_t expected) {
    for (int i = 0; i < 200 && daemon_->stats().refused < expected; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return daemon_->stats().refused;
  }

  ClusterKey key_ = generateClusterKey();
  std::unique_ptr<Daemon> daemon_;
  std::thread runner_;
};

// The next message that is not a heartbeat's kind: the first within 10 s.
inline Message next(Channel& c) {
  const std::optional<Message> m = c.recv(std::chrono::seconds(10));
  if (!m) throw Timeout("no message within 10 s");
  return *m;
}

}  // namespace tandem::runtime
