// Allreduce of 1, 16 and 64 MiB of fp32 with 2 and 4 ranks, in one run: time and bus
// bandwidth (2(n-1)/n x bytes / time) of
//   - tandem's in-process group (ranks are threads),
//   - tandem's cross-process groups (ranks are processes, tcp loopback): over ZeroMQ
//     links, over ZeroMQ links encrypted with CurveZMQ (what replicated stages use on a
//     cluster), and over plain sockets,
//   - Gloo's ring allreduce (processes, tcp loopback),
//   - Open MPI's MPI_Allreduce (processes; shared memory, then tcp only),
//   - the limit of tcp loopback for them: processes only moving the bytes a ring
//     allreduce sends, over sockets like the plain-socket group's,
// beside memcpy of the same bytes, with the ratios the collectives issue sets targets
// for. The peers (libgloo-dev, openmpi-bin) are benchmark-only dependencies.
//
// Options: kUsage below, or --help.
//
// Processes: the bench starts itself with --worker zmq|zmq-curve|socket|gloo|tcp-limit (and mpirun
// starts mpi_allreduce_bench); rank 0 prints "seconds S", the median seconds per allreduce. Times
// are medians after untimed runs (warmups); the machine is shared, so only ratios in one run count.
// Each cell is measured --repeats times (3), every column's measurement in turn, with fresh
// processes each time, and shows the median of them. Every rank, thread or process, is bound to a
// CPU as mpirun binds Open MPI's processes (bindLikeMpirun): left free, two processes talking over
// loopback were often run on one CPU by the kernel for tens of milliseconds at a time, at half
// speed (docs/collectives.md).
#include <gloo/allreduce_ring.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <poll.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "benchmarks/bench_args.h"
#include "core/spin.h"
#include "transport/curve.h"
#include "transport/local_group.h"
#include "transport/local_tcp.h"
#include "transport/socket_group.h"
#include "transport/tcp/socket.h"
#include "transport/zmq_group.h"

namespace {

using namespace tandem;
namespace tcp = transport::tcp;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kUsage =
    "collective_bench [--iters N (timed runs per measurement; 5)] [--repeats R (measurements "
    "per cell; 3)]\n"
    "                 [--sizes-mib 1,16,64] [--ranks 2,4] [--in-process-only 0|1]\n"
    "                 [--socket-buffer-kib K (the plain-socket group's; 0: the kernel's; -1: "
    "the group's own, 4 MiB)]\n"
    "                 [--spin-us U (the plain-socket group's spin before poll; -1: its own)]\n"
    "                 [--congestion NAME|system (tcp congestion control of every tcp column's "
    "loopback connections, the peers' too; default: tandem's groups' own, cubic)]\n"
    "                 [--codec raw|fp16|bf16 (how tandem's cross-process groups carry values; "
    "Gloo and Open MPI always fp32)]\n"
    "                 [--bind-processes 1|0 (bind the worker processes as mpirun binds its "
    "ranks; 1)]\n"
    "Allreduce of fp32: tandem's in-process, ZeroMQ and plain-socket groups beside Gloo, Open "
    "MPI, the tcp loopback limit and memcpy, with the ratios the collectives issue sets targets "
    "for.\n";

// --socket-buffer-kib: the plain-socket group's socket buffers (-1: its default).
int socket_buffer_kib = -1;
// --codec: how tandem's cross-process groups carry values (raw fp32, fp16, bf16).
std::string codec = "raw";
// --spin-us: how long its transfers try before sleeping in poll (-1: its default).
int spin_us = -1;
// --congestion: local_congestion of tandem's two cross-process groups, and of the peers'
// connections once made (chooseLocalCongestionForAll in the Gloo and MPI workers), applied by the
// tcp limit too ("system": "", the system's).
std::string congestion = transport::SocketGroupOptions{}.local_congestion;
std::string localCongestion() { return congestion == "system" ? "" : congestion; }
// --repeats: how many times each cell is measured (see medianOfRepeats).
int repeats = 3;
// --bind-processes: whether the worker processes bind themselves (bindLikeMpirun).
bool bind_processes = true;
// --curve-public/--curve-secret: the CurveZMQ pair every rank of a zmq-curve group holds
// (made by the bench for its workers; Z85 has no quote or backslash).
std::string curve_public, curve_secret;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A cell's figure from its --repeats measurements: the median of those that did not fail
// (a failed one is -1), or 0 if none succeeded. A pair of processes over loopback TCP here
// often runs at one speed or at about half of it for its whole life (docs/collectives.md),
// so with one pair per cell chance decided it; the columns' measurements are taken in
// turn, so that each column meets the machine's slow and fast minutes alike.
double medianOfRepeats(const std::vector<double>& runs) {
  std::vector<double> ok;
  for (double s : runs)
    if (s > 0) ok.push_back(s);
  return ok.empty() ? 0 : median(ok);
}

// Untimed runs before the timed ones, the same for every rank and every peer: 32 MiB's
// worth, 2 to 32 runs (32 of 1 MiB, 2 of 16 and 64 MiB). A run of 1 MiB takes tens of
// microseconds in-process; the first few after the threads start ran slower (35-45 us,
// then 28-33 in a test program), and two warm-ups left them in the median of 7.
int warmups(size_t bytes) {
  return static_cast<int>(
      std::clamp<size_t>((size_t{32} << 20) / std::max<size_t>(bytes, 1), 2, 32));
}

// Times `op` iters times after warmups(bytes) untimed runs; the median.
double timeOp(int iters, size_t bytes, const std::function<void()>& op) {
  for (int i = 0; i < warmups(bytes); ++i) op();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    op();
    t.push_back(seconds(Clock::now() - t0));
  }
  return median(t);
}

