#include "core/profile/link_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/host_limits.h"

namespace tandem {

namespace {

constexpr float kPing = 0.0f, kStop = 1.0f, kLoadStart = 2.0f, kLoadEnd = 3.0f;

MessageTag out(int64_t n) { return {MessageKind::kActivation, n}; }
MessageTag back(int64_t n) { return {MessageKind::kGradient, n}; }

// GEMMs back to back on a thread and a backend of their own until destroyed: a stage's
// computation beside the link. On creation it times them alone (at least kAloneGemms and
// kAloneSeconds of wall time: under a quota the thread also waits), so that what they
// would have cost meanwhile is known; cost() is what the process spent since start()
// beyond that.
class LoadBeside {
 public:
  explicit LoadBeside(std::unique_ptr<Backend> backend)
      : backend_(std::move(backend)), gemm_(*backend_, kGemmSize) {
    thread_ = std::thread([this] {
      while (!stop_.load(std::memory_order_relaxed)) {
        gemm_.run();
        cpu_.store(threadCpuSeconds(), std::memory_order_relaxed);
        gemms_.fetch_add(1, std::memory_order_release);
      }
    });
    // Waits sleep: under a quota a spinning wait would take the turns the GEMMs are timed in.
    const auto t0 = std::chrono::steady_clock::now();
    while (gemms_.load(std::memory_order_acquire) < 1)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const int64_t g0 = gemms_.load(std::memory_order_acquire);
    const double c0 = cpu_.load(std::memory_order_relaxed);
    while (gemms_.load(std::memory_order_acquire) < g0 + kAloneGemms ||
           std::chrono::steady_clock::now() - t0 < kAloneSeconds)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const int64_t g1 = gemms_.load(std::memory_order_acquire);
    gemm_cpu_s_ = (cpu_.load(std::memory_order_relaxed) - c0) / static_cast<double>(g1 - g0);
  }
  ~LoadBeside() {
    stop_ = true;
    thread_.join();
  }
  LoadBeside(const LoadBeside&) = delete;
  LoadBeside& operator=(const LoadBeside&) = delete;

  void start() {
    process0_ = processCpuSeconds();
    gemms0_ = gemms_.load(std::memory_order_acquire);
  }
  double cost() const {
    const double process = processCpuSeconds() - process0_;
    const auto gemms = static_cast<double>(gemms_.load(std::memory_order_acquire) - gemms0_);
    return std::max(process - gemms * gemm_cpu_s_, 0.0);
  }

 private:
  static constexpr int64_t kGemmSize = 256;  // 768 KiB of operands: a layer's working set
  static constexpr int64_t kAloneGemms = 20;
  static constexpr std::chrono::milliseconds kAloneSeconds{150};
  std::unique_ptr<Backend> backend_;
  GemmRunner gemm_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> gemms_{0};
  std::atomic<double> cpu_{0};
  double gemm_cpu_s_ = 0, process0_ = 0;
  int64_t gemms0_ = 0;
  std::thread thread_;
};

}  // namespace

int64_t loadedMessages(const LinkProbeOptions& o, double bandwidth) {
  const int64_t most = static_cast<int64_t>(o.window) * o.repeats;
  if (!(bandwidth > 0)) return std::min<int64_t>(most, kLeastLoadedMessages);
  const double fit = kLoadedSeconds * bandwidth / static_cast<double>(o.message_bytes);
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(fit)),
                             std::min<int64_t>(most, kLeastLoadedMessages), most);
}

