// The collectives' algorithms over the pair seam (core/comm/collectives.h), run over a
// Pairs written here (mailboxes in memory, threads as ranks): whatever moves the bytes,
// the algorithms give every rank the same, right result. The transports' own Pairs
// (sockets, ZeroMQ) are tested with these algorithms in tests/transport/group_test.cpp.
#include "core/comm/collectives.h"

#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "core/error.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using testing::expectNoErrors;
using testing::onThreads;

// Mailboxes shared by the ranks: messages from one rank to another, in order.
struct Post {
  struct Message {
    std::string what;
    uint64_t tag, seq;
    int step;
    std::vector<float> values;
  };
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::pair<int, int>, std::deque<Message>> boxes;  // (from, to)
};

// Pairs over the mailboxes. A receive is handed over `piece` values at a time (odd, so
// that the algorithms' offsets are exercised). `round` stands for a reduced-precision
// wire: values travel as multiples of 1/8.
class MailboxPairs final : public Pairs {
 public:
  MailboxPairs(Post& post, int rank, int size, bool round)
      : post_(post), rank_(rank), size_(size), round_(round) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void transfer(const Transfer& t, std::span<const PairSend> sends,
                std::span<const PairRecv> recvs) override {
    {
      std::lock_guard lock(post_.mutex);
      for (const PairSend& s : sends) {
        std::vector<float> values(s.data.begin(), s.data.end());
        asSent(values);
        post_.boxes[{rank_, s.peer}].push_back({t.what, t.tag, t.seq, t.step, std::move(values)});
      }
    }
    post_.cv.notify_all();
    for (const PairRecv& r : recvs) {
      std::unique_lock lock(post_.mutex);
      std::deque<Post::Message>& box = post_.boxes[{r.peer, rank_}];
      if (!post_.cv.wait_until(lock, t.deadline, [&] { return !box.empty(); }))
        throw Timeout(silentPeer(t, r.peer, size_));
      Post::Message m = std::move(box.front());
      box.pop_front();
      lock.unlock();
      TANDEM_CHECK_MSG(m.what == t.what && m.tag == t.tag && m.seq == t.seq && m.step == t.step,
                       InvalidArgument,
                       "out of step: rank " << r.peer << " sent " << m.what << " tag " << m.tag);
      TANDEM_CHECK_MSG(m.values.size() == r.count, InvalidArgument,
                       callName(t) << ": rank " << r.peer << " sent " << m.values.size()
                                   << " values where this rank has " << r.count);
      for (size_t at = 0; at < r.count; at += kPiece) {
        const std::span<const float> piece =
            std::span<const float>(m.values).subspan(at, std::min(kPiece, r.count - at));
        if (r.take) {
          r.take(at, piece);
        } else {
          std::copy(piece.begin(), piece.end(), r.into.begin() + static_cast<std::ptrdiff_t>(at));
        }
      }
    }
  }

  void asSent(std::span<float> x) const override {
    if (round_)
      for (float& v : x) v = std::round(v * 8) / 8;
  }

 private:
  static constexpr size_t kPiece = 7;
  Post& post_;
  const int rank_, size_;
  const bool round_;
};

struct World {
  Post post;
  std::vector<std::unique_ptr<MailboxPairs>> pairs;
  World(int size, bool round = false) {
    for (int r = 0; r < size; ++r)
      pairs.push_back(std::make_unique<MailboxPairs>(post, r, size, round));
  }
  Pairs& operator[](int r) { return *pairs[static_cast<size_t>(r)]; }
};

// Rank r's data: small integers, so that sums are exact in any order.
std::vector<float> dataOf(int r, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((r + 1) * 3 + (i % 11));
  return v;
}

class CollectivesTest : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

TEST_P(CollectivesTest, EveryCollectiveGivesEveryRankTheRightResult) {
  const auto [n, count] = GetParam();
  World world(n);
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(dataOf(r, count));
  for (AllreduceAlgorithm algorithm : {AllreduceAlgorithm::kRing, AllreduceAlgorithm::kDirect}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
      std::vector<std::vector<float>> data = inputs;
      expectNoErrors(onThreads(n, [&](int r) {
        AllreduceOptions o;
        o.op = op;
        o.algorithm = algorithm;
        o.timeout = 20s;
        allreduce(world[r], data[static_cast<size_t>(r)], o);
      }));
      for (size_t i = 0; i < count; ++i) {
        float want = op == ReduceOp::kMax ? -INFINITY : 0;
        for (int r = 0; r < n; ++r) {
          const float x = inputs[static_cast<size_t>(r)][i];
          want = op == ReduceOp::kMax ? std::max(want, x) : want + x;
        }
        if (op == ReduceOp::kMean) want /= static_cast<float>(n);
        for (int r = 0; r < n; ++r)
          ASSERT_EQ(data[static_cast<size_t>(r)][i], want)
              << "rank " << r << " element " << i << " op " << reduceOpName(op);
      }
    }
  }

  // reduce-scatter: rank r's slice is the sum; all-gather then gives everyone every slice.
  std::vector<std::vector<float>> data = inputs;
  expectNoErrors(onThreads(n, [&](int r) {
    reduceScatter(world[r], data[static_cast<size_t>(r)]);
    allGather(world[r], data[static_cast<size_t>(r)]);
  }));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += inputs[static_cast<size_t>(q)][i];
      ASSERT_EQ(data[static_cast<size_t>(r)][i], want) << "rank " << r << " element " << i;
    }

  // Rooted collectives with the last rank as root.
  const int root = n - 1;
  std::vector<std::vector<float>> gathered(static_cast<size_t>(n)),
      scattered(static_cast<size_t>(n), std::vector<float>(count));
  data = inputs;
  expectNoErrors(onThreads(n, [&](int r) {
    RootOptions o;
    o.root = root;
    const std::vector<float>& mine = inputs[static_cast<size_t>(r)];
    if (r == root) gathered[static_cast<size_t>(r)].resize(count * static_cast<size_t>(n));
    gather(world[r], mine, gathered[static_cast<size_t>(r)], o);
    scatter(world[r], gathered[static_cast<size_t>(r)], scattered[static_cast<size_t>(r)], o);
    broadcast(world[r], data[static_cast<size_t>(r)], o);
    barrier(world[r]);
  }));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(scattered[static_cast<size_t>(r)], inputs[static_cast<size_t>(r)])
        << "scatter to rank " << r;
    EXPECT_EQ(data[static_cast<size_t>(r)], inputs[static_cast<size_t>(root)])
        << "broadcast to rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldsAndCounts, CollectivesTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 7),
                                            ::testing::Values(size_t{0}, size_t{1}, size_t{13},
                                                              size_t{100003})));