// Binds the calling thread to the rank-th of the CPUs this process may use when every
// rank can have one, as mpirun binds its ranks by default (each to a core when there
// are no more ranks than cores, none otherwise); the measurement is then of the
// collective, not of where the scheduler happened to start the threads. Left unbound,
// the in-process group's two rank threads started on one CPU in 5 of 6 runs of
// 1 MiB x 2 and stayed there for all 542 runs of the process (36-37 us a call, against
// 21.6 us on two CPUs). A worker process calls it before it starts any thread, so its
// threads (ZeroMQ's and Gloo's I/O threads too) share the rank's CPU, as under mpirun.
void bindLikeMpirun(int rank, int ranks) {
  cpu_set_t allowed;
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || ranks > CPU_COUNT(&allowed)) return;
  int seen = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed) || seen++ != rank) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ::sched_setaffinity(0, sizeof(one), &one);  // 0: the calling thread
    return;
  }
}

std::vector<float> filled(size_t count, int rank) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((i + static_cast<size_t>(rank)) % 7);
  return v;
}

double memcpySeconds(size_t bytes, int iters) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  return timeOp(iters, bytes, [&] { std::memcpy(b.data(), a.data(), bytes); });
}

double inProcessSeconds(int ranks, size_t count, int iters) {
  auto groups = transport::makeLocalGroup(ranks);
  std::vector<std::vector<float>> data;
  for (int r = 0; r < ranks; ++r) data.push_back(filled(count, r));
  std::vector<double> result(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      bindLikeMpirun(r, ranks);
      Group& g = *groups[static_cast<size_t>(r)];
      result[static_cast<size_t>(r)] = timeOp(iters, count * sizeof(float), [&] {
        barrier(g);  // every rank starts together, as in the processes' runs
        allreduce(g, data[static_cast<size_t>(r)]);
      });
    });
  for (auto& t : threads) t.join();
  return result[0];
}

