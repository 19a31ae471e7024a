// Link throughput and latency beside what the medium allows, measured in the same run, on
// the path the pipeline's executor runs: ZmqLink::send, which copies (downloads) the
// tensor into a pooled buffer that ZeroMQ then sends from:
//   tcp link        vs a plain POSIX TCP socket pair over loopback moving the same bytes
//   tcp link encrypted with CurveZMQ (as a cluster's stage links are) vs the plain tcp link
//   inproc link     vs memcpy of the same bytes (both copy the tensor once)
//   tcp link sending in place (sendInPlace: ZeroMQ reads the tensor's own memory; not the
//                   executor's path) vs the copying send, to show what the copy costs
//   64-byte round trip over a tcp link vs a bare ZeroMQ REQ/REP round trip
//   socket links (transport/socket_link.h, the stage links' transport), sealed as a run's
//                   tcp links are and in the clear, vs the plain socket pair and vs the
//                   CurveZMQ link they replace; and their 64-byte and 32 KiB round trips
//                   vs the CurveZMQ link's, with the process's CPU per message in each
//                   row (what a stage on a small node pays per message besides its work)
// Throughput runs send a batch of messages per iteration and wait for the receiver's
// acknowledgement, so bytes still queued are never counted. The ratio table at the end
// divides our rate by the reference's (> 1: faster). The references' loopback
// connections get the congestion control the links choose for theirs
// (LinkOptions::local_congestion), so both sides of a ratio run under the same one.
#include <benchmark/benchmark.h>

#include <time.h>

#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "benchmarks/ratio_reporter.h"
#include "core/error.h"
#include "transport/local_tcp.h"
#include "transport/socket_link.h"
#include "transport/tcp/socket.h"
#include "transport/zmq_link.h"

