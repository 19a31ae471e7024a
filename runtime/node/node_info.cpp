#include "runtime/node/node_info.h"

#include <sys/utsname.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"
#include "core/error.h"
#include "core/host_limits.h"

namespace tandem::runtime {

namespace {

// A /proc/meminfo field in bytes (0 if absent).
int64_t memInfo(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::istringstream s(line.substr(field.size() + 1));
    int64_t kib = 0;
    s >> kib;
    return kib * 1024;
  }
  return 0;
}

}  // namespace

std::string buildName() { return std::string("tandem ") + TANDEM_VERSION; }

int64_t realtimeNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

NodeInfo localNodeInfo(const std::string& name, bool opencl) {
  NodeInfo info;
  info.name = name.substr(0, kMaxNameBytes);
  info.build = buildName();
  utsname u{};
  if (uname(&u) == 0) info.arch = u.machine;
  info.cpus = static_cast<int32_t>(std::thread::hardware_concurrency());
  const CpuLimit cpu = cpuLimit();
  info.cpu_cores = static_cast<float>(cpu.cores());
  info.cpu_quota = static_cast<float>(cpu.quota_cores);
  // The machine's memory, or its control group's limit when that is lower.
  info.memory_bytes = memInfo("MemTotal");
  info.free_memory_bytes = memInfo("MemAvailable");
  const MemoryLimit mem = memoryLimit();
  if (mem.limit_bytes > 0 && (info.memory_bytes <= 0 || mem.limit_bytes < info.memory_bytes))
    info.memory_bytes = mem.limit_bytes;
  if (mem.free_bytes >= 0 && mem.free_bytes < info.free_memory_bytes)
    info.free_memory_bytes = mem.free_bytes;
  double load = 0;
  if (getloadavg(&load, 1) == 1) info.load = static_cast<float>(load);
  const std::vector<DeviceInfo> devices =
      opencl ? listDevices() : std::vector<DeviceInfo>{cpu::CpuBackend::hostInfo(1)};
  for (const DeviceInfo& d : devices) {
    if (info.devices.size() == kMaxDevices) break;
    std::string model = d.model.empty() ? d.description : d.model;
    info.devices.push_back({d.name.substr(0, kMaxNameBytes), model.substr(0, kMaxNameBytes),
                            d.memory_bytes, d.compute_units, d.fp16});
  }
  return info;
}

ClockEstimate estimateClock(Channel& channel, int rounds, std::chrono::milliseconds timeout) {
  TANDEM_CHECK_MSG(rounds > 0, InvalidArgument, "estimateClock needs a round, not " << rounds);
  std::vector<double> rtts;
  double best_rtt = 1e30, offset = 0;
  for (int i = 0; i < rounds; ++i) {
    const int64_t t0 = realtimeNs();
    channel.send(Ping{static_cast<uint64_t>(i), t0});
    const std::optional<Message> m = channel.recv(timeout);
    const int64_t t3 = realtimeNs();
    if (!m)
      throw Timeout(channel.peer() + " did not answer a ping within " +
                    std::to_string(timeout.count()) + " ms");
    const auto* pong = std::get_if<Pong>(&*m);
    if (!pong || pong->id != static_cast<uint64_t>(i) || pong->ping_sent_ns != t0)
      throw FormatError(channel.peer() + " answered ping " + std::to_string(i) + " with '" +
                        messageName(*m) + "' that does not match it");
    const double rtt = static_cast<double>((t3 - t0) - (pong->sent_ns - pong->received_ns)) * 1e-9;
    rtts.push_back(std::max(rtt, 0.0));
    if (rtt < best_rtt) {
      best_rtt = rtt;
      offset = static_cast<double>((pong->received_ns - t0) + (pong->sent_ns - t3)) * 0.5e-9;
    }
  }
  std::sort(rtts.begin(), rtts.end());
  return {rtts[rtts.size() / 2], offset, rounds};
}

}  // namespace tandem::runtime