// The limit of tcp loopback for a ring: rank r sends the bytes one rank of a ring
// allreduce sends (2(n-1) steps of bytes/n) to rank r+1 while receiving as many from
// rank r-1, over sockets set up as the plain-socket group's are (non-blocking,
// TCP_NODELAY, its buffer size, a stalled rank yielding for 50 us before it sleeps in
// poll). Nothing is reduced, and nothing written to a buffer of the allreduce's size:
// received bytes land in one 64 KiB buffer that stays in cache. Every rank of an
// allreduce must send at least that much, so no allreduce of fp32 over these sockets
// should be faster.
double tcpLimitSeconds(int rank, int ranks, const transport::Exchange& exchange, size_t bytes,
                       int iters) {
  auto fail = [](const char* what) {
    std::perror(what);
    std::exit(1);
  };
  const tcp::SocketOptions options{(socket_buffer_kib >= 0 ? socket_buffer_kib : 4096) << 10,
                                   true};
  const auto deadline = tcp::Clock::now() + std::chrono::seconds(60);
  tcp::Listener listener(tcp::Address::loopback(), "the loopback", 1, options);
  const std::vector<std::string> ports = exchange(std::to_string(listener.port()));
  const tcp::Address next = tcp::Address::resolve(
      "127.0.0.1", ports[static_cast<size_t>((rank + 1) % ranks)], false);
  // With two ranks the next rank is the previous one: one connection, both ways, as
  // the group has (each direction's acknowledgements ride on the other's data).
  tcp::Socket out_socket, in_socket;
  if (ranks > 2 || rank == 0)  // the next rank listens before it publishes its port
    out_socket = tcp::connectTo(next, options, deadline, "tcp limit: the next rank");
  if (ranks > 2 || rank == 1) {
    std::optional<tcp::Socket> accepted = listener.accept(deadline, options);
    if (!accepted) fail("accept");
    in_socket = std::move(*accepted);
  }
  const int out = out_socket.valid() ? out_socket.get() : in_socket.get();
  const int in = in_socket.valid() ? in_socket.get() : out_socket.get();
  for (int s : {out, in}) {
    tcp::setNoDelay(s);
    transport::chooseLocalCongestion(s, localCongestion());
  }
  const size_t steps = 2 * static_cast<size_t>(ranks - 1),
               slice = bytes / static_cast<size_t>(ranks);
  std::vector<char> source(slice, 1), sink(size_t{1} << 16);
  // false if nothing moved; exits on an error.
  auto moved = [&](ssize_t n, const char* what) {
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) fail(what);
    return n > 0;
  };
  const double s = timeOp(iters, bytes, [&] {
    for (size_t step = 0; step < steps; ++step) {
      size_t sent = 0, received = 0;
      Clock::time_point stalled_since{};
      while (sent < slice || received < slice) {
        const ssize_t w = sent < slice ? ::send(out, source.data() + sent, slice - sent, 0) : 0;
        const bool sending = moved(w, "send");
        if (w > 0) sent += static_cast<size_t>(w);
        const ssize_t r = received < slice
                              ? ::recv(in, sink.data(), std::min(sink.size(), slice - received), 0)
                              : 0;
        if (r == 0 && received < slice) fail("recv: the previous rank closed");
        const bool receiving = moved(r, "recv");
        if (r > 0) received += static_cast<size_t>(r);
        if (sending || receiving) {
          stalled_since = Clock::time_point{};
        } else if (stalled_since == Clock::time_point{}) {
          stalled_since = Clock::now();
        } else if (Clock::now() - stalled_since < std::chrono::microseconds(50)) {
          sched_yield();
        } else {
          std::array<pollfd, 2> p{{{out, static_cast<short>(sent < slice ? POLLOUT : 0), 0},
                                   {in, static_cast<short>(received < slice ? POLLIN : 0), 0}}};
          ::poll(p.data(), p.size(), 1000);
        }
      }
    }
  });
  return s;
}

