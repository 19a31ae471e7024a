// Groups, in-process and over links (tcp): every collective against a serial reference
// for world sizes 1, 2, 3, 4, 7 and element counts 0, 1, 7, 1000, 1,048,577
// (integer-valued data, so sums are exact — under fp16 and bf16 chunks too); results
// bitwise identical across ranks and runs with arbitrary floats; timeouts name the
// missing rank; ranks out of step are told so.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/spin.h"
#include "tests/test_util.h"
#include "tests/transport/group_util.h"
#include "tests/transport/tcp_probe.h"
#include "transport/curve.h"
#include "transport/local_group.h"
#include "transport/local_tcp.h"
#include "transport/socket_group.h"
#include "transport/zmq_group.h"

namespace tandem::transport {
namespace {

using namespace std::chrono_literals;
using test::makeRanks;
using test::Ranks;
using testing::congestionOfConnectedTcpSockets;
using testing::expectNoErrors;
using testing::expectThrowWith;
using testing::loopbackPair;
using testing::onThreads;
using testing::systemCongestion;

// Runs fn(rank, group) on one thread per rank.
std::vector<std::exception_ptr> onRanks(Ranks& ranks, const std::function<void(int, Group&)>& fn) {
  return onThreads(static_cast<int>(ranks.size()),
                   [&](int r) { fn(r, ranks[static_cast<size_t>(r)]); });
}

// Integer-valued, different on every rank and element, negative ones too.
std::vector<float> rankData(int rank, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i)
    v[i] = static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13) % 41) - 20);
  return v;
}

std::vector<float> reference(const std::vector<std::vector<float>>& in, ReduceOp op) {
  std::vector<float> out = in[0];
  for (size_t r = 1; r < in.size(); ++r)
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = op == ReduceOp::kMax ? std::max(out[i], in[r][i]) : out[i] + in[r][i];
  if (op == ReduceOp::kMean && in.size() > 1)
    for (float& x : out) x = x / static_cast<float>(in.size());
  return out;
}

struct GroupShape {
  int world;
  size_t count;
};

class GroupTest : public ::testing::TestWithParam<std::tuple<std::string, GroupShape>> {};

const GroupShape kShapes[] = {{1, 0}, {1, 1}, {1, 7}, {1, 1000}, {1, 1048577},
                              {2, 0}, {2, 1}, {2, 7}, {2, 1000}, {2, 1048577},
                              {3, 0}, {3, 1}, {3, 7}, {3, 1000}, {3, 1048577},
                              {4, 0}, {4, 1}, {4, 7}, {4, 1000}, {4, 1048577},
                              {7, 0}, {7, 1}, {7, 7}, {7, 1000}, {7, 1048577}};

INSTANTIATE_TEST_SUITE_P(WorldsAndCounts, GroupTest,
                         ::testing::Combine(::testing::Values("local", "tcp", "tcp-fp16", "socket",
                                                              "socket-bf16", "socket-ipc"),
                                            ::testing::ValuesIn(kShapes)),
                         [](const auto& info) {
                           std::string kind = std::get<0>(info.param);
                           std::replace(kind.begin(), kind.end(), '-', '_');
                           const GroupShape s = std::get<1>(info.param);
                           return kind + "_world" + std::to_string(s.world) + "_count" +
                                  std::to_string(s.count);
                         });

TEST_P(GroupTest, AllreduceMatchesTheSerialReference) {
  const auto [kind, shape] = GetParam();
  const auto [world, count] = shape;
  Ranks groups = makeRanks(kind, world);
  std::vector<std::vector<float>> in;
  for (int r = 0; r < world; ++r) in.push_back(rankData(r, count));
  for (AllreduceAlgorithm algorithm :
       {AllreduceAlgorithm::kDirect, AllreduceAlgorithm::kRing, AllreduceAlgorithm::kAuto})
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
      const std::vector<float> want = reference(in, op);
      std::vector<std::vector<float>> data = in;
      AllreduceOptions o;
      o.tag = 5;
      o.op = op;
      o.algorithm = algorithm;
      expectNoErrors(onRanks(groups, [&](int r, Group& g) { allreduce(g, data[r], o); }));
      // fp16 and bf16 chunks carry these integers exactly, but not a mean's fractions:
      // there, every rank must still hold the same values, close to the reference (|mean|
      // <= 20: fp16 within 2^-11, bf16 within 2^-8 of it).
      const bool rounded =
          (kind.ends_with("fp16") || kind.ends_with("bf16")) && op == ReduceOp::kMean;
      const double bound = kind.ends_with("bf16") ? 0.08 : 0.01;
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(data[r] == (rounded ? data[0] : want))
            << "rank " << r << " " << reduceOpName(op) << " algorithm "
            << static_cast<int>(algorithm);
        for (size_t i = 0; rounded && i < count; i += 101) {
          EXPECT_NEAR(data[r][i], want[i], bound) << i;
        }
      }
    }
}