namespace tandem::transport {
namespace {

using namespace std::chrono_literals;

// What the links choose for their loopback connections.
const std::string kLinkCongestion = LinkOptions{}.local_congestion;

int64_t batchFor(int64_t bytes) { return std::max<int64_t>(4, (int64_t{8} << 20) / bytes); }

struct LinkPair {
  std::unique_ptr<ZmqLink> a, b;
};

// Each side has its own Context (ZeroMQ I/O thread), as two stage processes would; tcp
// links between contexts of one process behave as between processes. inproc needs one
// shared context, as it only works within one.
// "tcp+curve": tcp encrypted with CurveZMQ as a cluster run's stage links are, every
// worker holding the run's one key pair (runtime::dataPlaneKeys).
LinkPair makeLinks(Context& ctx_a, Context& ctx_b, const std::string& kind) {
  static int id = 0;
  static const CurveKeyPair keys = generateCurveKeyPair();
  LinkOptions o;
  o.timeout = 60s;
  o.send_hwm = 4;
  o.recv_hwm = 4;
  if (kind == "tcp+curve") {
    o.curve_secret_key = keys.secret_key;
    o.curve_peer_public_key = keys.public_key;
  }
  LinkOptions oa = o, ob = o;
  const bool tcp = kind != "inproc";
  oa.bind = tcp ? "tcp://127.0.0.1:*" : "inproc://bench-a" + std::to_string(id);
  ob.bind = tcp ? "tcp://127.0.0.1:*" : "inproc://bench-b" + std::to_string(id);
  ++id;
  LinkPair p{std::make_unique<ZmqLink>(ctx_a, oa), std::make_unique<ZmqLink>(ctx_b, ob)};
  p.a->connect(p.b->endpoint());
  p.b->connect(p.a->endpoint());
  return p;
}

// Batches of `bytes` messages from a to b, each batch acknowledged; `in_place`
// (ZmqLink only): sendInPlace instead of the executor's send.
template <typename L>
void throughput(benchmark::State& state, L& a, L& b, bool in_place = false) {
  const int64_t bytes = state.range(0), batch = batchFor(bytes);
  cpu::CpuBackend be;
  const Tensor t = be.zeros({bytes / 4});
  std::thread receiver([&] {  // receives batches and acknowledges each; a 1-value message stops it
    cpu::CpuBackend rbe;
    for (int64_t mb = 0;; ++mb) {
      const Tensor r = b.recv({MessageKind::kActivation, mb}, rbe);
      if (r.numel() == 1) break;
      if ((mb + 1) % batch == 0) b.send({MessageKind::kCollective, mb}, rbe.zeros({1}));
    }
  });
  int64_t mb = 0;
  for (auto _ : state) {
    for (int64_t i = 0; i < batch; ++i) {
      if constexpr (std::is_same_v<L, ZmqLink>) {
        if (in_place) {
          a.sendInPlace({MessageKind::kActivation, mb++}, t);
          continue;
        }
      }
      a.send({MessageKind::kActivation, mb++}, t);
    }
    a.recv({MessageKind::kCollective, mb - 1}, be);
  }
  a.send({MessageKind::kActivation, mb}, be.zeros({1}));
  receiver.join();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * batch * bytes);
}

void linkThroughput(benchmark::State& state, const std::string& kind, bool in_place = false) {
  Context ctx_a, ctx_b;
  LinkPair p = makeLinks(ctx_a, kind == "inproc" ? ctx_a : ctx_b, kind);
  throughput(state, *p.a, *p.b, in_place);
}

// Two socket links over loopback, sealed with one key (as a run's tcp stage links are)
// or in the clear.
std::pair<std::unique_ptr<SocketLink>, std::unique_ptr<SocketLink>> socketLinks(bool sealed) {
  LinkOptions o;
  o.timeout = 60s;
  o.bind = "tcp://127.0.0.1:*";
  std::optional<LinkKey> key;
  if (sealed) key = LinkKey{7, 1, 2, 3};
  auto a = std::make_unique<SocketLink>(o, key), b = std::make_unique<SocketLink>(o, key);
  a->connect(b->endpoint());
  b->connect(a->endpoint());
  return {std::move(a), std::move(b)};
}

void BM_SocketLink(benchmark::State& state) {
  auto [a, b] = socketLinks(false);
  throughput(state, *a, *b);
}
void BM_SocketLinkSealed(benchmark::State& state) {
  auto [a, b] = socketLinks(true);
  throughput(state, *a, *b);
}

void BM_TcpLink(benchmark::State& state) { linkThroughput(state, "tcp"); }
void BM_TcpLinkCurve(benchmark::State& state) { linkThroughput(state, "tcp+curve"); }
void BM_InprocLink(benchmark::State& state) { linkThroughput(state, "inproc"); }
void BM_TcpLinkInPlace(benchmark::State& state) { linkThroughput(state, "tcp", true); }

// A loopback TCP connection, blocking: {sender, receiver}.
std::pair<tcp::Socket, tcp::Socket> tcpPair() {
  auto pair = tcp::loopbackPair();
  if (!pair) throw IoError("link_bench: no IPv4 loopback connection");
  for (const tcp::Socket* s : {&pair->first, &pair->second}) {
    tcp::setNoDelay(s->get());
    chooseLocalCongestion(s->get(), kLinkCongestion);
  }
  return std::move(*pair);
}

// Blocking sockets: the deadline only bounds a peer that stops (the bench then fails).
void writeAll(int fd, const void* p, size_t n) {
  if (!tcp::writeAll(fd, p, n, tcp::Clock::now() + 60s, "link_bench receiver"))
    throw Timeout("link_bench: the receiver stopped reading");
}

void readAll(int fd, void* p, size_t n) {
  if (!tcp::readAll(fd, p, n, tcp::Clock::now() + 60s, "link_bench sender"))
    throw Timeout("link_bench: the sender stopped");
}

void BM_PlainTcpSocket(benchmark::State& state) {
  const int64_t bytes = state.range(0), batch = batchFor(bytes);
  const auto sockets = tcpPair();
  const int out = sockets.first.get(), in = sockets.second.get();
  std::vector<char> send_buf(static_cast<size_t>(bytes)), recv_buf(static_cast<size_t>(bytes));
  std::thread receiver([&] {
    for (int64_t m = 0;; ++m) {
      uint64_t size = 0;
      readAll(in, &size, sizeof size);
      if (size == 0) break;
      readAll(in, recv_buf.data(), size);
      if ((m + 1) % batch == 0) writeAll(in, "k", 1);
    }
  });
  for (auto _ : state) {
    for (int64_t i = 0; i < batch; ++i) {
      const uint64_t size = static_cast<uint64_t>(bytes);
      writeAll(out, &size, sizeof size);  // a length prefix, as any framing needs
      writeAll(out, send_buf.data(), static_cast<size_t>(bytes));
    }
    char ack;
    readAll(out, &ack, 1);
  }
  const uint64_t stop = 0;
  writeAll(out, &stop, sizeof stop);
  receiver.join();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * batch * bytes);
}

