// The daemon's server in this process, on a free loopback port, against good clients,
// clients without the key, replayed and malformed handshakes, and other versions. After
// each bad one a good client must still be served.
#include "runtime/daemon/daemon.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "core/error.h"
#include "core/model_spec.h"
#include "runtime/control/listener.h"
#include "runtime/node/node_info.h"
#include "runtime/node/node_profile.h"
#include "tests/runtime/daemon/daemon_fixture.h"
#include "tests/runtime/flood.h"
#include "tests/runtime/raw_peer.h"
#include "tests/test_util.h"

namespace tandem::runtime {
namespace {

using namespace std::chrono_literals;
using testing::expectThrowWith;
using testing::IdleFlood;
using testing::RawPeer;

TEST_F(DaemonTest, AGoodClientLearnsTheNodeAndItsClock) {
  std::unique_ptr<Channel> c = connectChannel(daemon_->endpoint(), key_, options());
  EXPECT_EQ(c->peerHello().version, kProtocolVersion);
  const std::optional<Message> m = c->recv(5s);
  ASSERT_TRUE(m && std::holds_alternative<NodeInfo>(*m));
  const NodeInfo& info = std::get<NodeInfo>(*m);
  EXPECT_EQ(info.build, buildName());
  EXPECT_GT(info.cpus, 0);
  EXPECT_GT(info.memory_bytes, 0);
  ASSERT_FALSE(info.devices.empty());
  EXPECT_EQ(info.devices.front().id, "cpu");
  const ClockEstimate clock = estimateClock(*c, 5);
  EXPECT_GE(clock.rtt_s, 0);
  // One machine, one clock: the offset is within a round trip of zero.
  EXPECT_LE(std::abs(clock.offset_s), clock.rtt_s + 0.05);
  c->send(Leave{"done"});
  c->close();
  EXPECT_EQ(daemon_->stats().accepted, 1u);
}

TEST_F(DaemonTest, AClientWithTheWrongKeyIsRefusedAndLearnsNothing) {
  expectThrowWith<HandshakeRefused>(
      [&] { connectChannel(daemon_->endpoint(), generateClusterKey(), options()); },
      {"refused us (authentication failed)", "does not match this cluster's key"});
  EXPECT_EQ(refusedSoon(1), 1u);
  expectServed();
}

TEST_F(DaemonTest, ADaemonWithAnotherKeyIsNotTrustedByTheClient) {
  // The client's key is right for nobody: it must not accept the daemon's proof either.
  // (Here the daemon refuses first; the client's own check is covered by the raw test
  // below, where a peer answers a proof with a proof made with another key.)
  RawPeer raw(daemon_->endpoint());
  Hello mine{kProtocolVersion, "raw", {}};
  mine.nonce.fill(3);
  const Hello theirs = handHello(raw, mine);
  raw.write(Proof{handshakeProof(generateClusterKey(), Side::kClient, mine, theirs)});
  const std::optional<Message> m = raw.read();
  ASSERT_TRUE(m && std::holds_alternative<Refused>(*m));
  EXPECT_EQ(std::get<Refused>(*m).reason, Refusal::kAuth);
  EXPECT_TRUE(raw.closedByPeer());
  expectServed();
}

TEST_F(DaemonTest, ARecordedHandshakeReplayedOnANewConnectionIsRefused) {
  Hello mine{kProtocolVersion, "raw", {}};
  mine.nonce.fill(9);
  Proof recorded;
  {
    RawPeer raw(daemon_->endpoint());
    const Hello theirs = handHello(raw, mine);
    recorded = Proof{handshakeProof(key_, Side::kClient, mine, theirs)};
    raw.write(recorded);
    const std::optional<Message> m = raw.read();
    ASSERT_TRUE(m && std::holds_alternative<Proof>(*m)) << "the genuine handshake must pass";
  }
  RawPeer replay(daemon_->endpoint());
  handHello(replay, mine);  // the same hello: the daemon answers with a fresh nonce
  replay.write(recorded);
  const std::optional<Message> m = replay.read();
  ASSERT_TRUE(m && std::holds_alternative<Refused>(*m));
  EXPECT_EQ(std::get<Refused>(*m).reason, Refusal::kAuth);
  EXPECT_TRUE(replay.closedByPeer());
  EXPECT_EQ(refusedSoon(1), 1u);
  expectServed();
}

TEST_F(DaemonTest, AnotherMajorVersionIsRefusedNamingBoth) {
  HandshakeOptions o = options();
  o.version = {static_cast<uint16_t>(kProtocolVersion.major + 1), 0, 0};
  expectThrowWith<HandshakeRefused>(
      [&] { connectChannel(daemon_->endpoint(), key_, o); },
      {"version mismatch", "control protocol " + kProtocolVersion.str(),
       "control protocol " + o.version.str(), "major versions must match"});
  // A newer minor version of the same major is welcome.
  o.version = {kProtocolVersion.major, static_cast<uint16_t>(kProtocolVersion.minor + 7), 0};
  std::unique_ptr<Channel> c = connectChannel(daemon_->endpoint(), key_, o);
  EXPECT_EQ(c->peerHello().version, kProtocolVersion);
  c->close();
  expectServed();
}

TEST_F(DaemonTest, MalformedAndOversizedFramesAreRefusedAndTheDaemonServesOn) {
  {  // an oversized length before authentication: refused without reading it
    RawPeer raw(daemon_->endpoint());
    raw.writeFrame({1, 2, 3}, 0xffffffffu);
    const std::optional<Message> m = raw.read();
    ASSERT_TRUE(m && std::holds_alternative<Refused>(*m));
    EXPECT_EQ(std::get<Refused>(*m).reason, Refusal::kBadMessage);
    EXPECT_NE(std::get<Refused>(*m).message.find("4294967295 bytes"), std::string::npos);
  }
  {  // garbage where the hello is due
    RawPeer raw(daemon_->endpoint());
    raw.writeFrame(std::vector<uint8_t>(40, 0x41));
    const std::optional<Message> m = raw.read();
    ASSERT_TRUE(m && std::holds_alternative<Refused>(*m));
    EXPECT_NE(std::get<Refused>(*m).message.find("expected a hello"), std::string::npos);
  }
  {  // another message where the hello is due: no skipping the challenge
    RawPeer raw(daemon_->endpoint());
    raw.write(Ping{1, 2});
    const std::optional<Message> m = raw.read();
    ASSERT_TRUE(m && std::holds_alternative<Refused>(*m));
    EXPECT_NE(std::get<Refused>(*m).message.find("got 'ping'"), std::string::npos);
  }
  {  // a hello, then a node info instead of the proof
    RawPeer raw(daemon_->endpoint());
    Hello mine{kProtocolVersion, "raw", {}};
    handHello(raw, mine);
    raw.write(NodeInfo{});
    const std::optional<Message> m = raw.read();
    ASSERT_TRUE(m && std::holds_alternative<Refused>(*m));
    EXPECT_NE(std::get<Refused>(*m).message.find("expected a proof, got 'node info'"),
              std::string::npos);
  }
  EXPECT_EQ(refusedSoon(4), 4u);
  expectServed();
}

TEST_F(DaemonTest, APeerThatSaysNothingIsDroppedAtTheHandshakesDeadline) {
  finish();
  DaemonOptions o;
  o.handshake.timeout = 300ms;
  start(o);
  RawPeer silent(daemon_->endpoint());
  expectServed();  // meanwhile others are served
  EXPECT_TRUE(silent.closedByPeer());
  EXPECT_EQ(refusedSoon(1), 1u);
}

TEST_F(DaemonTest, ABadMessageAfterTheHandshakeGetsAnErrorAndTheConnectionLives) {
  std::unique_ptr<Channel> c = connectChannel(daemon_->endpoint(), key_, options());
  ASSERT_TRUE(c->recv(5s).has_value());  // node info
  c->sendBytes(std::vector<uint8_t>(100, 0x7f));
  std::optional<Message> m = c->recv(5s);
  ASSERT_TRUE(m && std::holds_alternative<ErrorReply>(*m));
  EXPECT_NE(std::get<ErrorReply>(*m).message.find("bad control message"), std::string::npos);
  c->send(Hello{});  // valid, but not now
  m = c->recv(5s);
  ASSERT_TRUE(m && std::holds_alternative<ErrorReply>(*m));
  EXPECT_NE(std::get<ErrorReply>(*m).message.find("unexpected 'hello'"), std::string::npos);
  EXPECT_EQ(estimateClock(*c, 2).rounds, 2);  // still served
  EXPECT_EQ(daemon_->stats().bad_messages, 2u);
}

// A client with the key cannot make the daemon hold more than its frame limit at once: a
// 5 MiB frame (over the daemon's 4 MiB) ends that connection, and the next client is
// served. (How much a connection queues is ChannelTest's.)
TEST_F(DaemonTest, AFrameOverTheDaemonsLimitEndsOnlyThatConnection) {
  EXPECT_EQ(daemonHandshakeOptions().channel.max_message_bytes, size_t{4} << 20);
  EXPECT_EQ(daemonHandshakeOptions().channel.max_queued_bytes, size_t{8} << 20);
  std::unique_ptr<Channel> c = connectChannel(daemon_->endpoint(), key_, options());
  ASSERT_TRUE(c->recv(5s).has_value());  // node info
  c->sendBytes(std::vector<uint8_t>(size_t{5} << 20, 0x7f));
  // The daemon closes it (seen as closed, reset, or a write that fails, by timing).
  expectThrowWith<IoError>(
      [&] {
        for (int i = 0; i < 50; ++i) c->recv(100ms);
      },
      {daemon_->endpoint().str()});
  expectServed();
}

// A peer without the key holds 200 idle connections to the daemon, reopening each as the
// daemon drops it (after the handshake's timeout, 1 s here): a client with the key still
// gets node information on at least 19 of 20 tries within 5 s, while the flood goes on for
// several of those timeouts. With a waiting room smaller than the flood the oldest idle
// connections are closed to make room, and a client is still served after the flood.
TEST_F(DaemonTest, AFloodOfIdleConnectionsDoesNotLockOutAClientWithTheKey) {
  finish();
  DaemonOptions o;
  o.handshake.timeout = 1s;
  start(o);
  const Endpoint at = daemon_->endpoint();
  int served = 0;
  std::string last;
  uint64_t reopened = 0;
  {
    IdleFlood flood(at, 200);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) {
      try {
        std::unique_ptr<Channel> c = connectChannel(at, key_, options());
        const std::optional<Message> info = c->recv(5s);
        if (info && std::holds_alternative<NodeInfo>(*info)) ++served;
        c->send(Leave{"done"});
        c->close();
      } catch (const Error& e) {
        last = e.what();
      }
      // Spread over about 3 s: the flood's connections time out and come back meanwhile.
      std::this_thread::sleep_until(t0 + (i + 1) * 150ms);
    }
    reopened = flood.reopened();
  }
  EXPECT_GE(served, 19) << "last failure: " << last;
  EXPECT_GT(reopened, 0u) << "the daemon never dropped an idle connection";
  std::printf("served %d of 20 through a flood of 200 idle connections (%llu reopened)\n", served,
              static_cast<unsigned long long>(reopened));