TEST_P(GroupTest, ReduceScatterAndAllGatherMatchTheReference) {
  const auto [kind, shape] = GetParam();
  const auto [world, count] = shape;
  Ranks groups = makeRanks(kind, world);
  std::vector<std::vector<float>> in;
  for (int r = 0; r < world; ++r) in.push_back(rankData(r, count));
  const std::vector<float> sum = reference(in, ReduceOp::kSum);
  std::vector<std::vector<float>> data = in;
  expectNoErrors(onRanks(groups, [&](int r, Group& g) { reduceScatter(g, data[r]); }));
  for (int r = 0; r < world; ++r) {
    const Slice s = sliceOf(count, world, r);
    for (size_t i = 0; i < count; ++i) {
      const float want = i >= s.begin && i < s.end ? sum[i] : in[r][i];  // the rest as it was
      ASSERT_EQ(data[r][i], want) << "rank " << r << " element " << i;
    }
  }
  // All-gather of the reduced slices completes the allreduce.
  expectNoErrors(onRanks(groups, [&](int r, Group& g) { allGather(g, data[r]); }));
  for (int r = 0; r < world; ++r) EXPECT_TRUE(data[r] == sum) << "rank " << r;
}

TEST_P(GroupTest, RootedCollectivesMatchTheReference) {
  const auto [kind, shape] = GetParam();
  const auto [world, count] = shape;
  Ranks groups = makeRanks(kind, world);
  std::vector<std::vector<float>> in;
  for (int r = 0; r < world; ++r) in.push_back(rankData(r, count));
  const int root = world - 1;
  RootOptions ro;
  ro.root = root;

  std::vector<std::vector<float>> data = in;
  expectNoErrors(onRanks(groups, [&](int r, Group& g) { broadcast(g, data[r], ro); }));
  for (int r = 0; r < world; ++r) EXPECT_TRUE(data[r] == in[root]) << "broadcast, rank " << r;

  data = in;
  ReduceOptions rd;
  rd.root = root;
  rd.op = ReduceOp::kMax;
  expectNoErrors(onRanks(groups, [&](int r, Group& g) { reduce(g, data[r], rd); }));
  for (int r = 0; r < world; ++r)
    EXPECT_TRUE(data[r] == (r == root ? reference(in, ReduceOp::kMax) : in[r]))
        << "reduce, rank " << r;

  std::vector<float> gathered(static_cast<size_t>(world) * count, -99.0f), expect;
  for (const auto& v : in) expect.insert(expect.end(), v.begin(), v.end());
  expectNoErrors(onRanks(groups, [&](int r, Group& g) {
    gather(g, in[r], r == root ? std::span<float>(gathered) : std::span<float>(), ro);
  }));
  EXPECT_TRUE(gathered == expect) << "gather";

  std::vector<std::vector<float>> parts(static_cast<size_t>(world), std::vector<float>(count));
  expectNoErrors(onRanks(groups, [&](int r, Group& g) {
    scatter(g, r == root ? std::span<const float>(expect) : std::span<const float>(), parts[r], ro);
  }));
  for (int r = 0; r < world; ++r) EXPECT_TRUE(parts[r] == in[r]) << "scatter, rank " << r;
  expectNoErrors(onRanks(groups, [&](int, Group& g) { barrier(g); }));
}