void BM_Memcpy(benchmark::State& state) {
  const int64_t bytes = state.range(0), batch = batchFor(bytes);
  std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes));
  for (auto _ : state) {
    for (int64_t i = 0; i < batch; ++i) {
      std::memcpy(dst.data(), src.data(), static_cast<size_t>(bytes));
      benchmark::DoNotOptimize(dst.data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * batch * bytes);
}

double processCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Round trips of `range(0)` bytes a -> b -> a; counter cpu_us: the process's CPU (both
// ends, every thread: ZeroMQ's I/O threads too) per message.
template <typename L>
void roundTrips(benchmark::State& state, L& a, L& b) {
  const int64_t values = state.range(0) / 4;
  cpu::CpuBackend be;
  const Tensor t = be.zeros({values});
  std::thread echo([&] {
    cpu::CpuBackend ebe;
    for (int64_t mb = 0;; ++mb) {
      const Tensor r = b.recv({MessageKind::kActivation, mb}, ebe);
      if (r.numel() != values) break;
      b.send({MessageKind::kGradient, mb}, r);
    }
  });
  int64_t mb = 0;
  const double cpu0 = processCpuSeconds();
  for (auto _ : state) {
    a.send({MessageKind::kActivation, mb}, t);
    a.recv({MessageKind::kGradient, mb}, be);
    ++mb;
  }
  const double cpu = processCpuSeconds() - cpu0;
  a.send({MessageKind::kActivation, mb}, be.zeros({values + 1}));
  echo.join();
  state.counters["cpu_us"] = 1e6 * cpu / (2.0 * static_cast<double>(std::max<int64_t>(mb, 1)));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}

void BM_TcpLinkRoundTrip(benchmark::State& state) {
  Context ctx_a, ctx_b;
  LinkPair p = makeLinks(ctx_a, ctx_b, "tcp");
  roundTrips(state, *p.a, *p.b);
}
void BM_TcpLinkCurveRoundTrip(benchmark::State& state) {
  Context ctx_a, ctx_b;
  LinkPair p = makeLinks(ctx_a, ctx_b, "tcp+curve");
  roundTrips(state, *p.a, *p.b);
}
void BM_SocketLinkRoundTrip(benchmark::State& state) {
  auto [a, b] = socketLinks(false);
  roundTrips(state, *a, *b);
}
void BM_SocketLinkSealedRoundTrip(benchmark::State& state) {
  auto [a, b] = socketLinks(true);
  roundTrips(state, *a, *b);
}

void BM_ZmqReqRepRoundTrip(benchmark::State& state) {
  zmq::context_t ctx;
  zmq::socket_t rep(ctx, zmq::socket_type::rep), req(ctx, zmq::socket_type::req);
  rep.bind("tcp://127.0.0.1:*");
  req.connect(rep.get(zmq::sockopt::last_endpoint));
  std::thread echo([&] {
    zmq::message_t m;
    while (rep.recv(m, zmq::recv_flags::none) && m.size() == 64) rep.send(m, zmq::send_flags::none);
  });
  std::vector<char> payload(64);
  zmq::message_t reply;
  // One round trip, so that the connection exists; then every loopback TCP connection of
  // this process (only this pair's, here) gets the links' congestion control.
  req.send(zmq::buffer(payload), zmq::send_flags::none);
  (void)req.recv(reply, zmq::recv_flags::none);
  chooseLocalCongestionForAll(kLinkCongestion);
  for (auto _ : state) {
    req.send(zmq::buffer(payload), zmq::send_flags::none);
    (void)req.recv(reply, zmq::recv_flags::none);
  }
  req.send(zmq::str_buffer("x"), zmq::send_flags::none);
  echo.join();
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}

#define SIZES ->Arg(64 << 10)->Arg(1 << 20)->Arg(16 << 20)->UseRealTime()
BENCHMARK(BM_TcpLink) SIZES;
BENCHMARK(BM_TcpLinkCurve) SIZES;
BENCHMARK(BM_TcpLinkInPlace) SIZES;
BENCHMARK(BM_PlainTcpSocket) SIZES;
BENCHMARK(BM_InprocLink) SIZES;
BENCHMARK(BM_Memcpy) SIZES;
BENCHMARK(BM_SocketLink) SIZES;
BENCHMARK(BM_SocketLinkSealed) SIZES;
#define TRIPS ->Arg(64)->Arg(32 << 10)->UseRealTime()
BENCHMARK(BM_TcpLinkRoundTrip) TRIPS;
BENCHMARK(BM_TcpLinkCurveRoundTrip) TRIPS;
BENCHMARK(BM_SocketLinkRoundTrip) TRIPS;
BENCHMARK(BM_SocketLinkSealedRoundTrip) TRIPS;
BENCHMARK(BM_ZmqReqRepRoundTrip)->UseRealTime();

}  // namespace
}  // namespace tandem::transport

