#include "backends/registry.h"

#include "backends/cpu/cpu_backend.h"
#include "backends/opencl/opencl_backend.h"
#include "core/error.h"

namespace tandem {

std::unique_ptr<Backend> makeBackend(const std::string& name, const BackendOptions& options) {
  if (name == "cpu") return std::make_unique<cpu::CpuBackend>(cpu::CpuOptions{options.threads});
  const std::string prefix = "opencl:";
  if (name.starts_with(prefix)) {
    const std::string digits = name.substr(prefix.size());
    TANDEM_CHECK_MSG(!digits.empty() && digits.size() <= 6 &&
                         digits.find_first_not_of("0123456789") == std::string::npos,
                     InvalidArgument,
                     "device '" << name << "': expected opencl:N with N a device number");
    // clDevice names the devices there are when N is not one of them.
    return std::make_unique<opencl::OpenClBackend>(opencl::OpenClOptions{std::stoi(digits)});
  }
  std::string known;
  for (const DeviceInfo& d : listDevices()) known += (known.empty() ? "" : ", ") + d.name;
  throw InvalidArgument("unknown device '" + name + "'; available: " + known);
}

std::vector<DeviceInfo> listDevices() {
  std::vector<DeviceInfo> out{cpu::CpuBackend::hostInfo(1)};
  for (const opencl::ClDevice& d : opencl::listClDevices())
    out.push_back(opencl::OpenClBackend::deviceInfo(d));
  return out;
}

}  // namespace tandem