// The congestion control a loopback connection gets with `wanted`
// (transport::chooseLocalCongestion), "?" if no connection could be made.
std::string loopbackCongestion(const std::string& wanted) {
  const auto pair = tcp::loopbackPair();
  return pair ? transport::chooseLocalCongestion(pair->first.get(), wanted) : "?";
}

// One rank of a process run: the group, then the timing; rank 0 prints it.
int worker(const std::string& kind, int rank, int ranks, const std::string& dir, size_t count,
           int iters) {
  if (bind_processes) bindLikeMpirun(rank, ranks);
  std::vector<float> data = filled(count, rank);
  double s = 0;
  const transport::Exchange exchange =
      transport::fileExchange(dir, rank, ranks, std::chrono::seconds(60));
  if (kind == "tcp-limit") {
    s = tcpLimitSeconds(rank, ranks, exchange, count * sizeof(float), iters);
  } else if (kind == "socket") {
    transport::SocketGroupOptions o;
    o.rank = rank;
    o.size = ranks;
    o.codec = transport::parseCodec(codec);
    if (socket_buffer_kib >= 0) o.socket_buffer_bytes = socket_buffer_kib << 10;
    if (spin_us >= 0) o.spin = std::chrono::microseconds(spin_us);
    o.local_congestion = localCongestion();
    auto group = transport::makeSocketGroup(o, exchange);
    s = timeOp(iters, count * sizeof(float), [&] {
      barrier(*group);
      allreduce(*group, data);
    });
  } else if (kind == "zmq" || kind == "zmq-curve") {
    transport::Context ctx;
    cpu::CpuBackend host;
    transport::ZmqGroupOptions o;
    o.rank = rank;
    o.size = ranks;
    o.codec = transport::parseCodec(codec);
    o.local_congestion = localCongestion();
    if (kind == "zmq-curve") {
      o.curve_public_key = curve_public;
      o.curve_secret_key = curve_secret;
    }
    auto group = transport::makeZmqGroup(ctx, host, o, exchange);
    s = timeOp(iters, count * sizeof(float), [&] {
      barrier(*group);
      allreduce(*group, data);
    });
  } else {
    gloo::rendezvous::FileStore store(dir);
    gloo::transport::tcp::attr attr("127.0.0.1");
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, ranks);
    context->connectFullMesh(store, device);
    // Gloo's connections get the congestion control every other tcp column has.
    transport::chooseLocalCongestionForAll(localCongestion());
    gloo::AllreduceRing<float> ring(context, {data.data()}, static_cast<int>(count));
    std::vector<float> token(1);
    gloo::AllreduceRing<float> sync(context, {token.data()}, 1);
    s = timeOp(iters, count * sizeof(float), [&] {
      sync.run();
      ring.run();
    });
  }
  if (rank == 0) std::printf("seconds %.9f\n", s);
  return 0;
}

// Runs `argv` and returns rank 0's "seconds S" (negative if it failed).
double secondsFrom(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  const size_t at = out.find("seconds ");
  if (status != 0 || at == std::string::npos) {
    std::fprintf(stderr, "%s failed:\n%s\n", command.c_str(), out.c_str());
    return -1;
  }
  return std::stod(out.substr(at + 8));
}

double processSeconds(const std::string& self, const std::string& kind, int ranks, size_t count,
                      int iters) {
  static int run = 0;
  const std::string dir =
      (std::filesystem::temp_directory_path() /
       ("collective-bench-" + std::to_string(getpid()) + "-" + std::to_string(run++)))
          .string();
  std::filesystem::create_directories(dir);
  std::string command;
  for (int r = ranks - 1; r >= 0; --r) {
    const std::string one = self + " --worker " + kind + " --rank " + std::to_string(r) +
                            " --size " + std::to_string(ranks) + " --dir " + dir + " --count " +
                            std::to_string(count) + " --iters " + std::to_string(iters) +
                            " --socket-buffer-kib " + std::to_string(socket_buffer_kib) +
                            " --codec " + codec + " --spin-us " + std::to_string(spin_us) +
                            " --congestion " + congestion + " --bind-processes " +
                            (bind_processes ? "1" : "0") + " --curve-public '" + curve_public +
                            "' --curve-secret '" + curve_secret + "'";
    command += r > 0 ? one + " > /dev/null & " : one;
  }
  const double s = secondsFrom("(" + command + "; wait)");
  std::filesystem::remove_all(dir);
  return s;
}

