// A peer in another process that dies mid-transfer: the waiting side gets what was sent
// before, then a Timeout naming the peer; nothing hangs. And a peer process that restarts
// on the same endpoint is reached again without making a new link.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "tests/test_util.h"
#include "transport/socket_group.h"
#include "transport/zmq_group.h"
#include "transport/zmq_link.h"

namespace tandem::transport {
namespace {

using namespace std::chrono_literals;

// Runs `body` in a child process with its own ZeroMQ context; returns its pid.
template <typename Body>
pid_t spawn(Body body) {
  const pid_t pid = fork();
  if (pid == 0) {
    try {
      body();
    } catch (...) {
      _exit(2);
    }
    _exit(0);
  }
  return pid;
}

std::string ipcEndpoint(const std::string& name) {
  return "ipc://" + ::testing::TempDir() + "/tandem-proc-" + name + "-" + std::to_string(getpid());
}

TEST(LinkProcessTest, APeerThatDiesMidTransferLeavesATimeoutNotAHang) {
  const std::string parent_ep = ipcEndpoint("parent"), child_ep = ipcEndpoint("child");
  const pid_t child = spawn([&] {
    Context ctx;
    cpu::CpuBackend be;
    LinkOptions o;
    o.bind = child_ep;
    o.connect = parent_ep;
    ZmqLink link(ctx, o);
    link.send({MessageKind::kActivation, 0}, toDevice(be, {3}, {1, 2, 3}));
    // Sends are queued: wait for the parent to confirm 0 before dying, or a loaded
    // machine may kill this process before its I/O thread has written 0 at all.
    link.recv({MessageKind::kGradient, 0}, be);
    // Die with a large message in flight (microbatch 2) and microbatch 1 never sent.
    // Whether the large message arrives whole or not, the wait for 1 must end.
    link.send({MessageKind::kActivation, 2}, be.zeros({16 << 20}));
    kill(getpid(), SIGKILL);
  });
  ASSERT_GT(child, 0);
  Context ctx;
  cpu::CpuBackend be;
  LinkOptions o;
  o.bind = parent_ep;
  o.connect = child_ep;
  o.timeout = 3s;
  ZmqLink link(ctx, o);
  EXPECT_EQ(toHost(link.recv({MessageKind::kActivation, 0}, be)), (std::vector<float>{1, 2, 3}));
  link.send({MessageKind::kGradient, 0}, toDevice(be, {1}, {0}));
  const auto t0 = std::chrono::steady_clock::now();
  testing::expectThrowWith<Timeout>(
      [&] {
        link.recv({MessageKind::kActivation, 1}, be);
      },
      {"no (activation, microbatch 1)", child_ep});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
}

TEST(LinkProcessTest, ARestartedPeerIsReachedByTheSameLink) {
  const std::string parent_ep = ipcEndpoint("p2"), child_ep = ipcEndpoint("c2");
  Context ctx;
  cpu::CpuBackend be;
  LinkOptions o;
  o.bind = parent_ep;
  o.connect = child_ep;
  o.timeout = 5s;
  ZmqLink link(ctx, o);
  for (int run = 0; run < 2; ++run) {
    // Each incarnation of the peer echoes one message back, plus its run number.
    const pid_t child = spawn([&] {
      Context cctx;
      cpu::CpuBackend cbe;
      LinkOptions co;
      co.bind = child_ep;
      co.connect = parent_ep;
      co.timeout = 5s;
      ZmqLink peer(cctx, co);
      Tensor t = peer.recv({MessageKind::kActivation, run}, cbe);
      std::vector<float> v = toHost(t);
      v.push_back(static_cast<float>(run));
      peer.send({MessageKind::kGradient, run}, toDevice(cbe, {static_cast<int64_t>(v.size())}, v));
    });
    link.send({MessageKind::kActivation, run}, toDevice(be, {1}, {7.0f}));
    EXPECT_EQ(toHost(link.recv({MessageKind::kGradient, run}, be)),
              (std::vector<float>{7.0f, static_cast<float>(run)}));
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
}

// The cross-process groups with their ranks in separate processes (files for the
// rendezvous, tcp between them): the ring and the direct allreduce give every process
// the exact sum of integer-valued data; a child reports a wrong value by its exit code.
TEST(GroupProcessTest, RanksInSeparateProcessesAllreduce) {
  for (const bool socket : {false, true}) {
    SCOPED_TRACE(socket ? "plain sockets" : "ZeroMQ links");
    const int world = 3;
    const std::string dir = testing::freshDir("tandem-group-proc");
    auto rank = [&](int r) {  // true if every value is right
      Context ctx;
      cpu::CpuBackend host;
      const Exchange exchange = fileExchange(dir, r, world, 20s);
      std::unique_ptr<Group> group;
      if (socket) {
        SocketGroupOptions o;
        o.rank = r;
        o.size = world;
        group = makeSocketGroup(o, exchange);
      } else {
        ZmqGroupOptions o;
        o.rank = r;
        o.size = world;
        group = makeZmqGroup(ctx, host, o, exchange);
      }
      for (size_t count : {size_t{7}, size_t{1048577}}) {
        std::vector<float> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>((i + 3 * r) % 17);
        AllreduceOptions ao;
        ao.timeout = 20s;
        allreduce(*group, data, ao);
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int k = 0; k < world; ++k) want += static_cast<float>((i + 3 * k) % 17);
          if (data[i] != want) return false;
        }
      }
      barrier(*group, CollectiveOptions{0, 20s});
      return true;
    };
    std::vector<pid_t> children;
    for (int r = 1; r < world; ++r)
      children.push_back(spawn([&, r] {
        if (!rank(r)) _exit(3);
      }));
    EXPECT_TRUE(rank(0));
    for (pid_t child : children) {
      int status = 0;
      waitpid(child, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
    }
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace tandem::transport