// A reduce told it is part of an allreduce's buffer (ReduceOptions::allreduce_count)
// gives its root that part of the allreduce's bits — ZeRO's gradients reduced into their
// owners are the plain replicas' sums: arbitrary floats, parts across the ring's slices,
// each into another root, direct and ring, 3 and 4 ranks, in-process and over links.
TEST(GroupDeterminismTest, AReduceOfAPartOfAnAllreduceGivesItsBits) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (const int world : {3, 4})
    for (const size_t count : {size_t{1001}, size_t{100003}})  // direct, ring (kAuto)
      for (const std::string kind : {"local", "tcp", "socket"}) {
        SCOPED_TRACE(kind + ", " + std::to_string(world) + " ranks, " + std::to_string(count));
        std::vector<std::vector<float>> in(static_cast<size_t>(world), std::vector<float>(count));
        for (auto& v : in)
          for (float& x : v) x = dist(rng) * 1e3f;
        Ranks groups = makeRanks(kind, world);
        std::vector<std::vector<float>> summed = in;
        expectNoErrors(onRanks(groups, [&](int r, Group& g) { allreduce(g, summed[r]); }));
        // Four parts, the middle ones crossing slices of the ring.
        const size_t cuts[] = {0, count / 5, count / 2 + 3, count - 7, count};
        std::vector<std::vector<float>> data = in;
        expectNoErrors(onRanks(groups, [&](int r, Group& g) {
          for (size_t k = 0; k + 1 < std::size(cuts); ++k) {
            ReduceOptions o;
            o.tag = 20 + k;
            o.root = static_cast<int>(k) % world;
            o.allreduce_count = count;
            o.allreduce_offset = cuts[k];
            reduce(g, std::span<float>(data[r]).subspan(cuts[k], cuts[k + 1] - cuts[k]), o);
          }
        }));
        for (size_t k = 0; k + 1 < std::size(cuts); ++k) {
          const int root = static_cast<int>(k) % world;
          for (size_t i = cuts[k]; i < cuts[k + 1]; ++i)
            ASSERT_EQ(std::memcmp(&data[root][i], &summed[0][i], sizeof(float)), 0)
                << "part " << k << " element " << i;
        }
      }
  // A part that does not lie inside the allreduce it names is refused.
  Ranks two = makeRanks("tcp", 2);
  std::vector<std::vector<float>> data(2, std::vector<float>(10, 1.0f));
  const std::vector<std::exception_ptr> errors = onRanks(two, [&](int r, Group& g) {
    ReduceOptions o;
    o.allreduce_count = 12;
    o.allreduce_offset = 5;
    reduce(g, data[r], o);
  });
  ASSERT_TRUE(errors[0] != nullptr);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("elements [5, 15) of an allreduce of 12"),
              std::string::npos)
        << e.what();
  }
}

// Arbitrary floats (sums round): every rank gets the same bits, on every run. The
// in-process group and the direct algorithm add in rank order (the reference's bits);
// the ring adds each slice around the ring, another fixed order.
TEST(GroupDeterminismTest, AllreduceIsBitwiseIdenticalAcrossRanksAndRuns) {
  const int world = 4;
  const size_t count = 300001;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<std::vector<float>> in(world, std::vector<float>(count));
  for (auto& v : in)
    for (float& x : v) x = dist(rng) * 1e3f;
  const std::vector<float> rank_order = reference(in, ReduceOp::kSum);
  for (const std::string kind : {"local", "tcp", "socket"}) {
    Ranks groups = makeRanks(kind, world);
    for (AllreduceAlgorithm a : {AllreduceAlgorithm::kDirect, AllreduceAlgorithm::kRing}) {
      const bool ring_order = kind != "local" && a == AllreduceAlgorithm::kRing;
      std::vector<float> first;
      for (int run = 0; run < 3; ++run) {
        std::vector<std::vector<float>> data = in;
        AllreduceOptions o;
        o.algorithm = a;
        expectNoErrors(onRanks(groups, [&](int r, Group& g) { allreduce(g, data[r], o); }));
        if (run == 0) first = data[0];
        const std::vector<float>& want = ring_order ? first : rank_order;
        for (int r = 0; r < world; ++r)
          ASSERT_EQ(std::memcmp(data[r].data(), want.data(), count * sizeof(float)), 0)
              << kind << " algorithm " << static_cast<int>(a) << " run " << run << " rank " << r;
      }
      if (ring_order) {  // a real sum, only rounded otherwise
        for (size_t i = 0; i < count; i += 997) EXPECT_NEAR(first[i], rank_order[i], 1e-2) << i;
      }
    }
  }
}