double mpiSeconds(const std::string& mpi_bench, const std::string& btl, int ranks, size_t count,
                  int iters) {
  return secondsFrom("mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) +
                     " --mca btl " + btl + " " + mpi_bench + " " + std::to_string(count) + " " +
                     std::to_string(iters) + " " + std::to_string(warmups(count * sizeof(float))) +
                     " " + congestion);
}

}  // namespace

int main(int argc, char** argv) {
  tandem::transport::keepFreedMemory();  // as the stage workers do
  std::string worker_kind, dir;
  int rank = 0, size = 1, iters = 5;
  size_t count = 0;
  std::vector<int> sizes_mib = {1, 16, 64}, rank_counts = {2, 4};
  bool in_process_only = false;
  constexpr std::string_view kName = "collective_bench";
  for (const auto& [option, text] : bench::optionPairs(kName, argc, argv, kUsage)) {
    const std::string key(option), value(text);
    auto number = [&](long long min, long long max) {
      return bench::wholeNumber(kName, key, value, min, max);
    };
    if (key == "--worker")
      worker_kind = value;
    else if (key == "--rank")
      rank = static_cast<int>(number(0, 1023));
    else if (key == "--size")
      size = static_cast<int>(number(1, 1024));
    else if (key == "--dir")
      dir = value;
    else if (key == "--count")
      count = static_cast<size_t>(number(0, 1LL << 34));
    else if (key == "--iters")
      iters = static_cast<int>(number(1, 1'000'000));
    else if (key == "--repeats")
      repeats = static_cast<int>(number(1, 1000));
    else if (key == "--socket-buffer-kib")
      socket_buffer_kib = static_cast<int>(number(-1, 1 << 20));
    else if (key == "--codec")
      codec = value;
    else if (key == "--congestion")
      congestion = value;
    else if (key == "--spin-us")
      spin_us = static_cast<int>(number(-1, 10'000'000));
    else if (key == "--sizes-mib")
      sizes_mib = bench::wholeNumbers(kName, key, value, 1, 4096);
    else if (key == "--ranks")
      rank_counts = bench::wholeNumbers(kName, key, value, 2, 64);
    else if (key == "--in-process-only")
      in_process_only = number(0, 1) == 1;
    else if (key == "--bind-processes")
      bind_processes = number(0, 1) == 1;
    else if (key == "--curve-public")
      curve_public = value;
    else if (key == "--curve-secret")
      curve_secret = value;
    else {
      std::fprintf(stderr, "collective_bench: unknown option %s (--help lists them)\n",
                   key.c_str());
      return 2;
    }
  }
  if (!worker_kind.empty()) {
    if (worker_kind != "zmq" && worker_kind != "zmq-curve" && worker_kind != "socket" &&
        worker_kind != "gloo" && worker_kind != "tcp-limit") {
      std::fprintf(stderr,
                   "collective_bench: --worker: expected zmq, zmq-curve, socket, gloo or "
                   "tcp-limit, got '%s'\n",
                   worker_kind.c_str());
      return 2;
    }
    if (dir.empty() || rank >= size) {
      std::fprintf(stderr, "collective_bench: a worker needs --dir and a --rank below --size\n");
      return 2;
    }
    return worker(worker_kind, rank, size, dir, count, iters);
  }

  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const transport::CurveKeyPair curve = transport::generateCurveKeyPair();
  curve_public = curve.public_key;
  curve_secret = curve.secret_key;
  const std::string mpi_bench =
      (std::filesystem::path(self).parent_path() / "mpi_allreduce_bench").string();
  try {
    // Refused here, named, rather than in every worker.
    if (transport::parseCodec(codec) == transport::Codec::kI8)
      throw InvalidArgument("the groups carry raw, fp16 or bf16 values, not int8");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collective_bench: --codec: %s\n", e.what());
    return 2;
  }
  // A kernel name for it, or "system"; it also travels in the workers' command lines.
  if (congestion.empty() || congestion.size() > 15 ||
      congestion.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos) {
    std::fprintf(stderr,
                 "collective_bench: --congestion: expected a congestion control's name "
                 "(cubic, reno, ...) or system, got '%s'\n",
                 congestion.c_str());
    return 2;
  }
  std::printf(
      "allreduce of fp32, median of %d after 32 MiB's worth of untimed runs (2 to 32), each "
      "cell the median of %d such measurements taken in turn with the other columns'; bus "
      "bandwidth = 2(n-1)/n x bytes / time (GB/s); tandem's cross-process groups carry %s "
      "values\n",
      iters, repeats, codec.c_str());
  std::printf(
      "tcp congestion control on loopback: %s for every tcp column alike — tandem's groups "
      "(sockets, ZeroMQ plain and CurveZMQ-encrypted), Gloo, Open MPI's tcp and the tcp limit "
      "(--congestion %s; the peers' connections set once made)\n",
      loopbackCongestion(localCongestion()).c_str(), congestion.c_str());
  cpu_set_t allowed;
  const int cpus = ::sched_getaffinity(0, sizeof(allowed), &allowed) == 0 ? CPU_COUNT(&allowed) : 0;
  std::string spins;
  for (int n : rank_counts)
    spins += (spins.empty() ? "" : ", ") + std::to_string(n) + " ranks " +
             std::to_string(spin_us >= 0 ? spin_us : waitBeforeSleeping(n).count()) + " us";
  std::printf(
      "ranks bound one to a CPU where there are no more of them than the %d CPUs, as mpirun "
      "binds: in-process threads; processes of tandem's groups, Gloo and the tcp limit %s "
      "(--bind-processes %d); the socket group's spin before sleeping: %s\n",
      cpus, bind_processes ? "too" : "not", bind_processes ? 1 : 0, spins.c_str());
  std::printf(
      "malloc in every process (this bench's workers, Gloo's included, and Open MPI's ranks): "
      "freed blocks kept for reuse (transport::keepFreedMemory, as the stage workers run)\n");
  std::printf(
      "%-5s %5s %8s | %-18s %-18s %-18s %-18s %-18s %-18s %-18s %-18s | %7s %7s %7s %7s %7s %7s "
      "%7s\n",
      "MiB", "ranks", "memcpy", "in-process", "tandem zmq tcp", "tandem zmq curve",
      "tandem socket tcp", "gloo tcp", "mpi shm", "mpi tcp", "tcp limit", "in/mcpy", "in/mpi",
      "zmq/glo", "sock/glo", "sock/lim", "lim/glo", "crv/sck");
  bool ours_failed = false;
  for (int mib : sizes_mib)
    for (int n : rank_counts) {
      const size_t bytes = static_cast<size_t>(mib) << 20, elements = bytes / 4;
      const double bus = 2.0 * (n - 1) / n * static_cast<double>(bytes) / 1e9;
      // Column by column, --repeats times (see medianOfRepeats).
      enum { kMemcpy, kIn, kZmq, kCurve, kSocket, kLimit, kGloo, kShm, kMpiTcp, kColumns };
      std::array<std::vector<double>, kColumns> runs;
      for (int k = 0; k < repeats; ++k) {
        runs[kMemcpy].push_back(memcpySeconds(bytes, iters));
        runs[kIn].push_back(inProcessSeconds(n, elements, iters));
        if (in_process_only) continue;
        runs[kZmq].push_back(processSeconds(self, "zmq", n, elements, iters));
        runs[kCurve].push_back(processSeconds(self, "zmq-curve", n, elements, iters));
        runs[kSocket].push_back(processSeconds(self, "socket", n, elements, iters));
        runs[kLimit].push_back(processSeconds(self, "tcp-limit", n, elements, iters));
        runs[kGloo].push_back(processSeconds(self, "gloo", n, elements, iters));
        runs[kShm].push_back(mpiSeconds(mpi_bench, "self,vader", n, elements, iters));
        runs[kMpiTcp].push_back(mpiSeconds(mpi_bench, "self,tcp", n, elements, iters));
      }
      // The peers fail now and then (Gloo's IoException); tandem's own groups and the tcp
      // limit must not: the bench ends with status 1 if any run of them did.
      for (int column : {kZmq, kCurve, kSocket, kLimit})
        for (double s : runs[static_cast<size_t>(column)])
          if (s <= 0) ours_failed = true;
      const double mem = medianOfRepeats(runs[kMemcpy]), in = medianOfRepeats(runs[kIn]),
                   zmq = medianOfRepeats(runs[kZmq]), curve_s = medianOfRepeats(runs[kCurve]),
                   sock = medianOfRepeats(runs[kSocket]), limit = medianOfRepeats(runs[kLimit]),
                   gloo = medianOfRepeats(runs[kGloo]), shm = medianOfRepeats(runs[kShm]),
                   mtcp = medianOfRepeats(runs[kMpiTcp]);
      auto cell = [&](double s, bool in_process = false) {
        char b[32];
        if (s <= 0) return std::string(in_process_only && !in_process ? "-" : "failed");
        std::snprintf(b, sizeof b, "%.2f (%.2f)", s * 1e3, bus / s);
        return std::string(b);
      };
      auto ratio = [](double num, double den) { return num > 0 && den > 0 ? num / den : 0.0; };
      const double memcpy_gbs = static_cast<double>(bytes) / mem / 1e9;
      std::printf(
          "%-5d %5d %8.2f | %-18s %-18s %-18s %-18s %-18s %-18s %-18s %-18s | %7.2f %7.2f %7.2f "
          "%7.2f %7.2f %7.2f %7.2f\n",
          mib, n, memcpy_gbs, cell(in, true).c_str(), cell(zmq).c_str(), cell(curve_s).c_str(),
          cell(sock).c_str(), cell(gloo).c_str(), cell(shm).c_str(), cell(mtcp).c_str(),
          cell(limit).c_str(), (bus / in) / memcpy_gbs, ratio(shm, in), ratio(gloo, zmq),
          ratio(gloo, sock), ratio(limit, sock), ratio(gloo, limit), ratio(sock, curve_s));
      std::fflush(stdout);
    }
  std::printf(
      "\ntimes in ms (bus bandwidth GB/s); memcpy in GB/s; in/mcpy = in-process bus bandwidth / "
      "memcpy (target >= 0.5); in/mpi = Open MPI shared-memory time / in-process time (target "
      ">= 1.5); zmq/glo, sock/glo = Gloo time / tandem's cross-process time over ZeroMQ links, "
      "over plain sockets (target >= 1.5); tcp limit = each rank only moving the bytes a ring "
      "allreduce sends, over sockets like the plain-socket group's (no reduction, no protocol); "
      "sock/lim = tcp limit time / plain-socket time (how near the group comes to it); lim/glo "
      "= Gloo time / tcp limit time (the most sock/glo could be); crv/sck = plain-socket time / "
      "time over CurveZMQ-encrypted ZeroMQ links (what encrypting a replicated stage's group "
      "costs; below 1 is slower)\n");
  if (ours_failed) {
    std::fprintf(stderr,
                 "collective_bench: tandem's cross-process groups or the tcp limit failed "
                 "(above)\n");
    return 1;
  }
  return 0;
}
