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
#include "tests/runtime/flood.h"
#include "tests/runtime/raw_peer.h"
#include "tests/test_util.h"

namespace tandem::runtime {
namespace {

using namespace std::chrono_literals;
using testing::expectThrowWith;
using testing::IdleFlood;
using testing::RawPeer;

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
    o.timeout = 5s;
    return o;
  }

  // A good client: connects, reads the node info, pings once, leaves.
  void expectServed() {
    std::unique_ptr<Channel> c = connectChannel(daemon_->endpoint(), key_, options());
    const std::optional<Message> info = c->recv(5s);
    ASSERT_TRUE(info.has_value());
    ASSERT_TRUE(std::holds_alternative<NodeInfo>(*info)) << messageName(*info);
    EXPECT_EQ(std::get<NodeInfo>(*info).name, "alpha");
    EXPECT_EQ(estimateClock(*c, 1).rounds, 1);
    c->send(Leave{"test over"});
    c->close();
  }

  // Speaks the handshake by hand with this nonce and proof; returns the daemon's hello.
  Hello handHello(RawPeer& raw, const Hello& mine) {
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
    if (!c->recv(10s)) throw Timeout("no node info within 10 s");
    return c;
  }

  // The daemon counts a refusal just after it has closed the connection: wait for it.
  uint64_t refusedSoon(uint64_t expected) {
    for (int i = 0; i < 200 && daemon_->stats().refused < expected; ++i)
      std::this_thread::sleep_for(10ms);
    return daemon_->stats().refused;
  }

  ClusterKey key_ = generateClusterKey();
  std::unique_ptr<Daemon> daemon_;
  std::thread runner_;
};

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

// The next message that is not a heartbeat's kind: the first within 10 s.
Message next(Channel& c) {
  const std::optional<Message> m = c.recv(10s);
  if (!m) throw Timeout("no message within 10 s");
  return *m;
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

// A profile task: measured on the node's devices, cached by model and device so that the
// same task again measures nothing; a corrupted cache file is discarded and measured
// again; a device the node lacks and a model it cannot hold get error replies, and the
// daemon serves on.
TEST_F(DaemonTest, AProfileTaskIsMeasuredOnceAndThenComesFromTheCache) {
  const std::string cache_dir = testing::freshDir("daemon-profile-cache");
  std::unique_ptr<Channel> c = restartWithCache(cache_dir);
  const std::string spec =
      "name: tiny\ninput: [4]\nlayers:\n  - linear: {out: 8}\n  - relu\n  - linear: {out: 3}\n";
  const ProfileTask task{spec, 4, 0, 2, {{"cpu", 1, 0}, {"cpu", 2, 0}}};
  auto ask = [&](const ProfileTask& t) {
    std::vector<int> cached;
    Channel* ch = c.get();
    const std::vector<Profile> p = profileOnNodes({ch}, {"alpha"}, {t}, 30s, &cached);
    return std::pair{p.at(0), cached.at(0)};
  };
  auto [first, cached_first] = ask(task);
  EXPECT_EQ(cached_first, 0);
  ASSERT_EQ(first.devices.size(), 2u);
  EXPECT_EQ(first.model, "tiny");
  EXPECT_EQ(first.batch, 4);
  ASSERT_EQ(first.devices[0].layers.size(), 3u);
  EXPECT_GT(first.devices[0].layers[0].forward.median, 0);
  // What a message costs the node, at a small size and a large one, measured each time.
  ASSERT_EQ(first.message_cpu.size(), 2u);
  EXPECT_LT(first.message_cpu[0].bytes, first.message_cpu[1].bytes);
  EXPECT_GT(first.message_cpu[0].cpu_s, 0);
  EXPECT_GT(first.message_cpu[1].cpu_s, 0);
  auto [again, cached_again] = ask(task);
  EXPECT_EQ(again.message_cpu.size(), 2u);
  EXPECT_EQ(cached_again, 2);
  EXPECT_EQ(again.devices[1].layers[2].forward.median, first.devices[1].layers[2].forward.median);
  // Another batch is another measurement.
  ProfileTask other = task;
  other.batch = 2;
  EXPECT_EQ(ask(other).second, 0);
  // A cache file spoiled on disk is discarded, and measured again.
  int spoiled = 0;
  for (const auto& e : std::filesystem::directory_iterator(cache_dir + "/profiles")) {
    std::ofstream(e.path()) << "{\"schema\": ";
    ++spoiled;
  }
  EXPECT_EQ(spoiled, 4);  // two devices at two batches
  EXPECT_EQ(ask(task).second, 0);
  EXPECT_EQ(ask(task).second, 2);

  ProfileTask missing = task;
  missing.devices = {{"opencl:99", 1, 0}};
  expectThrowWith<Error>([&] { ask(missing); },
                         {"profiling on node 'alpha'", "no OpenCL device 99"});
  ProfileTask huge = task;
  huge.model_spec = "name: huge\ninput: [100000]\nlayers:\n  - linear: {out: 100000000}\n";
  expectThrowWith<Error>([&] { ask(huge); },
                         {"profiling on node 'alpha'", "over half of this node"});
  // Every copy a task builds counts: a model of about a third of the free memory fits
  // once, not with a copy training beside it (a load of 1).
  const int64_t free = localNodeInfo("").free_memory_bytes;
  ASSERT_GT(free, 0);
  auto wide = [](int64_t w) {
    return "name: wide\ninput: [" + std::to_string(w) +
           "]\nlayers:\n  - linear: {out: " + std::to_string(w) + "}\n";
  };
  int64_t lo = 16, hi = int64_t{1} << 22;  // the narrowest model of at least 0.3 x free
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (trainingBytes(Model(parseModelSpec(wide(mid))), 4) >= free * 3 / 10)
      hi = mid;
    else
      lo = mid + 1;
  }
  ProfileTask loaded = task;
  loaded.model_spec = wide(lo);
  loaded.devices = {{"cpu", 1, 1}};
  expectThrowWith<Error>(
      [&] { ask(loaded); },
      {"profiling on node 'alpha'", "2 copies (the load's too)", "over half of this node"});
  // Threads and load beyond this node's CPUs are measured with as many as it has.
  ProfileTask greedy = task;
  greedy.devices = {{"cpu", 1024, 256}};
  EXPECT_EQ(ask(greedy).first.devices.size(), 1u);
  EXPECT_EQ(ask(task).second, 2);  // still serving
}

