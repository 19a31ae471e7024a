// Effective throughput of each codec over a rate-limited link: what fp16, bf16 and int8
// buy on a slow hop (an edge board on 100 Mbit/s Ethernet or Wi-Fi).
//
// Run as root. The benchmark forks a receiver into a new network namespace, joins it to
// this one with a veth pair, and shapes both directions with a tc tbf qdisc (default
// 100 Mbit/s; --rate=, as tc writes rates). The sender pushes f32 tensors through a tcp
// ZmqLink per codec, keeping a window of unacknowledged tensors in flight; the receiver
// decodes each (from its header alone) and acknowledges it. The ratio table divides each
// codec's tensors per second by fp32's on the same link in the same run. The namespace,
// and with it the veth pair, disappear when the receiver exits.
#include <benchmark/benchmark.h>
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "benchmarks/ratio_reporter.h"
#include "core/random.h"
#include "transport/zmq_link.h"

extern char** environ;

namespace tandem::transport {
namespace {

using namespace std::chrono_literals;

constexpr const char* kSenderAddress = "10.213.77.1";
constexpr const char* kReceiverAddress = "10.213.77.2";
constexpr int kReceiverPort = 5557;
constexpr int64_t kWindow = 4;  // tensors in flight before the sender waits for an ack

// Runs a command (no shell); true if it exited 0.
bool run(const std::vector<std::string>& argv, bool quiet = false) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), environ) != 0) {
    std::fprintf(stderr, "shaped_link_bench: cannot run '%s' (install iproute2)\n", args[0]);
    return false;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  std::string line;
  for (const std::string& a : argv) line.append(a).append(" ");
  if (!quiet) std::fprintf(stderr, "shaped_link_bench: '%s' failed\n", line.c_str());
  return false;
}

bool shape(const std::string& dev, const std::string& rate) {
  // burst: a few packets at least and above rate/HZ; latency bounds the queue.
  return run({"tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "32kb",
              "latency", "50ms"});
}

bool readByte(int fd) {
  char c;
  return read(fd, &c, 1) == 1;
}
void writeByte(int fd) {
  const char c = 1;
  if (write(fd, &c, 1) != 1) std::perror("shaped_link_bench: pipe");
}

// The receiver, in its own network namespace: decode every tensor, ack each; an empty
// tensor ends it.
int receiver(int to_parent, int from_parent, const std::string& veth, const std::string& rate) {
  if (unshare(CLONE_NEWNET) != 0) {
    std::perror("shaped_link_bench: unshare(CLONE_NEWNET)");
    return 1;
  }
  writeByte(to_parent);                  // the namespace exists: move the veth end in
  if (!readByte(from_parent)) return 1;  // moved
  if (!run({"ip", "link", "set", "lo", "up"}) ||
      !run({"ip", "addr", "add", std::string(kReceiverAddress) + "/30", "dev", veth}) ||
      !run({"ip", "link", "set", veth, "up"}) || !shape(veth, rate))
    return 1;
  uint16_t ack_port = 0;
  writeByte(to_parent);  // configured
  if (read(from_parent, &ack_port, sizeof ack_port) != sizeof ack_port) return 1;
  Context ctx;
  cpu::CpuBackend be;
  LinkOptions o;
  o.bind = "tcp://" + std::string(kReceiverAddress) + ":" + std::to_string(kReceiverPort);
  o.connect = "tcp://" + std::string(kSenderAddress) + ":" + std::to_string(ack_port);
  o.timeout = 300s;
  ZmqLink link(ctx, o);
  const Tensor ack = be.zeros({1});
  for (int64_t mb = 0;; ++mb) {
    const Tensor t = link.recv({MessageKind::kActivation, mb}, be);
    if (t.numel() == 0) break;
    link.send({MessageKind::kCollective, mb}, ack);
  }
  return 0;
}

struct Sender {
  Context ctx;
  cpu::CpuBackend be;
  std::unique_ptr<ZmqLink> acks;
  std::map<Codec, std::unique_ptr<ZmqLink>> links;
  int64_t next = 0;  // the next microbatch number; the receiver expects them in order

  ZmqLink& link(Codec c) {
    auto& l = links[c];
    if (!l) {
      LinkOptions o;
      o.bind = "tcp://" + std::string(kSenderAddress) + ":*";  // unused: acks come on `acks`
      o.connect = "tcp://" + std::string(kReceiverAddress) + ":" + std::to_string(kReceiverPort);
      o.codec = c;
      o.timeout = 300s;
      l = std::make_unique<ZmqLink>(ctx, o);
    }
    return *l;
  }
};

Sender* sender = nullptr;