// A wire that rounds: every rank ends with the same bits, its own contribution counted as
// the others received it.
TEST(CollectivesTest, ARoundingWireLeavesEveryRankWithTheSameBits) {
  for (int n : {2, 3, 5}) {
    World world(n, true);
    std::vector<std::vector<float>> data(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r)
      data[static_cast<size_t>(r)] = testing::randomVector(static_cast<uint64_t>(r), 1001);
    expectNoErrors(onThreads(n, [&](int r) {
      AllreduceOptions o;
      o.algorithm = AllreduceAlgorithm::kRing;
      allreduce(world[r], data[static_cast<size_t>(r)], o);
      o.algorithm = AllreduceAlgorithm::kDirect;
      allreduce(world[r], data[static_cast<size_t>(r)], o);
    }));
    for (int r = 1; r < n; ++r)
      EXPECT_EQ(std::memcmp(data[0].data(), data[static_cast<size_t>(r)].data(), 1001 * 4), 0)
          << n << " ranks: rank " << r << " differs from rank 0";
  }
}

// What the pairs raise reaches the caller; a rank that never calls is named; bad calls
// are refused before anything moves.
TEST(CollectivesTest, MismatchesTimeoutsAndBadCallsAreNamed) {
  World world(2);
  std::vector<float> a(5), b(6);
  const auto errors = onThreads(2, [&](int r) {
    AllreduceOptions o;
    o.algorithm = AllreduceAlgorithm::kDirect;
    o.timeout = 5s;
    allreduce(world[r], r == 0 ? std::span<float>(a) : std::span<float>(b), o);
  });
  ASSERT_TRUE(errors[0]);
  EXPECT_THROW(std::rethrow_exception(errors[0]), InvalidArgument);

  World lonely(2);
  AllreduceOptions o;
  o.timeout = 100ms;
  testing::expectThrowWith<Timeout>([&] { allreduce(lonely[0], a, o); },
                                    {"allreduce (tag 0): rank 1 of 2 sent nothing within 100 ms"});
  o.timeout = 0ms;
  testing::expectThrowWith<InvalidArgument>([&] { allreduce(lonely[0], a, o); },
                                            {"the timeout must be positive"});
  RootOptions ro;
  ro.root = 2;
  testing::expectThrowWith<InvalidArgument>([&] { broadcast(lonely[0], a, ro); },
                                            {"root 2 in a group of 2"});
  std::vector<float> out(7);
  ro.root = 0;
  testing::expectThrowWith<InvalidArgument>([&] { gather(lonely[0], a, out, ro); },
                                            {"the root's output holds 7 elements, not 2 x 5"});
}

// A Group made of pairs is a Group like any other, and gives its pairs back.
TEST(CollectivesTest, APairGroupForwardsToItsPairs) {
  Post post;
  std::vector<std::unique_ptr<Group>> groups;
  std::vector<Pairs*> raw;
  for (int r = 0; r < 3; ++r) {
    auto p = std::make_unique<MailboxPairs>(post, r, 3, false);
    raw.push_back(p.get());
    groups.push_back(makePairGroup(std::move(p)));
  }
  std::vector<std::vector<float>> data = {{1, 2}, {3, 4}, {5, 6}};
  expectNoErrors(onThreads(3, [&](int r) {
    EXPECT_EQ(groups[static_cast<size_t>(r)]->rank(), r);
    EXPECT_EQ(groups[static_cast<size_t>(r)]->size(), 3);
    allreduce(*groups[static_cast<size_t>(r)], data[static_cast<size_t>(r)]);
  }));
  for (const auto& d : data) EXPECT_EQ(d, (std::vector<float>{9, 12}));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(pairsOf(*groups[static_cast<size_t>(r)]), raw[static_cast<size_t>(r)]);
  EXPECT_THROW(makePairGroup(nullptr), InvalidArgument);
}

}  // namespace
}  // namespace tandem
