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
#include "tests/transport/tcp_probe.h"
#include "transport/curve.h"
#include "transport/local_group.h"
#include "transport/local_tcp.h"
#include "transport/socket_group.h"
#include "transport/zmq_group.h"

namespace tandem::transport {
namespace {

using namespace std::chrono_literals;
using testing::congestionOfConnectedTcpSockets;
using testing::expectThrowWith;
using testing::loopbackPair;
using testing::expectNoErrors;
using testing::onThreads;
using testing::systemCongestion;

// The ranks of one group, of either kind, with what they need to live.
struct Ranks {
  std::unique_ptr<Context> ctx;
  std::vector<std::unique_ptr<cpu::CpuBackend>> hosts;
  std::vector<std::unique_ptr<Group>> groups;
  std::shared_ptr<void> rendezvous;  // removes the rendezvous directory at the end
  size_t size() const { return groups.size(); }
  Group& operator[](size_t r) { return *groups[r]; }
};

// "local": the in-process group; "tcp", "tcp-fp16", "tcp-bf16", "ipc": over ZeroMQ links;
// "socket", "socket-fp16", "socket-bf16", "socket-ipc": over plain sockets.
// `curve`: each rank's CurveZMQ key pair (ZeroMQ kinds), empty for plain links.
Ranks makeRanks(const std::string& kind, int world,
                std::chrono::milliseconds link_timeout = std::chrono::seconds(30),
                const std::vector<CurveKeyPair>& curve = {}) {
  Ranks g;
  if (kind == "local") {
    g.groups = makeLocalGroup(world);
    return g;
  }
  static std::atomic<int> made{0};
  ++made;
  const std::string dir = testing::freshDir("tandem-group");
  g.rendezvous = std::shared_ptr<void>(nullptr, [dir](void*) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  });
  const bool socket = kind.starts_with("socket");
  const Codec codec = kind.ends_with("fp16")   ? Codec::kF16
                      : kind.ends_with("bf16") ? Codec::kBF16
                                               : Codec::kRaw;
  const std::string transport = kind.ends_with("ipc") ? "ipc" : "tcp";
  if (!socket) g.ctx = std::make_unique<Context>();
  g.groups.resize(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) g.hosts.push_back(std::make_unique<cpu::CpuBackend>());
  const auto errors = onThreads(world, [&](int r) {
    const Exchange exchange = fileExchange(dir, r, world, std::chrono::seconds(20));
    auto common = [&](auto& o) {  // what the two kinds of options share
      o.rank = r;
      o.size = world;
      o.transport = transport;
      o.ipc_dir = ::testing::TempDir();
      o.group_id = static_cast<uint64_t>(made.load());
      o.codec = codec;
    };
    if (socket) {
      SocketGroupOptions o;
      common(o);
      g.groups[static_cast<size_t>(r)] = makeSocketGroup(o, exchange);
      return;
    }
    ZmqGroupOptions o;
    common(o);
    o.link_timeout = link_timeout;
    if (!curve.empty()) {
      o.curve_secret_key = curve[static_cast<size_t>(r)].secret_key;
      o.curve_public_key = curve[static_cast<size_t>(r)].public_key;
    }
    g.groups[static_cast<size_t>(r)] =
        makeZmqGroup(*g.ctx, *g.hosts[static_cast<size_t>(r)], o, exchange);
  });
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return g;
}

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

struct Shape {
  int world;
  size_t count;
};

class GroupTest : public ::testing::TestWithParam<std::tuple<std::string, Shape>> {};

const Shape kShapes[] = {{1, 0}, {1, 1}, {1, 7}, {1, 1000}, {1, 1048577},
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
                           const Shape s = std::get<1>(info.param);
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

// Two socket-group ranks in this process, meeting through an in-memory exchange; `spy`
// sees every published address before the exchange returns.
std::vector<std::unique_ptr<Group>> socketPair(
    SocketGroupOptions o, const std::function<void(int, const std::string&)>& spy = {}) {
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::string> published(2);
  std::vector<std::unique_ptr<Group>> groups(2);
  const auto errors = onThreads(2, [&](int r) {
    SocketGroupOptions mine = o;
    mine.rank = r;
    mine.size = 2;
    groups[static_cast<size_t>(r)] = makeSocketGroup(mine, [&](const std::string& address) {
      if (spy) spy(r, address);
      std::unique_lock lock(m);
      published[static_cast<size_t>(r)] = address;
      cv.notify_all();
      cv.wait(lock, [&] { return !published[0].empty() && !published[1].empty(); });
      return published;
    });
  });
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return groups;
}

// A raw tcp socket that connects to the socket-group rank 0 published `address` ("tcp
// HOST PORT") and greets it as rank 1 of 2 of `group_id` (socket_mesh.cpp's hello).
tcp::Socket greetAsRank1(const std::string& address, uint32_t group_id) {
  std::istringstream words(address);
  std::string kind, host, port;
  words >> kind >> host >> port;
  const auto deadline = tcp::Clock::now() + 5s;
  tcp::Socket s = tcp::connectTo(tcp::Address::resolve(host, port, false), {}, deadline,
                                 "greeting as rank 1");
  const uint32_t hello[6] = {0x4c454854, 2, 1, 0, group_id, 0};  // magic, size, from, to, group
  EXPECT_TRUE(tcp::writeAll(s.get(), hello, sizeof(hello), deadline, "rank 0"));
  return s;
}

// Over plain sockets a mismatch is seen in the message header: ranks that call with
// other tags are told so at once (not at the timeout), and the rest of the message is
// read and dropped, so the group goes on working.
TEST(SocketGroupTest, RanksOutOfStepAreToldSoAndTheGroupGoesOn) {
  auto groups = socketPair({});
  std::vector<float> a(100000, 1.0f), b(100000, 2.0f);
  auto errors = onThreads(2, [&](int r) {
    AllreduceOptions o;
    o.tag = static_cast<uint64_t>(r);
    o.timeout = 20s;
    allreduce(*groups[static_cast<size_t>(r)], r == 0 ? std::span<float>(a) : std::span<float>(b),
              o);
  });
  expectThrowWith<InvalidArgument>(
      [&] { std::rethrow_exception(errors[0]); },
      {"collectives out of step: rank 1 called allreduce (tag 1, call 0, step 0) where rank 0 "
       "called allreduce (tag 0, call 0, step 0)"});
  expectThrowWith<InvalidArgument>([&] { std::rethrow_exception(errors[1]); },
                                   {"rank 0 called allreduce (tag 0"});
  // What came was dropped, not summed in.
  EXPECT_TRUE(a == std::vector<float>(100000, 1.0f));
  EXPECT_TRUE(b == std::vector<float>(100000, 2.0f));
  // A direct allreduce with counts that differ: both told, both in step after.
  std::vector<float> c(5, 1.0f), d(6, 1.0f);
  errors = onThreads(2, [&](int r) {
    allreduce(*groups[static_cast<size_t>(r)], r == 0 ? std::span<float>(c) : std::span<float>(d));
  });
  expectThrowWith<InvalidArgument>(
      [&] { std::rethrow_exception(errors[0]); },
      {"allreduce (tag 0): rank 1 sent 6 values where this rank has 5"});
  // Then the same collectives, in step, give the sums.
  expectNoErrors(onThreads(2, [&](int r) {
    allreduce(*groups[static_cast<size_t>(r)], r == 0 ? std::span<float>(a) : std::span<float>(b));
    broadcast(*groups[static_cast<size_t>(r)],
              r == 0 ? std::span<float>(c) : std::span<float>(d).first(5));
  }));
  EXPECT_TRUE(a == std::vector<float>(100000, 3.0f));
  EXPECT_TRUE(b == a);
}

// A peer that goes away is named, and the group stays broken rather than hanging.
TEST(SocketGroupTest, APeerThatClosesIsNamedAndTheGroupStaysBroken) {
  auto groups = socketPair({});
  groups[1].reset();
  std::vector<float> a(1000, 1.0f);
  AllreduceOptions o;
  o.tag = 3;
  o.timeout = 5s;
  expectThrowWith<IoError>([&] { allreduce(*groups[0], a, o); },
                           {"allreduce (tag 3): rank 1 of 2"});
  expectThrowWith<IoError>([&] { barrier(*groups[0]); }, {"barrier (tag 0): the group is broken"});
}

// Unless told, a socket group spins as long as waitBeforeSleeping says for the ranks on
// this machine: every rank of these groups is, over loopback tcp or Unix sockets.
TEST(SocketGroupTest, TheSpinIsChosenFromTheRanksOnThisMachine) {
  for (const auto& [kind, world] :
       {std::pair<std::string, int>{"socket", 3}, {"socket-ipc", 2}, {"socket", 1}}) {
    SCOPED_TRACE(kind + " x " + std::to_string(world));
    Ranks ranks = makeRanks(kind, world);
    for (size_t r = 0; r < ranks.size(); ++r) {
      const SocketGroupChoices chose = socketGroupChoices(ranks[r]);
      EXPECT_EQ(chose.ranks_here, world);
      EXPECT_EQ(chose.spin, waitBeforeSleeping(world));
    }
  }
  SocketGroupOptions o;
  o.spin = 0us;  // told: kept, also where the default would spin
  for (const auto& g : socketPair(o)) {
    EXPECT_EQ(socketGroupChoices(*g).ranks_here, 2);
    EXPECT_EQ(socketGroupChoices(*g).spin, 0us);
  }
  const auto local = makeLocalGroup(2);
  expectThrowWith<InvalidArgument>([&] { socketGroupChoices(*local[0]); }, {"not a socket group"});
}

// Unix sockets: published paths may hold spaces; a path too long for a socket is refused.
TEST(SocketGroupTest, UnixSocketsAnywhere) {
  SocketGroupOptions o;
  o.transport = "ipc";
  o.ipc_dir = testing::freshDir("tandem group dir");
  auto groups = socketPair(o);
  std::vector<float> a(5, 1.0f), b(5, 2.0f);
  expectNoErrors(onThreads(2, [&](int r) {
    allreduce(*groups[static_cast<size_t>(r)], r == 0 ? std::span<float>(a) : std::span<float>(b));
  }));
  EXPECT_TRUE(a == std::vector<float>(5, 3.0f));
  o.ipc_dir = "/tmp/" + std::string(120, 'd');
  expectThrowWith<InvalidArgument>([&] { makeSocketGroup(o, {}); }, {"is longer than 107 bytes"});
}

// Rank 0 of a pair whose rank 1 is played by hand over a raw socket: bytes that are not
// a collective's message, a header with an unknown codec, another count, and a message
// cut short are each named, never a crash or a hang.
TEST(SocketGroupTest, AGarbledStreamIsNamed) {
  struct Header {  // socket_group.h's wire header
    uint32_t magic = 0x50524754;
    uint8_t codec = 0, collective = 0;  // raw; allreduce
    uint16_t step = 0;
    uint64_t seq = 0, tag = 0, count = 0;
  };
  static_assert(sizeof(Header) == 32);
  // Rank 0 and the raw socket standing for rank 1.
  auto pairWithHand = [](tcp::Socket& hand) {
    SocketGroupOptions o;
    o.size = 2;
    o.connect_timeout = 5s;
    return makeSocketGroup(o, [&](const std::string& mine) {
      hand = greetAsRank1(mine, 0);
      return std::vector<std::string>{mine, "tcp 127.0.0.1 1"};
    });
  };
  AllreduceOptions o;
  o.timeout = 300ms;
  std::vector<float> data(5, 1.0f);
  auto sendAll = [](const tcp::Socket& to, const void* p, size_t n) {
    EXPECT_TRUE(tcp::writeAll(to.get(), p, n, tcp::Clock::now() + 5s, "rank 0"));
  };
  {
    tcp::Socket hand;
    auto g = pairWithHand(hand);
    const std::string noise(32, 'x');
    sendAll(hand, noise.data(), noise.size());
    expectThrowWith<FormatError>([&] { allreduce(*g, data, o); },
                                 {"rank 1 of 2 sent bytes that are not a collective's message"});
    expectThrowWith<IoError>([&] { allreduce(*g, data, o); }, {"the group is broken"});
  }
  {
    tcp::Socket hand;
    auto g = pairWithHand(hand);
    Header h;
    h.codec = 9;
    h.count = 5;
    sendAll(hand, &h, sizeof(h));
    expectThrowWith<FormatError>([&] { allreduce(*g, data, o); }, {"not a collective's message"});
  }
  {
    tcp::Socket hand;
    auto g = pairWithHand(hand);
    Header h;
    h.count = 3;
    const float three[3] = {1, 2, 3};
    sendAll(hand, &h, sizeof(h));
    sendAll(hand, three, sizeof(three));
    expectThrowWith<InvalidArgument>(
        [&] { allreduce(*g, data, o); },
        {"allreduce (tag 0): rank 1 sent 3 values where this rank has 5"});
    EXPECT_TRUE(data == std::vector<float>(5, 1.0f));
    // In step again (call 1), but cut short: 32 + 8 of 52 bytes.
    h.seq = 1;
    h.count = 5;
    sendAll(hand, &h, sizeof(h));
    sendAll(hand, three, 8);
    expectThrowWith<Timeout>([&] { allreduce(*g, data, o); },
                             {"allreduce (tag 0): rank 1 of 2 sent 40 of 52 bytes within 300 ms"});
  }
}

// The rendezvous turns away connections that are not the group's and says so if the
// real peer never comes; addresses that cannot be read are refused.
TEST(SocketGroupTest, TheRendezvousTurnsStrangersAway) {
  // A stranger (group 99) connects to rank 0 before rank 1 does: the pair still forms.
  SocketGroupOptions o;
  o.group_id = 7;
  o.connect_timeout = 5s;
  auto stranger = [](const std::string& address) { return greetAsRank1(address, 99); };
  std::vector<tcp::Socket> strangers;
  auto groups = socketPair(o, [&](int r, const std::string& address) {
    if (r == 0) strangers.push_back(stranger(address));
  });
  std::vector<float> a(3, 1.0f), b(3, 2.0f);
  expectNoErrors(onThreads(2, [&](int r) {
    allreduce(*groups[static_cast<size_t>(r)], r == 0 ? std::span<float>(a) : std::span<float>(b));
  }));
  EXPECT_TRUE(a == std::vector<float>(3, 3.0f));
  // Alone with a stranger, rank 0 gives up at its timeout and says whom it turned away.
  o.size = 2;
  o.connect_timeout = 300ms;
  expectThrowWith<Timeout>(
      [&] {
        makeSocketGroup(o, [&](const std::string& mine) {
          strangers.push_back(stranger(mine));
          return std::vector<std::string>{mine, "tcp 127.0.0.1 1"};
        });
      },
      {"rank(s) 1 of 2 did not connect to rank 0 within 300 ms",
       "turned away: rank 1 of 2 of group 99 looking for rank 0"});
  strangers.clear();
  o.rank = 1;
  expectThrowWith<FormatError>(
      [&] {
        makeSocketGroup(o, [](const std::string& mine) {
          return std::vector<std::string>{"tcp 127.0.0.1", mine};
        });
      },
      {"rank 0 published 'tcp 127.0.0.1', not a tcp address"});
  o.spin = std::chrono::microseconds(-1);
  expectThrowWith<InvalidArgument>([&] { makeSocketGroup(o, {}); }, {"spin -1 us is negative"});
  o.spin = std::chrono::microseconds(50);
  o.transport = "udp";
  expectThrowWith<InvalidArgument>([&] { makeSocketGroup(o, {}); },
                                   {"transport 'udp' (expected tcp or ipc)"});
}

// The socket group's own connections (both ends, in this process) get what
// chooseLocalCongestion (tested in local_tcp_test.cpp) gives a loopback connection, or keep
// the system's with "".
TEST(SocketGroupTest, LocalConnectionsGetTheChosenCongestionControl) {
  const std::string system = systemCongestion();
  ASSERT_FALSE(system.empty()) << "no /proc/sys/net/ipv4/tcp_congestion_control";
  const bool ipv6 = loopbackPair(AF_INET6).has_value();
  // Asked for: an algorithm the system does not use already, so that a group that set nothing
  // shows; where the kernel refuses it and falls back to reno, which is also the system's, the two
  // cannot be told apart here, but what the group set is still checked.
  const std::string wanted = system == "reno" ? "cubic" : "reno";
  std::string granted;
  {
    const auto v4 = loopbackPair();
    ASSERT_TRUE(v4.has_value());
    granted = chooseLocalCongestion(v4->first.get(), wanted);
  }
  std::vector<std::pair<std::string, std::string>> cases = {{"127.0.0.1", wanted},
                                                            {"127.0.0.1", ""}};
  if (ipv6) cases.emplace_back("::1", wanted);
  for (const auto& [host, asked] : cases) {
    SCOPED_TRACE(host + " asking for '" + asked + "'");
    const std::map<int, std::string> before = congestionOfConnectedTcpSockets();
    SocketGroupOptions o;
    o.host = host;
    o.local_congestion = asked;
    auto groups = socketPair(o);
    int seen = 0;
    for (const auto& [fd, name] : congestionOfConnectedTcpSockets()) {
      if (before.count(fd) != 0) continue;
      EXPECT_EQ(name, asked.empty() ? system : granted) << "descriptor " << fd;
      ++seen;
    }
    EXPECT_EQ(seen, 2) << "the pair's connection, from both ends";
    std::vector<float> a(5, 1.0f), b(5, 2.0f);
    expectNoErrors(onThreads(2, [&](int r) {
      allreduce(*groups[static_cast<size_t>(r)],
                r == 0 ? std::span<float>(a) : std::span<float>(b));
    }));
    EXPECT_TRUE(a == std::vector<float>(5, 3.0f));
  }
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
