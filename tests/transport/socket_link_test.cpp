// SocketLink over ipc, tcp and sealed tcp: round trips of every dtype x codec x shape,
// matching out of order, two sides sending large messages at once, a closed peer, and
// what a stranger on the network can do: connections turned away (garbage, another key,
// another stage) while the real peer is still admitted, and sealed messages altered,
// replayed or announcing sizes beyond the limits ending the link, not the process.
#include "transport/socket_link.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "tests/test_util.h"
#include "tests/transport/link_checks.h"
#include "transport/tcp/socket.h"

namespace tandem::transport {
namespace {

using namespace std::chrono_literals;
using testing::expectThrowWith;

LinkKey keyOf(uint8_t seed) {
  LinkKey k{};
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(seed * 31 + i);
  return k;
}

std::string bindFor(const std::string& kind) {
  static int counter = 0;
  if (kind == "ipc")
    return "ipc://" + ::testing::TempDir() + "/tandem-sl-" + std::to_string(getpid()) + "-" +
           std::to_string(counter++);
  return "tcp://127.0.0.1:*";
}

std::optional<LinkKey> keyFor(const std::string& kind) {
  return kind == "sealed" ? std::optional<LinkKey>(keyOf(1)) : std::nullopt;
}

struct Pair {
  std::unique_ptr<SocketLink> a, b;
};

// Stage 0 (a) and stage 1 (b), connected both ways.
Pair makePair(const std::string& kind, LinkOptions base = {}) {
  LinkOptions oa = base, ob = base;
  oa.bind = bindFor(kind);
  ob.bind = bindFor(kind);
  oa.stage = ob.peer_stage = 0;
  oa.peer_stage = ob.stage = 1;
  Pair p;
  p.a = std::make_unique<SocketLink>(oa, keyFor(kind));
  p.b = std::make_unique<SocketLink>(ob, keyFor(kind));
  p.a->connect(p.b->endpoint());
  p.b->connect(p.a->endpoint());
  return p;
}

class SocketLinkTest : public ::testing::TestWithParam<std::string> {
 protected:
  cpu::CpuBackend be_;
};

INSTANTIATE_TEST_SUITE_P(Endpoints, SocketLinkTest, ::testing::Values("ipc", "tcp", "sealed"));

TEST_P(SocketLinkTest, EveryDtypeCodecAndShapeRoundTrips) {
  testing::checkEveryDtypeCodecAndShape<SocketLink>([&](const LinkOptions& o) {
    Pair p = makePair(GetParam(), o);
    return std::pair{std::move(p.a), std::move(p.b)};
  });
}

TEST_P(SocketLinkTest, MessagesAreMatchedByTagWhateverTheirOrder) {
  LinkOptions o;
  o.timeout = 5s;
  Pair p = makePair(GetParam(), o);
  testing::checkMatchedByTagWhateverTheirOrder(*p.a, *p.b);
}

// Each side sends far more than the sockets' buffers hold before it receives anything: a
// send that waits for room reads what its peer sends meanwhile, so neither waits forever.
TEST_P(SocketLinkTest, TwoSidesSendingLargeMessagesAtOnceDoNotBlockEachOther) {
  LinkOptions o;
  o.timeout = 20s;
  Pair p = makePair(GetParam(), o);
  constexpr int kMessages = 6;
  const Shape big{int64_t{2} << 20};  // 8 MiB each
  auto side = [&](SocketLink& l, MessageKind out, MessageKind in, float base) {
    cpu::CpuBackend be;
    for (int64_t m = 0; m < kMessages; ++m)
      l.send({out, m}, toDevice(be, big,
                                std::vector<float>(static_cast<size_t>(big.numel()),
                                                   base + static_cast<float>(m))));
    for (int64_t m = 0; m < kMessages; ++m) {
      const auto v = toHost(l.recv({in, m}, be));
      ASSERT_EQ(v.size(), static_cast<size_t>(big.numel()));
      EXPECT_EQ(v.front(), (base == 0 ? 100.0f : 0.0f) + static_cast<float>(m));
      EXPECT_EQ(v.back(), v.front());
    }
  };
  std::thread other(side, std::ref(*p.b), MessageKind::kGradient, MessageKind::kActivation, 100.0f);
  side(*p.a, MessageKind::kActivation, MessageKind::kGradient, 0.0f);
  other.join();
  EXPECT_EQ(p.a->stats().messages_received, static_cast<uint64_t>(kMessages));
  EXPECT_EQ(p.b->stats().messages_received, static_cast<uint64_t>(kMessages));
}

TEST_P(SocketLinkTest, RecvTimesOutNamingThePeerAndTheTag) {
  LinkOptions o;
  o.timeout = 100ms;
  Pair p = makePair(GetParam(), o);
  expectThrowWith<Timeout>(
      [&] {
        p.b->recv({MessageKind::kGradient, 7}, be_);
      },
      {"no (gradient, microbatch 7) from '" + p.a->endpoint() + "'", "within 100 ms"});
}

TEST_P(SocketLinkTest, APeerThatClosesEndsTheLinkAfterItsMessages) {
  LinkOptions o;
  o.timeout = 5s;
  Pair p = makePair(GetParam(), o);
  for (int64_t m = 0; m < 2; ++m)
    p.a->send({MessageKind::kActivation, m}, toDevice(be_, {1}, {static_cast<float>(m)}));
  const std::string a = p.a->endpoint();
  p.a.reset();
  for (int64_t m = 0; m < 2; ++m)
    EXPECT_EQ(toHost(p.b->recv({MessageKind::kActivation, m}, be_)),
              std::vector<float>{static_cast<float>(m)});
  expectThrowWith<IoError>(
      [&] {
        p.b->recv({MessageKind::kActivation, 2}, be_);
      },
      {"'" + a + "' closed the connection", "(activation, microbatch 2)"});
}

// --- strangers ---------------------------------------------------------------------

// A hand-made sender: a connection to `to` that says `hello`, then writes what it is given.
struct Raw {
  tcp::Socket s;
  Raw(const std::string& to, const HelloBytes* hello) {
    const std::string rest = to.substr(6);
    const size_t colon = rest.rfind(':');
    s = tcp::connectTo(tcp::Address::resolve(rest.substr(0, colon), rest.substr(colon + 1), false),
                       {0, false}, tcp::Clock::now() + 5s, "raw");
    if (hello) write(*hello);
  }
  void write(std::span<const uint8_t> bytes) {
    ASSERT_TRUE(tcp::writeAll(s.get(), bytes.data(), bytes.size(), tcp::Clock::now() + 5s, "raw"));
  }
};

// A message as a socket link writes it: prefix, header and payload, sealed by `seal` if given.
std::vector<uint8_t> frame(const Tensor& t, int64_t mb, Sealer* seal) {
  WireHeader h;
  h.src_stage = 0;
  h.dst_stage = 1;
  h.microbatch = mb;
  h.shape = t.shape();
  h.payload_bytes = t.bytes();
  std::vector<uint8_t> head = encodeHeader(h), body(t.bytes());
  t.backend().download(t, body.data());
  std::vector<uint8_t> pre(16, 0);
  putLittle(pre.data(), head.size(), 4);
  putLittle(pre.data() + 8, body.size(), 8);
  if (seal) {
    const size_t hn = head.size(), bn = body.size();
    head.resize(hn + kSealTagBytes);
    seal->seal({head.data(), hn}, head.data(), head.data() + hn, pre);
    body.resize(bn + kSealTagBytes);
    seal->seal({body.data(), bn}, body.data(), body.data() + bn, {});
  }
  std::vector<uint8_t> out(pre.size() + head.size() + body.size());
  std::copy(pre.begin(), pre.end(), out.begin());
  std::copy(head.begin(), head.end(), out.begin() + static_cast<std::ptrdiff_t>(pre.size()));
  std::copy(body.begin(), body.end(),
            out.begin() + static_cast<std::ptrdiff_t>(pre.size() + head.size()));
  return out;
}

// b: stage 1 listening, sealed with key 1; its peer (stage 0) not connected yet.
std::unique_ptr<SocketLink> listening(std::chrono::milliseconds timeout) {
  LinkOptions o;
  o.bind = "tcp://127.0.0.1:*";
  o.stage = 1;
  o.peer_stage = 0;
  o.timeout = timeout;
  return std::make_unique<SocketLink>(o, keyOf(1));
}

TEST(SocketLinkHostileTest, StrangersAreTurnedAwayAndThePeerIsStillAdmitted) {
  cpu::CpuBackend be;
  auto b = listening(300ms);
  const std::string at = b->endpoint();
  HelloBytes junk{};
  junk.fill(0x5a);
  Raw garbage(at, &junk);
  const HelloBytes other_key = writeHello({true, 0, 1, 0, at}, keyOf(2));
  Raw stranger(at, &other_key);
  const HelloBytes other_stage = writeHello({true, 2, 1, 0, at}, keyOf(1));
  Raw neighbour(at, &other_stage);
  const HelloBytes elsewhere = writeHello({true, 0, 1, 0, "tcp://127.0.0.1:1"}, keyOf(1));
  Raw misaddressed(at, &elsewhere);
  EXPECT_THROW(b->recv({MessageKind::kActivation, 0}, be), Timeout);
  EXPECT_EQ(b->stats().rejects, 4u);
  EXPECT_NE(b->stats().last_reject.find("addressed to another endpoint"), std::string::npos)
      << b->stats().last_reject;

  LinkOptions o;
  o.bind = "tcp://127.0.0.1:*";
  o.peer_stage = 1;
  SocketLink a(o, keyOf(1));
  a.connect(at);
  a.send({MessageKind::kActivation, 0}, toDevice(be, {2}, {1.5f, -2.0f}));
  b->setTimeout(5s);
  EXPECT_EQ(toHost(b->recv({MessageKind::kActivation, 0}, be)), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(b->stats().rejects, 4u);
}

// More silent connections than the link holds unheard (8): the oldest are dropped, each
// counted, and the peer that says its hello is still admitted.
TEST(SocketLinkHostileTest, AFloodOfSilentConnectionsDoesNotLockThePeerOut) {
  auto b = listening(10s);
  const std::string at = b->endpoint();
  std::vector<float> got;
  std::thread receiver([&] {  // accepting all the while: more than the backlog can connect
    cpu::CpuBackend rbe;
    got = toHost(b->recv({MessageKind::kActivation, 0}, rbe));
  });
  std::vector<std::unique_ptr<Raw>> silent;
  for (int i = 0; i < 12; ++i) silent.push_back(std::make_unique<Raw>(at, nullptr));
  LinkOptions o;
  o.bind = "tcp://127.0.0.1:*";
  o.peer_stage = 1;
  SocketLink a(o, keyOf(1));
  a.connect(at);
  cpu::CpuBackend be;
  a.send({MessageKind::kActivation, 0}, toDevice(be, {1}, {3.0f}));
  receiver.join();
  EXPECT_EQ(got, std::vector<float>{3.0f});
  EXPECT_EQ(b->stats().rejects, 5u);  // 13 connections, 8 held: the 5 oldest dropped
  EXPECT_NE(b->stats().last_reject.find("closed unheard"), std::string::npos)
      << b->stats().last_reject;
}

// Each case: a hello that proves the key, then a message that does not hold.
TEST(SocketLinkHostileTest, AlteredReplayedOrOversizedMessagesEndTheLink) {
  cpu::CpuBackend be;
  const Tensor t = toDevice(be, {3}, {1, 2, 3});
  struct Case {
    const char* name;
    std::function<std::vector<uint8_t>(Sealer&)> bytes;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"altered",
       [&](Sealer& s) {
         auto f = frame(t, 0, &s);
         f.back() ^= 1;
         return f;
       },
       "failed to open"},
      {"replayed",
       [&](Sealer& s) {
         auto f = frame(t, 0, &s);
         auto again = f;
         f.insert(f.end(), again.begin(), again.end());
         return f;
       },
       "failed to open"},
      {"oversized",
       [&](Sealer&) {
         std::vector<uint8_t> f(16, 0);
         f[3] = 0x7f;  // a header of about 2 GiB
         return f;
       },
       "out of step"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto b = listening(2s);
    const HelloBytes hello = writeHello({true, 0, 1, 0, b->endpoint()}, keyOf(1));
    Raw sender(b->endpoint(), &hello);
    Sealer seal(keyOf(1), hello);
    sender.write(c.bytes(seal));
    if (std::string(c.name) == "replayed") {  // the first copy is the real message
      EXPECT_EQ(toHost(b->recv({MessageKind::kActivation, 0}, be)), (std::vector<float>{1, 2, 3}));
    }
    expectThrowWith<IoError>([&] { b->recv({MessageKind::kActivation, 1}, be); }, {c.says});
    // The link stays ended; the process and the link object are fine.
    EXPECT_THROW(b->recv({MessageKind::kActivation, 1}, be), IoError);
  }
}

// In the clear (a private ipc folder's links), a header that fails verification is
// refused and counted, and the next message still arrives.
TEST(SocketLinkHostileTest, ABadHeaderIsRejectedAndTheLinkLivesOn) {
  cpu::CpuBackend be;
  LinkOptions o;
  o.bind = "tcp://127.0.0.1:*";
  o.stage = 1;
  o.timeout = 5s;
  SocketLink b(o);
  const HelloBytes hello = writeHello({false, 0, 1, 0, b.endpoint()}, std::nullopt);
  Raw sender(b.endpoint(), &hello);
  std::vector<uint8_t> bad(16, 0);
  bad[0] = 8;  // an 8-byte header of junk, a 4-byte payload
  bad[8] = 4;
  bad.insert(bad.end(), 12, 0xee);
  sender.write(bad);
  sender.write(frame(toDevice(be, {1}, {7}), 3, nullptr));
  EXPECT_EQ(toHost(b.recv({MessageKind::kActivation, 3}, be)), std::vector<float>{7});
  EXPECT_EQ(b.stats().rejects, 1u);
}

TEST(SocketLinkOptionsTest, BadOptionsAreNamed) {
  LinkOptions o;
  o.bind = "udp://127.0.0.1:5";
  expectThrowWith<InvalidArgument>([&] { SocketLink l(o); }, {"'udp://127.0.0.1:5'"});
  o.bind = "tcp://127.0.0.1:*";
  o.curve_secret_key = "x";
  expectThrowWith<InvalidArgument>([&] { SocketLink l(o); }, {"CurveZMQ"});
  o.curve_secret_key.clear();
  SocketLink l(o);
  cpu::CpuBackend be;
  expectThrowWith<InvalidArgument>([&] { l.send({}, be.zeros({1})); }, {"no peer to send to"});
}

}  // namespace
}  // namespace tandem::transport
