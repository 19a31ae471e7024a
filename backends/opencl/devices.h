// Every OpenCL device on this machine, in one global numbering: platforms in the
// order the ICD loader reports them, devices in each platform's order. "opencl:N" is
// the N-th device of this list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/opencl/cl.h"

namespace tandem::opencl {

struct ClDevice {
  int index = 0;  // N of "opencl:N"
  cl::Platform platform;
  cl::Device device;
  std::string platform_name, name, vendor, version, driver;
  int compute_units = 0;
  int64_t global_memory = 0;   // bytes
  int64_t max_allocation = 0;  // largest single buffer, bytes
  bool fp16 = false;           // cl_khr_fp16
  bool fp64 = false;           // cl_khr_fp64: kernels accumulate in double
  bool cpu = false;            // CL_DEVICE_TYPE_CPU: it runs on the host's cores

  std::string label() const { return "opencl:" + std::to_string(index); }
};

// The devices, or an empty list when no OpenCL platform is installed (the ICD
// loader finds none). A platform whose devices cannot be queried is skipped.
std::vector<ClDevice> listClDevices();

// Why listClDevices() is empty, in words a user can act on; "" when it is not.
std::string noDevicesReason();

// Device N; InvalidArgument listing the devices there are when N is out of range.
ClDevice clDevice(int index);

}  // namespace tandem::opencl