// One task at several batches (a plan pricing several microbatch counts): a profile per
// batch, each with its own layers, sharing the first batch's sustained window (its ratio
// to the layers' medians), update and message CPU; each batch cached on its own, so a
// later task at one of them alone measures nothing.
TEST_F(DaemonTest, OneTaskMeasuresEveryBatchAndSharesWhatTheBatchDoesNotChange) {
  const std::string cache_dir = testing::freshDir("daemon-profile-batches");
  std::unique_ptr<Channel> c = restartWithCache(cache_dir);
  // Passes well under a millisecond, even emulated, so that a cached profile is used
  // without the check of a few passes now (which a noisy machine may fail).
  const std::string spec =
      "name: small\ninput: [16]\nlayers:\n  - linear: {out: 16}\n  - relu\n"
      "  - linear: {out: 4}\n";
  const ProfileTask task{spec, 16, 0, 2, {{"cpu", 1, 0}}, 0, {8, 2}};
  auto ask = [&](const ProfileTask& t, std::vector<std::vector<Profile>>* more) {
    std::vector<int> cached;
    Channel* ch = c.get();
    const std::vector<Profile> p = profileOnNodes({ch}, {"alpha"}, {t}, 30s, &cached, more);
    return std::pair{p.at(0), cached.at(0)};
  };
  std::vector<std::vector<Profile>> more;
  auto [first, hits] = ask(task, &more);
  EXPECT_EQ(hits, 0);
  ASSERT_EQ(more.size(), 1u);
  ASSERT_EQ(more[0].size(), 2u);
  const DeviceProfile& f = first.devices.at(0);
  EXPECT_EQ(first.batch, 16);
  EXPECT_GT(f.sustained.passes, 0);
  for (size_t k = 0; k < 2; ++k) {
    const Profile& p = more[0][k];
    const int64_t b = task.more_batches[k];
    EXPECT_EQ(p.batch, b);
    ASSERT_EQ(p.devices.size(), 1u);
    const DeviceProfile& d = p.devices[0];
    EXPECT_EQ(d.layers.at(0).activation_bytes, b * 16 * 4);
    EXPECT_GT(d.layers[0].forward.median, 0);
    EXPECT_EQ(d.sustained.passes, f.sustained.passes);
    EXPECT_EQ(d.sustained.window_s, f.sustained.window_s);
    EXPECT_NEAR(d.sustained.scale(), f.sustained.scale(), 1e-9 * f.sustained.scale());
    EXPECT_NE(d.sustained.burst_pass_s, f.sustained.burst_pass_s);  // its own medians
    EXPECT_EQ(d.update.at("sgd").median, f.update.at("sgd").median);
    EXPECT_EQ(p.message_cpu.size(), 2u);
    EXPECT_EQ(p.message_cpu[1].cpu_s, first.message_cpu[1].cpu_s);
  }
  std::vector<std::vector<Profile>> again;
  EXPECT_EQ(ask(task, &again).second, 3);
  EXPECT_EQ(again[0][1].devices[0].layers[2].forward.median,
            more[0][1].devices[0].layers[2].forward.median);
  ProfileTask alone = task;
  alone.batch = 8;
  alone.more_batches.clear();
  EXPECT_EQ(ask(alone, nullptr).second, 1);
}

