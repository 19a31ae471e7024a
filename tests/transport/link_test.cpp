// ZmqLink over inproc, ipc and tcp: round trips of every dtype x codec x shape, matching
// out of order, bounded buffering under a fast sender, hostile messages rejected and
// counted while the link keeps working, and timeouts that name the peer.
#include "transport/zmq_link.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/profile/link_probe.h"
#include "tests/test_util.h"
#include "tests/transport/link_checks.h"
#include "tests/transport/tcp_probe.h"

namespace tandem::transport {
namespace {

using namespace std::chrono_literals;
using testing::expectThrowWith;

std::string bindFor(const std::string& kind, const std::string& name) {
  if (kind == "inproc") return "inproc://" + name;
  if (kind == "ipc")
    return "ipc://" + ::testing::TempDir() + "/tandem-" + name + "-" + std::to_string(getpid());
  return "tcp://127.0.0.1:*";
}

struct Pair {
  std::unique_ptr<ZmqLink> a, b;
};

Pair makePair(Context& ctx, const std::string& kind, LinkOptions base = {}) {
  static int counter = 0;
  const std::string id = std::to_string(counter++);
  LinkOptions oa = base, ob = base;
  oa.bind = bindFor(kind, "a" + id);
  ob.bind = bindFor(kind, "b" + id);
  Pair p;
  p.a = std::make_unique<ZmqLink>(ctx, oa);
  p.b = std::make_unique<ZmqLink>(ctx, ob);
  p.a->connect(p.b->endpoint());
  p.b->connect(p.a->endpoint());
  return p;
}

class LinkTest : public ::testing::TestWithParam<std::string> {
 protected:
  Context ctx_;
  cpu::CpuBackend be_;
};

INSTANTIATE_TEST_SUITE_P(Endpoints, LinkTest, ::testing::Values("inproc", "ipc", "tcp"));

TEST_P(LinkTest, EveryDtypeCodecAndShapeRoundTrips) {
  testing::checkEveryDtypeCodecAndShape<ZmqLink>([&](const LinkOptions& o) {
    Pair p = makePair(ctx_, GetParam(), o);
    return std::pair{std::move(p.a), std::move(p.b)};
  });
}

TEST_P(LinkTest, MessagesAreMatchedByTagWhateverTheirOrder) {
  LinkOptions o;
  o.timeout = 5s;
  Pair p = makePair(ctx_, GetParam(), o);
  testing::checkMatchedByTagWhateverTheirOrder(*p.a, *p.b);
}

TEST_P(LinkTest, InPlaceSendsKeepTheTensorAliveUntilSent) {
  LinkOptions o;
  o.timeout = 5s;
  o.checksum = true;
  Pair p = makePair(ctx_, GetParam(), o);
  const auto v = testing::randomVector(4, 100000);
  {
    // The only handle goes out of scope right after the send: the in-flight message must
    // keep the storage, or the receiver would read freed (and reused) memory.
    const Tensor t = toDevice(be_, {100000}, v);
    p.a->sendInPlace({MessageKind::kActivation, 0}, t);
  }
  const Tensor reuse = be_.zeros({100000});  // would take the freed block if it were freed
  EXPECT_EQ(toHost(p.b->recv({MessageKind::kActivation, 0}, be_)), v);
  EXPECT_EQ(p.b->stats().rejects, 0u);  // the checksum over the in-place bytes matched
  p.a->sendInPlace({MessageKind::kLabel, 1}, toDeviceI32(be_, {2}, {4, 5}));
  EXPECT_EQ(toHostI32(p.b->recv({MessageKind::kLabel, 1}, be_)), (std::vector<int32_t>{4, 5}));
}

TEST_P(LinkTest, AReceivedBufferOutlivesItsLinkAndContext) {
  // A large raw message becomes the tensor's memory without a copy; the tensor then owns
  // it and stays valid after the link and the context are gone.
  const auto v = testing::randomVector(8, 50000);
  Tensor got;
  {
    Context ctx;
    LinkOptions o;
    o.timeout = 5s;
    Pair p = makePair(ctx, GetParam(), o);
    p.a->send({MessageKind::kActivation, 0}, toDevice(be_, {50000}, v));
    got = p.b->recv({MessageKind::kActivation, 0}, be_);
    EXPECT_EQ(p.b->stats().received_in_place, 1u);
    const Tensor reuse = be_.zeros({50000});  // must not land on the received memory
  }
  EXPECT_EQ(toHost(got), v);
  // It is an ordinary tensor of the backend: ops write into it.
  be_.fill(got, 2.0f);
  EXPECT_EQ(toHost(got), std::vector<float>(50000, 2.0f));
}

TEST_P(LinkTest, RecvTimesOutNamingThePeer) {
  LinkOptions o;
  o.timeout = 200ms;
  Pair p = makePair(ctx_, GetParam(), o);
  const auto t0 = std::chrono::steady_clock::now();
  expectThrowWith<Timeout>(
      [&] {
        p.a->recv({MessageKind::kGradient, 3}, be_);
      },
      {"no (gradient, microbatch 3)", p.b->endpoint(), "200 ms"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST(LinkBoundsTest, AFastSenderBlocksWithinTheHighWaterMarks) {
  // Nobody receives: the sender may queue at most send_hwm + recv_hwm messages (inproc
  // has no kernel buffers), then its send times out instead of growing memory.
  Context ctx;
  cpu::CpuBackend be;
  LinkOptions o;
  o.timeout = 100ms;
  o.send_hwm = 4;
  o.recv_hwm = 4;
  Pair p = makePair(ctx, "inproc", o);
  const Tensor t = be.zeros({1024});
  int sent = 0;
  try {
    for (; sent < 1000; ++sent) p.a->send({MessageKind::kActivation, sent}, t);
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find(p.b->endpoint()), std::string::npos) << e.what();
  }
  EXPECT_LE(sent, 8 + 2);
  EXPECT_GE(sent, 4);
  // What was queued is still delivered.
  for (int i = 0; i < sent; ++i)
    EXPECT_EQ(p.b->recv({MessageKind::kActivation, i}, be).numel(), 1024);
}

TEST(LinkBoundsTest, TheOutOfOrderBufferIsBounded) {
  Context ctx;
  cpu::CpuBackend be;
  LinkOptions o;
  o.timeout = 2s;
  o.max_buffered_messages = 5;
  Pair p = makePair(ctx, "inproc", o);
  for (int i = 0; i < 8; ++i) p.a->send({MessageKind::kActivation, i}, be.zeros({4}));
  expectThrowWith<Error>(
      [&] {
        p.b->recv({MessageKind::kGradient, 0}, be);
      },
      {"receive buffer full (5 messages", "not asked for"});
  EXPECT_LE(p.b->buffered(), 5u);
}

TEST(LinkHostileTest, BadMessagesAreRejectedCountedAndTheLinkLivesOn) {
  Context ctx;
  cpu::CpuBackend be;
  LinkOptions o;
  o.timeout = 2s;
  o.limits.max_payload_bytes = 1 << 20;
  Pair p = makePair(ctx, "inproc", o);
  zmq::socket_t raw(ctx.zmq(), zmq::socket_type::push);
  raw.connect(p.b->endpoint());
  auto sendFrames = [&](const std::vector<std::vector<uint8_t>>& frames) {
    for (size_t i = 0; i < frames.size(); ++i)
      raw.send(zmq::buffer(frames[i]),
               i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  };
  WireHeader good;
  good.shape = Shape{4};
  good.payload_bytes = 16;
  const std::vector<uint8_t> good_header = encodeHeader(good);
  WireHeader mismatched = good;
  mismatched.shape = Shape{5};  // payload_bytes says 16, shape says 20
  WireHeader unknown_codec = good;
  unknown_codec.codec = static_cast<Codec>(7);
  WireHeader oversize = good;
  oversize.shape = Shape{1 << 20};
  oversize.payload_bytes = uint64_t{4} << 20;
  WireHeader bad_sum = good;
  bad_sum.checksum = 1;
  Rng rng(1);
  std::vector<uint8_t> junk(200);
  for (auto& b : junk) b = static_cast<uint8_t>(rng.below(256));
  const std::vector<uint8_t> payload(16, 0);
  sendFrames({junk, payload});  // random bytes
  sendFrames(
      {std::vector<uint8_t>(good_header.begin(), good_header.begin() + 10), payload});  // truncated
  sendFrames({encodeHeader(mismatched), payload});      // shape vs payload
  sendFrames({encodeHeader(unknown_codec), payload});   // unknown codec
  sendFrames({encodeHeader(oversize), payload});        // over the cap
  sendFrames({encodeHeader(bad_sum), payload});         // wrong checksum
  sendFrames({good_header});                            // one frame
  sendFrames({good_header, payload, payload});          // three frames
  sendFrames({good_header, std::vector<uint8_t>(12)});  // short payload
  // A valid message right after, on the same pipe (PULL fair-queues between peers, so
  // order is only kept within one sender), is still received.
  const std::vector<float> values = {1, 2, 3, 4};
  std::vector<uint8_t> value_bytes(16);
  std::memcpy(value_bytes.data(), values.data(), 16);
  sendFrames({good_header, value_bytes});
  EXPECT_EQ(toHost(p.b->recv({MessageKind::kActivation, 0}, be)), values);
  EXPECT_EQ(p.b->stats().rejects, 9u) << p.b->stats().last_reject;
  EXPECT_NE(p.b->stats().last_reject.find("12 bytes, the header announced 16"), std::string::npos)
      << p.b->stats().last_reject;
  EXPECT_EQ(p.b->buffered(), 0u);
}

TEST(LinkErrorFeedbackTest, GradientsCarryTheirResidualAcrossMessages) {
  Context ctx;
  cpu::CpuBackend be;
  LinkOptions o;
  o.codec = Codec::kI8;
  o.error_feedback = true;
  o.int8_block = 8;
  o.timeout = 2s;
  Pair p = makePair(ctx, "inproc", o);
  std::vector<float> g(8, 0.001f);
  g[0] = 1.0f;
  double sum_true = 0, sum_got = 0;
  for (int m = 0; m < 200; ++m) {
    p.a->send({MessageKind::kGradient, m}, toDevice(be, {8}, g));
    sum_true += g[1];
    sum_got += toHost(p.b->recv({MessageKind::kGradient, m}, be))[1];
  }
  EXPECT_NEAR(sum_got, sum_true, 0.5 / 127 * 1.01);  // plain int8 would lose all 0.2
}

// Over tcp to this machine, each side's sending connection gets local_congestion once
// the link has seen it made (by the next send); the receiving ends keep the system's.
// Reno is asked for, which any process may choose, so the check tells a tuned connection
// from an untouched one wherever the system's default is not reno itself.
TEST(LinkCongestionTest, LocalSendingConnectionsGetTheChosenCongestionControl) {
  const std::string system = testing::systemCongestion();
  ASSERT_FALSE(system.empty()) << "no /proc/sys/net/ipv4/tcp_congestion_control";
  cpu::CpuBackend be;
  for (const std::string wanted : {"reno", ""}) {
    SCOPED_TRACE("local_congestion '" + wanted + "'");
    Context ctx;
    LinkOptions o;
    o.local_congestion = wanted;
    Pair p = makePair(ctx, "tcp", o);
    const Tensor t = be.zeros({4});
    for (int64_t mb = 0; mb < 3; ++mb) {  // the first sends may come before the connection
      p.a->send({MessageKind::kActivation, mb}, t);
      p.b->recv({MessageKind::kActivation, mb}, be);
      p.b->send({MessageKind::kGradient, mb}, t);
      p.a->recv({MessageKind::kGradient, mb}, be);
    }
    auto portOfEndpoint = [](const std::string& endpoint) {
      return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
    };
    const int port_a = portOfEndpoint(p.a->endpoint()), port_b = portOfEndpoint(p.b->endpoint());
    int sending = 0, receiving = 0;
    for (const auto& [fd, name] : testing::congestionOfConnectedTcpSockets()) {
      const int peer = testing::portOf(fd, true), own = testing::portOf(fd, false);
      if (peer == port_a || peer == port_b) {  // a sending side's connection to a receiver
        EXPECT_EQ(name, wanted.empty() ? system : wanted) << "fd " << fd;
        ++sending;
      } else if (own == port_a || own == port_b) {  // a receiving side's end of it
        EXPECT_EQ(name, system) << "fd " << fd;
        ++receiving;
      }
    }
    EXPECT_EQ(sending, 2);
    EXPECT_EQ(receiving, 2);
  }
}

TEST(LinkOptionsTest, BadOptionsAreNamed) {
  Context ctx;
  LinkOptions o;
  expectThrowWith<InvalidArgument>([&] { ZmqLink(ctx, o); }, {"no endpoint to bind"});
  o.bind = "bogus://x";
  expectThrowWith<IoError>([&] { ZmqLink(ctx, o); }, {"cannot bind 'bogus://x'"});
  o.bind = "inproc://options-test";
  ZmqLink l(ctx, o);
  cpu::CpuBackend be;
  expectThrowWith<InvalidArgument>([&] { l.send({}, be.zeros({1})); }, {"no peer to send to"});
}

// The link probe (`tandem profile --links`) over the real transport: it measures, stops
// the echo side, and leaves nothing queued; bad options, a silent peer and a stray
// message are errors.

// The echo side of a probe on its own thread, with its own backend (and `load`, if any);
// joined, it has returned only if the probe stopped it.
struct Echo {
  EchoCpu cpu{-1, -1};
  std::exception_ptr error;
  std::thread thread;
  Echo(ZmqLink& link, std::function<std::unique_ptr<Backend>()> load = {})
      : thread([this, &link, load] {
          try {
            cpu::CpuBackend be;
            cpu = echoLink(link, be, load);
          } catch (...) {
            error = std::current_exception();
          }
        }) {}
};

TEST_P(LinkTest, ProbeMeasuresAndStopsTheEcho) {
  LinkOptions o;
  o.timeout = 5s;
  Pair p = makePair(ctx_, GetParam(), o);
  Echo echo(*p.b);
  LinkProbeOptions probe;
  probe.message_bytes = 64 << 10;
  probe.window = 3;
  probe.warmup = 1;
  probe.repeats = 4;
  const LinkMeasurement m = measureLink(*p.a, be_, probe);
  echo.thread.join();
  EXPECT_FALSE(echo.error);
  const EchoCpu& echo_cpu = echo.cpu;
  EXPECT_EQ(m.round_trip.repeats, 4);
  EXPECT_EQ(m.transfer.repeats, 4);
  EXPECT_GT(m.round_trip.min, 0);
  EXPECT_EQ(m.latency_s, m.round_trip.median / 2);
  EXPECT_GT(m.bandwidth, 0);
  // No more than the whole transfer's bytes over a tenth of its time (the floor).
  EXPECT_LE(m.bandwidth, 3.0 * (64 << 10) / (0.1 * m.transfer.median) * 1.0000001);
  EXPECT_EQ(m.message_bytes, 64 << 10);
  // The host's CPU over the data runs, read by either end (ticks of 10 ms: maybe none).
  EXPECT_EQ(m.data_bytes, 5 * 3 * (64 << 10));
  EXPECT_GE(m.host_cpu_s, 0);
  EXPECT_GE(echo_cpu.host_cpu_s, 0);
  EXPECT_TRUE(std::isfinite(m.host_cpu_s) && std::isfinite(echo_cpu.host_cpu_s));
  // Each end's own process, to the nanosecond: sending, taking and answering 960 KiB is
  // never free (both ends share this test's process, so each reads both).
  EXPECT_GT(m.process_cpu_s, 0);
  EXPECT_GT(echo_cpu.process_cpu_s, 0);
  // No load asked: no loaded runs.
  EXPECT_EQ(m.loaded_bytes, 0);
  EXPECT_EQ(m.loaded_cpu_s, 0);
  EXPECT_EQ(echo_cpu.loaded_cpu_s, 0);
  // Every data message and ping was taken: 1 + 4 pings, 5 x (3 data + ping), the stop.
  EXPECT_EQ(p.b->stats().messages_received, 5u + 5 * 4 + 1);
  EXPECT_EQ(p.a->stats().messages_received, 5u + 5 + 1);
  EXPECT_EQ(p.a->buffered(), 0u);
  EXPECT_EQ(p.b->buffered(), 0u);
}

// With a load at both ends, window x repeats data messages go one at a time after the
// bandwidth runs, each answered, between the pings that start and end the loaded runs;
// each end says what they cost it (both ends share this process here, so each reads
// both: only finite and non-negative can be held).
TEST_P(LinkTest, ALoadedProbeRunsItsMessagesOneAtATimeBesideAComputation) {
  LinkOptions o;
  o.timeout = 10s;
  Pair p = makePair(ctx_, GetParam(), o);
  auto cpu = [] { return std::unique_ptr<Backend>(std::make_unique<cpu::CpuBackend>()); };
  Echo echo(*p.b, cpu);
  LinkProbeOptions probe;
  probe.message_bytes = 64 << 10;
  probe.window = 3;
  probe.warmup = 1;
  probe.repeats = 2;
  probe.load = cpu;
  const LinkMeasurement m = measureLink(*p.a, be_, probe);
  echo.thread.join();
  ASSERT_FALSE(echo.error);
  const EchoCpu& echo_cpu = echo.cpu;
  EXPECT_EQ(m.loaded_bytes, 3 * 2 * (64 << 10));
  EXPECT_GE(m.loaded_cpu_s, 0);
  EXPECT_GE(echo_cpu.loaded_cpu_s, 0);
  EXPECT_TRUE(std::isfinite(m.loaded_cpu_s) && std::isfinite(echo_cpu.loaded_cpu_s));
  // The bandwidth runs' CPU is the echo side's up to the loaded runs, not beyond.
  EXPECT_GT(echo_cpu.process_cpu_s, 0);
  // 1 + 2 pings, 3 x (3 data + ping); the start, 6 x (data + ping), the end; the stop.
  EXPECT_EQ(p.b->stats().messages_received, 3u + 3 * 4 + 1 + 6 * 2 + 1 + 1);
  EXPECT_EQ(p.a->stats().messages_received, 3u + 3 + 1 + 6 + 1 + 1);
  EXPECT_EQ(p.a->buffered(), 0u);
  EXPECT_EQ(p.b->buffered(), 0u);
}

// The loaded runs send window x repeats messages, fewer on a slow link (as many as take
// half a second), never fewer than two.
TEST(LinkProbeTest, LoadedRunsFitTheirLinksSpeed) {
  LinkProbeOptions o;
  o.message_bytes = 1 << 20;
  o.window = 4;
  o.repeats = 5;
  EXPECT_EQ(loadedMessages(o, 1e9), 20);    // a fast link: all of them
  EXPECT_EQ(loadedMessages(o, 12e6), 6);    // 100 Mbit/s: 5.7 fit in 0.5 s
  EXPECT_EQ(loadedMessages(o, 1.25e6), 2);  // 10 Mbit/s: the least
  EXPECT_EQ(loadedMessages(o, 0), 2);       // not measured
  o.window = o.repeats = 1;
  EXPECT_EQ(loadedMessages(o, 1.25e6), 1);  // never more than window x repeats
}

TEST_P(LinkTest, ProbeErrors) {
  LinkOptions o;
  o.timeout = 200ms;
  Pair p = makePair(ctx_, GetParam(), o);
  LinkProbeOptions bad;
  bad.message_bytes = 6;
  expectThrowWith<InvalidArgument>([&] { measureLink(*p.a, be_, bad); }, {"message size 6 bytes"});
  bad = {};
  bad.window = 0;
  expectThrowWith<InvalidArgument>([&] { measureLink(*p.a, be_, bad); }, {"window 0"});
  // Nobody echoes: the probe times out instead of waiting for ever.
  expectThrowWith<Timeout>([&] { measureLink(*p.a, be_, LinkProbeOptions{}); },
                           {"no (gradient, microbatch 0)"});
  // A message that is no probe's is refused by the echo side, named.
  Pair q = makePair(ctx_, GetParam(), o);
  q.a->send({MessageKind::kActivation, 0}, toDeviceI32(be_, {2}, {1, 2}));
  expectThrowWith<FormatError>([&] { echoLink(*q.b, be_); }, {"message 0", "is not a probe's"});
}

// keepFreedMemory: a received message's size (16 MiB, under glibc's 32 MiB ceiling) is
// then served from the heap, where freed blocks are kept for the next one, not from a
// fresh mapping — which glibc's default does for a fresh process (ctest runs each test
// in its own). (Under AddressSanitizer malloc is its own: nothing to see.)
TEST(ContextTest, AProgramThatKeepsFreedMemoryServesLargeMessagesFromTheHeap) {
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
  keepFreedMemory();
  const size_t mapped = mallinfo2().hblkhd;
  // Under glibc's mmap threshold ceiling (32 MiB on 64-bit, 512 KiB on 32-bit, where
  // larger blocks are mapped fresh whatever the setting). (Written through a volatile
  // pointer: a malloc the compiler may not elide.)
  const size_t size = sizeof(long) == 8 ? size_t{16} << 20 : size_t{256} << 10;
  char* volatile block = static_cast<char*>(std::malloc(size));
  ASSERT_NE(block, nullptr);
  block[0] = 1;
  EXPECT_EQ(mallinfo2().hblkhd, mapped) << "a block of " << size << " bytes was mapped fresh";
  std::free(block);
#else
  GTEST_SKIP() << "glibc's malloc only";
#endif
}

}  // namespace
}  // namespace tandem::transport