void BM_ShapedLink(benchmark::State& state, Codec c) {
  const int64_t bytes = state.range(0);
  // Every tensor is acknowledged before the iteration ends, so the time is what the
  // link took to deliver them all; 32 MiB of f32 per iteration (8 tensors at least).
  const int64_t count = std::max<int64_t>(2 * kWindow, (int64_t{32} << 20) / bytes);
  ZmqLink& link = sender->link(c);
  std::vector<float> values(static_cast<size_t>(bytes / 4));
  Rng rng(5);
  for (float& v : values) v = rng.normal();
  const Tensor t = toDevice(sender->be, {static_cast<int64_t>(values.size())}, values);
  const uint64_t wire0 = link.stats().bytes_sent_wire;
  for (auto _ : state) {
    const int64_t first = sender->next;
    for (int64_t i = 0; i < count; ++i) {
      if (i >= kWindow)
        sender->acks->recv({MessageKind::kCollective, sender->next - kWindow}, sender->be);
      link.sendInPlace({MessageKind::kActivation, sender->next++}, t);
    }
    for (int64_t mb = std::max(first, sender->next - kWindow); mb < sender->next; ++mb)
      sender->acks->recv({MessageKind::kCollective, mb}, sender->be);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * count);
  state.counters["wire_MB/s"] = benchmark::Counter(
      static_cast<double>(link.stats().bytes_sent_wire - wire0) / 1e6, benchmark::Counter::kIsRate);
  state.counters["tensor_MB/s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * count * bytes) / 1e6, benchmark::Counter::kIsRate);
}

#define SIZES \
  ->Arg(64 << 10)->Arg(1 << 20)->Arg(16 << 20)->UseRealTime()->Unit(benchmark::kMillisecond)
BENCHMARK_CAPTURE(BM_ShapedLink, fp32, Codec::kRaw) SIZES;
BENCHMARK_CAPTURE(BM_ShapedLink, fp16, Codec::kF16) SIZES;
BENCHMARK_CAPTURE(BM_ShapedLink, bf16, Codec::kBF16) SIZES;
BENCHMARK_CAPTURE(BM_ShapedLink, int8, Codec::kI8) SIZES;

}  // namespace
}  // namespace tandem::transport

int main(int argc, char** argv) {
  using namespace tandem::transport;
  keepFreedMemory();  // as the stage workers do
  std::string rate = "100mbit";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--rate=", 7) == 0) {
      rate = argv[i] + 7;
      for (int j = i; j < argc - 1; ++j) argv[j] = argv[j + 1];
      --argc;
      --i;
    }
  }
  if (geteuid() != 0) {
    std::fprintf(stderr,
                 "shaped_link_bench: must run as root (it creates a network namespace and a "
                 "veth pair shaped with tc)\n");
    return 2;
  }
  const std::string veth_a = "tdmA" + std::to_string(getpid());
  const std::string veth_b = "tdmB" + std::to_string(getpid());
  int up[2], down[2];  // child -> parent, parent -> child
  if (pipe(up) != 0 || pipe(down) != 0) return 1;
  // Fork before any thread exists (ZeroMQ's included): only the forking thread survives.
  const pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    close(up[0]);
    close(down[1]);
    _exit(receiver(up[1], down[0], veth_b, rate));
  }
  close(up[1]);
  close(down[0]);
  auto fail = [&] {
    kill(child, SIGTERM);
    waitpid(child, nullptr, 0);
    return 1;
  };
  if (!readByte(up[0])) return fail();
  if (!run({"ip", "link", "add", veth_a, "type", "veth", "peer", "name", veth_b}) ||
      !run({"ip", "link", "set", veth_b, "netns", std::to_string(child)}) ||
      !run({"ip", "addr", "add", std::string(kSenderAddress) + "/30", "dev", veth_a}) ||
      !run({"ip", "link", "set", veth_a, "up"}) || !shape(veth_a, rate)) {
    run({"ip", "link", "del", veth_a});
    return fail();
  }
  writeByte(down[1]);
  if (!readByte(up[0])) return fail();
  int rc = 0;
  {
    Sender s;
    LinkOptions o;
    o.bind = "tcp://" + std::string(kSenderAddress) + ":*";
    o.timeout = 300s;
    s.acks = std::make_unique<ZmqLink>(s.ctx, o);
    const std::string ep = s.acks->endpoint();
    const auto port = static_cast<uint16_t>(std::stoi(ep.substr(ep.rfind(':') + 1)));
    if (write(down[1], &port, sizeof port) != sizeof port) return fail();
    sender = &s;
    std::printf("link: veth pair shaped by tc tbf at %s each way\n", rate.c_str());
    std::vector<tandem::bench::RatioRule> rules;
    for (const char* codec : {"fp16", "bf16", "int8"})
      rules.push_back({std::string("BM_ShapedLink/") + codec, "BM_ShapedLink/fp32",
                       std::string(codec) + " vs fp32 (tensors/s)"});
    rc = tandem::bench::runWithRatios(argc, argv, rules);
    s.link(Codec::kRaw).send({tandem::MessageKind::kActivation, s.next}, s.be.zeros({0}));
    sender = nullptr;
  }
  int status = 0;
  waitpid(child, &status, 0);
  // The pair goes with the receiver's namespace, but asynchronously: remove it now so
  // that a run straight after does not find the address still in use.
  run({"ip", "link", "del", veth_a}, true);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "shaped_link_bench: the receiver failed\n");
    rc = 1;
  }
  return rc;
}
