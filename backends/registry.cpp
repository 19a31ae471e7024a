#include "backends/registry.h"

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"

namespace tandem {

std::unique_ptr<Backend> makeBackend(const std::string& name, const BackendOptions& options) {
  if (name == "cpu") return std::make_unique<cpu::CpuBackend>(cpu::CpuOptions{options.threads});
  std::string known;
  for (const DeviceInfo& d : listDevices()) known += (known.empty() ? "" : ", ") + d.name;
  throw InvalidArgument("unknown device '" + name + "'; available: " + known);
}

std::vector<DeviceInfo> listDevices() { return {cpu::CpuBackend::hostInfo(1)}; }

}  // namespace tandem
