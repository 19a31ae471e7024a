// The coordinator's listener under connections without the run's key: idle ones, ones
// that send a byte and stall, ones with the wrong key. Workers with the key still get
// through, each handshake on its own thread.
#include "runtime/control/listener.h"

#include <gtest/gtest.h>

#include <future>
#include <vector>

#include "core/error.h"
#include "tests/runtime/flood.h"

namespace tandem::runtime {
namespace {

using namespace std::chrono_literals;
using testing::IdleFlood;

// `n` clients with `key` connecting at once, as workers do (trying again when closed
// unanswered); the listener must hand out all of them within `within`. Returns how many
// it handed out.
int connectAll(Listener& listener, const ClusterKey& key, int n, std::chrono::seconds within) {
  std::vector<std::future<std::unique_ptr<Channel>>> clients;
  for (int i = 0; i < n; ++i)
    clients.push_back(std::async(std::launch::async, [&] {
      return connectChannelRetrying(listener.endpoint(), key, HandshakeOptions{});
    }));
  int got = 0;
  const auto until = std::chrono::steady_clock::now() + within;
  while (got < n && std::chrono::steady_clock::now() < until)
    if (listener.accept(100ms)) ++got;
  for (auto& c : clients) {
    try {
      c.get();
    } catch (const Error&) {  // counted by `got` missing it
    }
  }
  return got;
}

// 200 idle connections and 100 that sent one byte, reopened as the listener drops them
// (after the 1 s hello deadline, or evicted to make room): 8 workers connecting at once
// are all handed out, three times over, well within the workers' connect time.
TEST(ListenerTest, AFloodWithoutTheKeyDoesNotKeepTheWorkersOut) {
  const ClusterKey key = generateClusterKey();
  HandshakeOptions o;
  o.timeout = 1s;
  Listener listener("127.0.0.1:0", key, o);
  {
    IdleFlood idle(listener.endpoint(), 200);
    IdleFlood one_byte(listener.endpoint(), 100, /*first_byte=*/true);
    for (int round = 0; round < 3; ++round)
      EXPECT_EQ(connectAll(listener, key, 8, 10s), 8) << "round " << round;
    EXPECT_GT(one_byte.reopened(), 0u) << "the listener never dropped a stalled connection";
  }
  const AdmissionStats s = listener.stats();
  EXPECT_GT(s.refused + s.evicted, 0u);
  std::printf("refused %llu, evicted %llu\n", static_cast<unsigned long long>(s.refused),
              static_cast<unsigned long long>(s.evicted));
}

// Handshakes do not wait for each other: with as many stalled handshakes as the listener
// has slots, a worker is still handed out (in place of an idle one) long before the
// stalled ones time out.
TEST(ListenerTest, StalledHandshakesDoNotHoldUpTheNextWorker) {
  const ClusterKey key = generateClusterKey();
  HandshakeOptions o;
  o.timeout = 20s;  // the stalled ones would hold their slots for all of the test
  AdmissionOptions a;
  a.max_pending = 4;
  a.max_pending_per_source = 4;
  Listener listener("127.0.0.1:0", key, o, a);
  IdleFlood stalled(listener.endpoint(), 4, /*first_byte=*/true);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(connectAll(listener, key, 2, 10s), 2);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_GT(listener.stats().evicted, 0u);
}

// A peer with another key is refused and counted; the listener goes on.
TEST(ListenerTest, APeerWithAnotherKeyIsRefusedAndTheNextIsServed) {
  const ClusterKey key = generateClusterKey();
  Listener listener("127.0.0.1:0", key, HandshakeOptions{});
  EXPECT_THROW(connectChannel(listener.endpoint(), generateClusterKey(), HandshakeOptions{}),
               HandshakeRefused);
  EXPECT_EQ(listener.accept(200ms), nullptr);
  EXPECT_EQ(connectAll(listener, key, 1, 10s), 1);
  EXPECT_GE(listener.stats().refused, 1u);
}

}  // namespace
}  // namespace tandem::runtime