  finish();
  o.admission.max_waiting = 64;
  o.admission.max_waiting_per_source = 32;
  start(o);
  {
    IdleFlood flood(daemon_->endpoint(), 200);
    std::this_thread::sleep_for(500ms);
  }
  EXPECT_GT(daemon_->stats().evicted, 0u);
  expectServed();
}

TEST_F(DaemonTest, ConnectionsBeyondTheLimitAreToldTheDaemonIsBusy) {
  finish();
  DaemonOptions o;
  o.max_connections = 1;
  start(o);
  std::unique_ptr<Channel> first = connectChannel(daemon_->endpoint(), key_, options());
  ASSERT_TRUE(first->recv(5s).has_value());
  expectThrowWith<HandshakeRefused>([&] { connectChannel(daemon_->endpoint(), key_, options()); },
                                    {"busy"});
  first->send(Leave{"make room"});
  first->close();
  first.reset();
  // The slot frees once the daemon has seen the leave. Until then a connection is told
  // it is busy, or — while the refused one's thread has not ended yet, two connections
  // with a limit of one, the flood rule — closed before the hello.
  std::string last;
  for (int i = 0; i < 250; ++i) {
    try {
      expectServed();
      return;
    } catch (const Error& e) {
      last = e.what();
      std::this_thread::sleep_for(20ms);
    }
  }
  ADD_FAILURE() << "last refusal: " << last;
  ADD_FAILURE() << "the daemon stayed busy after its one client left";
}

TEST_F(DaemonTest, StoppingSaysGoodbyeToConnectedClients) {
  std::unique_ptr<Channel> c = connectChannel(daemon_->endpoint(), key_, options());
  ASSERT_TRUE(c->recv(5s).has_value());
  daemon_->stop();
  std::optional<Message> m = c->recv(5s);
  ASSERT_TRUE(m && std::holds_alternative<Leave>(*m));
  EXPECT_NE(std::get<Leave>(*m).reason.find("stopping"), std::string::npos);
  expectThrowWith<IoError>([&] { c->recv(5s); }, {"closed the connection"});
}

TEST_F(DaemonTest, ADaemonWithoutAWorkerProgramStartsNoWorkers) {
  std::unique_ptr<Channel> c = connectChannel(daemon_->endpoint(), key_, options());
  next(*c);  // node info
  c->send(Launch{0, "127.0.0.1:9", {}});
  const Message m = next(*c);
  ASSERT_TRUE(std::holds_alternative<ErrorReply>(m)) << messageName(m);
  EXPECT_NE(std::get<ErrorReply>(m).message.find("starts no workers"), std::string::npos);
}

// A link task listens on one address of the node and connects to tcp:// peers only: a
// wildcard bind (every interface) and an ipc:// or inproc:// peer (this node's own
// sockets) are answered with an error, and the connection serves on.
TEST_F(DaemonTest, LinkTasksBindOneAddressAndConnectOnlyToTcpPeers) {
  std::unique_ptr<Channel> c = connectChannel(daemon_->endpoint(), key_, options());
  next(*c);  // node info
  for (const std::string host : {"0.0.0.0", "::", "[::]", "0"}) {
    c->send(LinkTask{1, LinkTaskKind::kOpen, host, "", 65536, 1, 0, 1});
    const Message m = next(*c);
    ASSERT_TRUE(std::holds_alternative<ErrorReply>(m)) << host << ": " << messageName(m);
    EXPECT_NE(std::get<ErrorReply>(m).message.find("not '" + host + "' (every interface)"),
              std::string::npos)
        << std::get<ErrorReply>(m).message;
  }
  for (const std::string peer : {"ipc://@tandem-1-0-0-l0", "inproc://x", "udp://127.0.0.1:9"}) {
    c->send(LinkTask{2, LinkTaskKind::kOpen, "127.0.0.1", "", 65536, 1, 0, 1});
    Message m = next(*c);
    ASSERT_TRUE(std::holds_alternative<LinkResult>(m)) << messageName(m);
    c->send(LinkTask{2, LinkTaskKind::kServe, "127.0.0.1", peer, 65536, 1, 0, 1});
    m = next(*c);
    ASSERT_TRUE(std::holds_alternative<ErrorReply>(m)) << peer << ": " << messageName(m);
    EXPECT_NE(std::get<ErrorReply>(m).message.find("connects to 'tcp://...' endpoints only, not '" +
                                                   peer + "'"),
              std::string::npos)
        << std::get<ErrorReply>(m).message;
  }
  c->send(LinkTask{3, LinkTaskKind::kOpen, "127.0.0.1", "", 65536, 1, 0, 1});
  const Message m = next(*c);
  ASSERT_TRUE(std::holds_alternative<LinkResult>(m)) << messageName(m);
  EXPECT_EQ(std::get<LinkResult>(m).endpoint.rfind("tcp://127.0.0.1:", 0), 0u);
}

TEST_F(DaemonTest, LaunchedWorkersAreReportedAndStoppedWithTheirRun) {
  finish();
  DaemonOptions o;
  // A stand-in worker: it ignores the coordinator and exits with code 3, or sleeps.
  o.worker_program = "/bin/sh";
  o.worker_args = {"-c", "[ \"$4\" = 0 ] && exit 3; sleep 30", "worker"};
  start(o);
  std::unique_ptr<Channel> c = connectChannel(daemon_->endpoint(), key_, options());
  next(*c);  // node info
  c->send(Launch{0, "127.0.0.1:9", {}});
  Message m = next(*c);
  ASSERT_TRUE(std::holds_alternative<Launched>(m)) << messageName(m);
  const int64_t pid = std::get<Launched>(m).pid;
  m = next(*c);
  ASSERT_TRUE(std::holds_alternative<WorkerEnded>(m)) << messageName(m);
  EXPECT_EQ(std::get<WorkerEnded>(m).how, "(pid " + std::to_string(pid) + ") exited with code 3");
  EXPECT_FALSE(std::get<WorkerEnded>(m).killed);
  c->send(Launch{0, "127.0.0.1:9", {}});  // that slot again
  m = next(*c);
  ASSERT_TRUE(std::holds_alternative<ErrorReply>(m)) << messageName(m);
  EXPECT_NE(std::get<ErrorReply>(m).message.find("started already"), std::string::npos);
  c->send(Launch{1, "127.0.0.1:9", {}});  // sleeps
  m = next(*c);
  ASSERT_TRUE(std::holds_alternative<Launched>(m)) << messageName(m);
  const auto sleeper = static_cast<pid_t>(std::get<Launched>(m).pid);
  // One run at a time: another connection's launch waits a while (5 s), then is refused
  // while it runs.
  std::unique_ptr<Channel> other = connectChannel(daemon_->endpoint(), key_, options());
  next(*other);
  other->send(Launch{0, "127.0.0.1:9", {}});
  m = next(*other);
  ASSERT_TRUE(std::holds_alternative<ErrorReply>(m)) << messageName(m);
  EXPECT_NE(std::get<ErrorReply>(m).message.find("another run"), std::string::npos);
  // Nor may it give the node tasks meanwhile (node information it has: it came first).
  other->send(LinkTask{1, LinkTaskKind::kOpen, "127.0.0.1", "", 65536, 1, 0, 1});
  m = next(*other);
  ASSERT_TRUE(std::holds_alternative<ErrorReply>(m)) << messageName(m);
  EXPECT_NE(std::get<ErrorReply>(m).message.find(
                "link task: this node runs another run's workers; only that run's coordinator"),
            std::string::npos)
      << std::get<ErrorReply>(m).message;
  // The run's connection vanishes: its worker is stopped, and the next run may start.
  c.reset();
  for (int i = 0; i < 500 && ::kill(sleeper, 0) == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_NE(::kill(sleeper, 0), 0) << "the worker of a vanished run still runs";
  bool launched = false;
  for (int i = 0; i < 100 && !launched; ++i) {
    other->send(Launch{5, "127.0.0.1:9", {}});
    m = next(*other);
    launched = std::holds_alternative<Launched>(m);
    if (!launched) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(launched);
  other->send(LinkTask{2, LinkTaskKind::kOpen, "127.0.0.1", "", 65536, 1, 0, 1});
  m = next(*other);
  EXPECT_TRUE(std::holds_alternative<LinkResult>(m)) << messageName(m);  // its own run's task
}

TEST(DaemonSetupTest, AnAddressItCannotListenOnIsNamed) {
  DaemonOptions o;
  o.listen = "127.0.0.1:nope";
  expectThrowWith<InvalidArgument>([&] { Daemon d(o); }, {"127.0.0.1:nope", "port"});
  o.listen = "192.0.2.1:0";  // TEST-NET-1: never this machine's
  expectThrowWith<IoError>([&] { Daemon d(o); }, {"cannot listen on 192.0.2.1:0"});
  EXPECT_TRUE(isLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(isLoopbackHost("::1"));
  EXPECT_TRUE(isLoopbackHost("localhost"));
  EXPECT_FALSE(isLoopbackHost("0.0.0.0"));
}

}  // namespace
}  // namespace tandem::runtime
