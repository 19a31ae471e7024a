// The backend registry: an explicit list of device kinds, no self-registration.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"

namespace tandem {

struct BackendOptions {
  int threads = 1;  // CPU kernel and BLAS threads
};

// "cpu" or "opencl:N" (the N-th OpenCL device, see opencl/devices.h). Unknown names
// raise InvalidArgument listing the devices there are.
std::unique_ptr<Backend> makeBackend(const std::string& name, const BackendOptions& options = {});

// Every device this build can drive, with its facts.
std::vector<DeviceInfo> listDevices();

}  // namespace tandem