int main(int argc, char** argv) {
  tandem::transport::keepFreedMemory();  // as the stage workers do
  std::printf(
      "conditions: ours and every reference in this one process: loopback tcp with %s "
      "congestion control on both, glibc malloc keeping freed blocks "
      "(transport::keepFreedMemory) for both; our links send as the executor does "
      "(ZmqLink::send: one copy into a pooled buffer; SocketLink::send: from the tensor's "
      "memory, or sealed into a pooled buffer), except the in-place row; every tcp "
      "connection, ours, the socket links' and the plain socket pair's, has TCP_NODELAY; "
      "sealed rows use ChaCha20-Poly1305 (socket links) or CurveZMQ (ZeroMQ links), each "
      "link's own cipher, with one key for both ends; no row has a separate warm-up\n",
      tandem::transport::kLinkCongestion.c_str());
  return tandem::bench::runWithRatios(
      argc, argv,
      {{"BM_TcpLink/", "BM_PlainTcpSocket/", "tcp link vs plain TCP socket"},
       {"BM_TcpLinkCurve/", "BM_TcpLink/", "CurveZMQ tcp link vs tcp link"},
       {"BM_InprocLink/", "BM_Memcpy/", "inproc link vs memcpy"},
       {"BM_TcpLinkInPlace/", "BM_TcpLink/", "tcp in place vs the executor's copying send"},
       {"BM_TcpLinkRoundTrip/64/", "BM_ZmqReqRepRoundTrip/", "64 B round trip vs ZMQ REQ/REP"},
       {"BM_SocketLink/", "BM_PlainTcpSocket/", "socket link vs plain TCP socket"},
       {"BM_SocketLinkSealed/", "BM_TcpLinkCurve/", "sealed socket link vs CurveZMQ tcp link"},
       {"BM_SocketLinkSealedRoundTrip/", "BM_TcpLinkCurveRoundTrip/",
        "sealed socket link round trip vs CurveZMQ link's"},
       {"BM_SocketLinkRoundTrip/", "BM_TcpLinkRoundTrip/",
        "socket link round trip vs tcp link's"}});
}