LinkMeasurement measureLink(Link& link, Backend& backend, const LinkProbeOptions& o) {
  TANDEM_CHECK_MSG(o.message_bytes >= 8 && o.message_bytes % 4 == 0, InvalidArgument,
                   "link probe: message size " << o.message_bytes
                                               << " bytes is not a multiple of 4 of at least 8");
  TANDEM_CHECK_MSG(o.window >= 1 && o.repeats >= 1 && o.warmup >= 0, InvalidArgument,
                   "link probe: window " << o.window << ", repeats " << o.repeats << ", warm-up "
                                         << o.warmup << " (need >= 1, >= 1, >= 0)");
  const Tensor ping = toDevice(backend, {1}, std::vector<float>{kPing});
  const Tensor data = toDevice(backend, {o.message_bytes / 4},
                               std::vector<float>(static_cast<size_t>(o.message_bytes / 4), 0.5f));
  int64_t n = 0;
  auto roundTrip = [&](const Tensor& last) {
    const int64_t id = n;
    link.send(out(n++), last);
    const Tensor answer = link.recv(back(id), backend);
    TANDEM_CHECK_MSG(
        answer.numel() == 1, FormatError,
        "link probe: " << link.peer() << " answered with " << answer.numel() << " values, not 1");
  };
  std::vector<double> rtt, transfer;
  for (int r = 0; r < o.warmup + o.repeats; ++r) {
    const double t = timeOnce([&] { roundTrip(ping); });
    if (r >= o.warmup) rtt.push_back(t);
  }
  const double busy_before = hostBusyCpuSeconds();
  const double own_before = processCpuSeconds();
  for (int r = 0; r < o.warmup + o.repeats; ++r) {
    const double t = timeOnce([&] {
      for (int w = 0; w < o.window; ++w) link.send(out(n++), data);
      roundTrip(ping);
    });
    if (r >= o.warmup) transfer.push_back(t);
  }
  const double busy_after = hostBusyCpuSeconds();
  const double own_after = processCpuSeconds();
  LinkMeasurement m;
  m.host_cpu_s = std::max(busy_after - busy_before, 0.0);
  m.process_cpu_s = std::max(own_after - own_before, 0.0);
  m.data_bytes = static_cast<int64_t>(o.warmup + o.repeats) * o.window * o.message_bytes;
  m.round_trip = spreadOf(std::move(rtt));
  m.transfer = spreadOf(std::move(transfer));
  m.latency_s = m.round_trip.median / 2;
  m.message_bytes = o.message_bytes;
  // Never below a tenth of the whole time: a transfer that hides in the round trip's
  // noise still has a finite bandwidth.
  const double moving = std::max(m.transfer.median - m.round_trip.median, 0.1 * m.transfer.median);
  m.bandwidth = static_cast<double>(o.window) * static_cast<double>(o.message_bytes) / moving;
  if (o.load) {
    LoadBeside load(o.load());
    roundTrip(toDevice(backend, {1}, std::vector<float>{kLoadStart}));  // the echo's load too
    load.start();
    const int64_t messages = loadedMessages(o, m.bandwidth);
    for (int64_t k = 0; k < messages; ++k) {
      link.send(out(n++), data);
      roundTrip(ping);
    }
    m.loaded_cpu_s = load.cost();
    m.loaded_bytes = messages * o.message_bytes;
    roundTrip(toDevice(backend, {1}, std::vector<float>{kLoadEnd}));
  }
  roundTrip(toDevice(backend, {1}, std::vector<float>{kStop}));
  return m;
}

EchoCpu echoLink(Link& link, Backend& backend,
                 const std::function<std::unique_ptr<Backend>()>& make_load) {
  double busy_from = -1, own_from = 0;  // the host's busy CPU and ours at the first data message
  EchoCpu cpu;
  bool bandwidth_done = false;  // the loaded runs began: the bandwidth runs' CPU is read
  auto readBandwidth = [&] {
    if (bandwidth_done || busy_from < 0) return;
    cpu.host_cpu_s = std::max(hostBusyCpuSeconds() - busy_from, 0.0);
    cpu.process_cpu_s = std::max(processCpuSeconds() - own_from, 0.0);
    bandwidth_done = true;
  };
  std::unique_ptr<LoadBeside> load;
  for (int64_t n = 0;; ++n) {
    const Tensor t = link.recv(out(n), backend);
    TANDEM_CHECK_MSG(t.dtype() == DType::kF32 && t.numel() > 0, FormatError,
                     "link probe: message " << n << " from " << link.peer()
                                            << " is not a probe's (an empty or non-f32 tensor)");
    if (t.numel() > 1) {
      if (busy_from < 0) {
        busy_from = hostBusyCpuSeconds();
        own_from = processCpuSeconds();
      }
      continue;
    }
    const float what = toHost(t)[0];
    if (what == kLoadStart) {
      readBandwidth();
      if (make_load) {  // timed alone before the answer: the data wait for it
        load = std::make_unique<LoadBeside>(make_load());
        load->start();
      }
    } else if (what == kLoadEnd && load) {
      cpu.loaded_cpu_s = load->cost();
      load.reset();
    }
    link.send(back(n), t);
    if (what == kStop) {
      readBandwidth();
      return cpu;
    }
  }
}

}  // namespace tandem