// A peer accepted on `listener` that answers each profile task with `answer(task)` until
// its client closes the channel.
std::thread answerProfileTasks(Listener& listener,
                               std::function<ProfileResult(const ProfileTask&)> answer) {
  return std::thread([&listener, answer = std::move(answer)] {
    std::unique_ptr<Channel> c = listener.accept(10s);
    ASSERT_TRUE(c);
    try {
      for (std::optional<Message> m = c->recv(10s); m; m = c->recv(2s))
        c->send(answer(std::get<ProfileTask>(*m)));
    } catch (const IoError&) {  // the client closed the channel
    }
  });
}

// A daemon before protocol 3.1 ignores more_batches and answers the task's own batch:
// the coordinator asks it for each other batch in a task of its own.
TEST(ProfileOnNodesTest, ADaemonThatMeasuresOneBatchIsAskedForEachOther) {
  const ClusterKey key = generateClusterKey();
  Listener listener("127.0.0.1:0", key, HandshakeOptions{});
  const std::string spec = "name: tiny\ninput: [4]\nlayers:\n  - linear: {out: 3}\n";
  // What such a daemon answers at each batch, measured here (on this thread: under ASan a
  // thread that measured and then ends aborts in the sanitizer's own unmapping).
  std::map<int64_t, ProfileResult> at;
  for (const int64_t b : {8, 4, 1})
    at[b] = profileHere(ProfileTask{spec, b, 0, 1, {{"cpu", 1, 0}}, 0, {}}, "");
  std::vector<int64_t> asked;
  std::thread old_daemon = answerProfileTasks(listener, [&](const ProfileTask& t) {
    asked.push_back(t.batch);
    return at.at(t.batch);  // its own batch only
  });
  {
    std::unique_ptr<Channel> c = connectChannel(listener.endpoint(), key, HandshakeOptions{});
    std::vector<int> cached;
    std::vector<std::vector<Profile>> more;
    Channel* ch = c.get();
    const std::vector<Profile> first =
        profileOnNodes({ch}, {"old"}, {ProfileTask{spec, 8, 0, 1, {{"cpu", 1, 0}}, 0, {4, 1}}}, 30s,
                       &cached, &more);
    EXPECT_EQ(first.at(0).batch, 8);
    ASSERT_EQ(more.at(0).size(), 2u);
    EXPECT_EQ(more[0][0].batch, 4);
    EXPECT_EQ(more[0][1].batch, 1);
    EXPECT_EQ(more[0][1].devices.at(0).layers.at(0).activation_bytes, 1 * 3 * 4);
    c->close();
  }
  old_daemon.join();
  EXPECT_EQ(asked, (std::vector<int64_t>{8, 4, 1}));
}

// A daemon that answers another batch than asked, or fewer of them, is named.
TEST(ProfileOnNodesTest, AnAnswerAtOtherBatchesIsRefused) {
  const ClusterKey key = generateClusterKey();
  Listener listener("127.0.0.1:0", key, HandshakeOptions{});
  const std::string spec = "name: tiny\ninput: [4]\nlayers:\n  - linear: {out: 3}\n";
  // (Measured on this thread: see ADaemonThatMeasuresOneBatchIsAskedForEachOther.)
  const ProfileResult at_2 = profileHere(ProfileTask{spec, 2, 0, 1, {{"cpu", 1, 0}}, 0, {}}, "");
  std::thread liar = answerProfileTasks(listener, [&](const ProfileTask& t) {
    ProfileResult r = at_2;
    if (t.more_batches.size() == 2) r.more = {r.profile};  // one of two
    return r;
  });
  {
    std::unique_ptr<Channel> c = connectChannel(listener.endpoint(), key, HandshakeOptions{});
    Channel* ch = c.get();
    expectThrowWith<Error>(
        [&] {
          profileOnNodes({ch}, {"liar"}, {ProfileTask{spec, 8, 0, 1, {{"cpu", 1, 0}}, 0, {}}}, 30s);
        },
        {"profiling on node 'liar'", "its profile is at batch 2, not the 8 asked for"});
    expectThrowWith<Error>(
        [&] {
          profileOnNodes({ch}, {"liar"}, {ProfileTask{spec, 2, 0, 1, {{"cpu", 1, 0}}, 0, {4, 1}}},
                         30s);
        },
        {"profiling on node 'liar'", "it answered 1 more batches, not the 2 asked for"});
    c->close();
  }
  liar.join();
}