// The in-process allreduce's ranks claim blocks from counters shared by every call;
// each rank works out where a call's claims start from the calls before it. Many calls
// in a row, of sizes around the block sizes and with other collectives between them,
// with more ranks than this machine has cores (some are off their core while others
// take their blocks): every result must still be the serial reference, on every rank.
TEST(GroupSequenceTest, InProcessAllreducesInARowKeepTheirBlocksApart) {
  const int world = 5;
  Ranks groups = makeRanks("local", world);
  const size_t counts[] = {16385, 0, 300000, 1, 65537, 2048 * 5 * 4, 2048 * 5 * 4 + 1, 1048577};
  for (int round = 0; round < 3; ++round)
    for (size_t count : counts) {
      std::vector<std::vector<float>> in;
      for (int r = 0; r < world; ++r) in.push_back(rankData(r + round, count));
      const std::vector<float> want = reference(in, ReduceOp::kSum);
      std::vector<std::vector<float>> data = in, scattered = in;
      AllreduceOptions o;
      o.algorithm = AllreduceAlgorithm::kRing;
      o.tag = count;
      expectNoErrors(onRanks(groups, [&](int r, Group& g) {
        allreduce(g, data[r], o);
        reduceScatter(g, scattered[r]);
        barrier(g);
      }));
      for (int r = 0; r < world; ++r)
        ASSERT_TRUE(data[r] == want) << "round " << round << " count " << count << " rank " << r;
    }
}

// Across processes: a rank that never calls is named by the others' Timeout; ranks that
// disagree on the count are told so.
TEST(GroupFailureTest, AcrossProcessesAMissingRankIsNamedAndCountsMustAgree) {
  for (const std::string kind : {"tcp", "socket"}) {
    SCOPED_TRACE(kind);
    Ranks groups = makeRanks(kind, 3);
    std::vector<std::vector<float>> data(3, std::vector<float>(10, 1.0f));
    AllreduceOptions o;
    o.tag = 4;
    o.timeout = 300ms;
    const auto t0 = std::chrono::steady_clock::now();
    auto errors = onRanks(groups, [&](int r, Group& g) {
      if (r != 2) allreduce(g, data[r], o);
    });
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    for (int r : {0, 1}) {
      ASSERT_TRUE(errors[static_cast<size_t>(r)]) << "rank " << r;
      expectThrowWith<Timeout>([&] { std::rethrow_exception(errors[static_cast<size_t>(r)]); },
                               {"allreduce (tag 4): rank 2 of 3 sent nothing within 300 ms"});
    }
    Ranks pair = makeRanks(kind, 2);
    std::vector<float> a(8), b(9);
    errors = onRanks(pair, [&](int r, Group& g) {
      allreduce(g, r == 0 ? std::span<float>(a) : std::span<float>(b));
    });
    expectThrowWith<InvalidArgument>([&] { std::rethrow_exception(errors[0]); },
                                     {"rank 1 sent 9 values where this rank has 8"});
    expectThrowWith<InvalidArgument>([&] { std::rethrow_exception(errors[1]); },
                                     {"rank 0 sent 8 values where this rank has 9"});
  }
  // The rendezvous names who never came.
  Context ctx;
  cpu::CpuBackend host;
  ZmqGroupOptions zo;
  zo.rank = 0;
  zo.size = 2;
  SocketGroupOptions so;
  so.rank = 0;
  so.size = 2;
  for (int socket : {0, 1})
    expectThrowWith<Timeout>(
        [&] {
          const Exchange e = fileExchange(testing::freshDir("tandem-lonely"), 0, 2, 200ms);
          if (socket) makeSocketGroup(so, e);
          if (!socket) makeZmqGroup(ctx, host, zo, e);
        },
        {"rendezvous", "rank(s) 1 of 2 did not arrive within 200 ms"});
  zo.codec = Codec::kI8;
  so.codec = Codec::kI8;
  expectThrowWith<InvalidArgument>([&] { makeZmqGroup(ctx, host, zo, {}); }, {"int8 chunks"});
  expectThrowWith<InvalidArgument>([&] { makeSocketGroup(so, {}); }, {"int8 chunks"});
}

