#include "core/profile/link_probe.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/host_limits.h"

namespace tandem {

namespace {

constexpr float kPing = 0.0f, kStop = 1.0f;

MessageTag out(int64_t n) { return {MessageKind::kActivation, n}; }
MessageTag back(int64_t n) { return {MessageKind::kGradient, n}; }

}  // namespace

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
  roundTrip(toDevice(backend, {1}, std::vector<float>{kStop}));
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
  return m;
}

EchoCpu echoLink(Link& link, Backend& backend) {
  double busy_from = -1, own_from = 0;  // the host's busy CPU and ours at the first data message
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
    link.send(back(n), t);
    if (toHost(t)[0] == kStop) {
      if (busy_from < 0) return {};
      return {std::max(hostBusyCpuSeconds() - busy_from, 0.0),
              std::max(processCpuSeconds() - own_from, 0.0)};
    }
  }
}

}  // namespace tandem