// The batch a device is measured at: the one asked where its passes fit the budget and
// memory, else halved, never below the least.
TEST(ProfileBatchTest, HalvesTheBatchUntilTheMeasurementFitsItsBudget) {
  const auto any = [](int64_t) { return true; };
  EXPECT_EQ(profileBatch(1024, 0, 10, 13, 1.5, any), 1024);  // no least: as asked
  EXPECT_EQ(profileBatch(64, 64, 10, 13, 1.5, any), 64);
  // 10 ms a pass at 64, 10 passes: 1.56 ms a sample, 960 samples in 1.5 s.
  EXPECT_EQ(profileBatch(1024, 64, 0.01, 10, 1.5, any), 512);
  EXPECT_EQ(profileBatch(256, 64, 0.01, 10, 1.5, any), 256);
  EXPECT_EQ(profileBatch(4096, 64, 1e-3, 10, 1.5, any), 4096);  // a launch-bound GPU
  EXPECT_EQ(profileBatch(4096, 64, 1e-3, 10, 1.5, [](int64_t b) { return b <= 128; }), 128);
  EXPECT_EQ(profileBatch(1024, 64, 10.0, 10, 1.5, any), 64);  // over budget even at the least
  EXPECT_EQ(profileBatch(100, 64, 10.0, 10, 1.5, any), 64);   // halving stops at the least
}

// A task that lets a device measure at a smaller batch (least_batch): a cheap model is
// measured at the batch asked; a costly one at a smaller batch, which its profile names
// and its layers' sizes follow.
TEST_F(DaemonTest, ADeviceTooSlowForTheBatchIsMeasuredAtASmallerOne) {
  std::unique_ptr<Channel> c = connectChannel(daemon_->endpoint(), key_, options());
  next(*c);  // node info
  auto ask = [&](const ProfileTask& t) {
    Channel* ch = c.get();
    return profileOnNodes({ch}, {"alpha"}, {t}, 60s).at(0);
  };
  const std::string tiny = "name: tiny\ninput: [4]\nlayers:\n  - linear: {out: 8}\n";
  const Profile cheap = ask(ProfileTask{tiny, 256, 0, 2, {{"cpu", 1, 0}}, 4, {}});
  EXPECT_EQ(cheap.batch, 256);
  ASSERT_EQ(cheap.devices.size(), 1u);
  EXPECT_EQ(cheap.devices[0].batchIn(cheap), 256);
  EXPECT_EQ(cheap.devices[0].layers[0].activation_bytes, 256 * 8 * 4);
  // About a GFLOP a pass at 64: far over the budget at 65536.
  const std::string wide =
      "name: wide\ninput: [1024]\nlayers:\n  - linear: {out: 1024}\n  - relu\n"
      "  - linear: {out: 1024}\n";
  const Profile costly = ask(ProfileTask{wide, 65536, 1, 3, {{"cpu", 1, 0}}, 64, {}});
  EXPECT_EQ(costly.batch, 65536);
  ASSERT_EQ(costly.devices.size(), 1u);
  const int64_t b = costly.devices[0].batch;
  EXPECT_GE(b, 64);
  EXPECT_LT(b, 65536);
  EXPECT_EQ(costly.devices[0].batchIn(costly), b);
  EXPECT_EQ(costly.devices[0].layers[0].activation_bytes, b * 1024 * 4);
}

// A cached profile far from what the device does now (a profile taken in a slow minute
// of a shared machine) is measured again; one that agrees is used.
TEST_F(DaemonTest, ACachedProfileFarFromTheDeviceNowIsMeasuredAgain) {
  const std::string cache_dir = testing::freshDir("daemon-stale-profile");
  std::unique_ptr<Channel> c = restartWithCache(cache_dir);
  // Passes of a few milliseconds: long enough to be checked.
  const std::string spec =
      "name: mid\ninput: [512]\nlayers:\n  - linear: {out: 512}\n  - relu\n"
      "  - linear: {out: 512}\n";
  const ProfileTask task{spec, 64, 1, 3, {{"cpu", 1, 0}}};
  auto cachedCount = [&] {
    std::vector<int> cached;
    Channel* ch = c.get();
    profileOnNodes({ch}, {"alpha"}, {task}, 30s, &cached);
    return cached.at(0);
  };
  EXPECT_EQ(cachedCount(), 0);
  // The cached profile says the device is ten times slower than it is.
  const auto file = std::filesystem::directory_iterator(cache_dir + "/profiles")->path();
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find("\"pass_s\": ");
  ASSERT_NE(at, std::string::npos) << text;
  const size_t value = at + 10, end = text.find_first_of(",\n}", value);
  const double pass = std::stod(text.substr(value, end - value));
  ASSERT_GT(pass * 10, 1e-3) << "the check needs passes of a millisecond at least";
  const std::string spoiled = text.replace(value, end - value, std::to_string(pass * 10));
  std::ofstream(file, std::ios::trunc) << spoiled;
  EXPECT_EQ(cachedCount(), 0);  // measured again, and the cache holds the new measurement
  std::ifstream again(file);
  EXPECT_NE(std::string((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>()),
            spoiled);
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