TEST(ZmqGroupTest, CurveLinksSumAndAdmitOnlyTheRanksHoldingTheKey) {
  if (!curveSupported()) GTEST_SKIP() << "this libzmq has no CurveZMQ";
  const CurveKeyPair run = generateCurveKeyPair();
  const size_t count = 1048577;
  Ranks ranks = makeRanks("tcp", 3, 30s, {run, run, run});
  std::vector<std::vector<float>> data = {rankData(0, count), rankData(1, count),
                                          rankData(2, count)};
  const std::vector<float> want = reference(data, ReduceOp::kSum);
  expectNoErrors(onRanks(ranks, [&](int r, Group& g) {
    allreduce(g, data[static_cast<size_t>(r)], AllreduceOptions{});
  }));
  for (const auto& d : data) EXPECT_TRUE(d == want);
  // A rank holding another key pair gets nothing through, and is not heard: the others
  // time out waiting for it.
  Ranks split = makeRanks("tcp", 2, 1s, {run, generateCurveKeyPair()});
  std::vector<float> a(100, 1.0f), b(100, 2.0f);
  AllreduceOptions o;
  o.timeout = 1s;
  const auto errors = onRanks(split, [&](int r, Group& g) { allreduce(g, r == 0 ? a : b, o); });
  for (const auto& e : errors) EXPECT_TRUE(e) << "a rank without the key was heard";
  EXPECT_EQ(a, std::vector<float>(100, 1.0f));
  EXPECT_EQ(b, std::vector<float>(100, 2.0f));
}

TEST(GroupFailureTest, ARankThatNeverArrivesIsNamedAndNothingHangs) {
  Ranks groups = makeRanks("local", 3);
  std::vector<float> a(10, 1.0f), b(10, 1.0f);
  AllreduceOptions o;
  o.tag = 9;
  o.timeout = 200ms;
  const auto t0 = std::chrono::steady_clock::now();
  auto errors = onRanks(groups, [&](int r, Group& g) {
    if (r == 0) allreduce(g, a, o);
    if (r == 1) allreduce(g, b, o);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  for (int r : {0, 1}) {
    ASSERT_TRUE(errors[static_cast<size_t>(r)]) << "rank " << r;
    expectThrowWith<Timeout>([&] { std::rethrow_exception(errors[static_cast<size_t>(r)]); },
                             {"allreduce (tag 9): rank 2 of 3 did not arrive in time"});
  }
  // The late rank, and any later call, learn why instead of waiting.
  expectThrowWith<Timeout>([&] { barrier(groups[2]); }, {"rank 2 of 3 did not arrive"});
  expectThrowWith<Timeout>([&] { allreduce(groups[0], a, o); }, {"the group is broken"});
}

TEST(GroupFailureTest, RanksOutOfStepAreToldSo) {
  Ranks groups = makeRanks("local", 2);
  std::vector<float> a(8), b(8), c(9);
  auto errors = onRanks(groups, [&](int r, Group& g) {
    AllreduceOptions o;
    o.tag = static_cast<uint64_t>(r);
    allreduce(g, r == 0 ? std::span<float>(a) : std::span<float>(b), o);
  });
  for (auto& e : errors)
    expectThrowWith<InvalidArgument>(
        [&] { std::rethrow_exception(e); },
        {"collectives out of step: rank 0 called allreduce (tag 0", "rank 1 allreduce (tag 1"});
  // The group is still usable: both raised at the same point.
  errors = onRanks(groups, [&](int r, Group& g) {
    allreduce(g, r == 0 ? std::span<float>(a) : std::span<float>(c));
  });
  for (auto& e : errors)
    expectThrowWith<InvalidArgument>([&] { std::rethrow_exception(e); },
                                     {"8 elements", "9 elements"});
  std::vector<float> out(3);
  errors = onRanks(groups, [&](int r, Group& g) {
    RootOptions o;
    o.root = 0;
    gather(g, a, r == 0 ? std::span<float>(out) : std::span<float>(), o);
  });
  for (auto& e : errors)
    expectThrowWith<InvalidArgument>(
        [&] { std::rethrow_exception(e); },
        {"gather (tag 0): the root's output holds 3 elements, not 2 x 8"});
  expectThrowWith<InvalidArgument>([] { makeLocalGroup(0); }, {"a group of 0 ranks"});
}

TEST(GroupFailureTest, SlicesCoverTheBufferInOrder) {
  for (int world : {1, 2, 3, 7})
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
      size_t next = 0;
      for (int r = 0; r < world; ++r) {
        const Slice s = sliceOf(count, world, r);
        EXPECT_EQ(s.begin, next);
        EXPECT_LE(s.size(), count / static_cast<size_t>(world) + 1);
        next = s.end;
      }
      EXPECT_EQ(next, count);
    }
  expectThrowWith<InvalidArgument>([] { sliceOf(4, 2, 2); }, {"slice of rank 2 in a group of 2"});
}

}  // namespace
}  // namespace tandem::transport
