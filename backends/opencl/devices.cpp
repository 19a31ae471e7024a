#include "backends/opencl/devices.h"

#include <CL/cl_ext.h>

#include <sstream>

namespace tandem::opencl {

namespace {

std::vector<cl::Platform> platforms() {
  std::vector<cl::Platform> out;
  try {
    cl::Platform::get(&out);
  } catch (const cl::Error& e) {
    if (e.err() == CL_PLATFORM_NOT_FOUND_KHR) return {};  // no ICD installed
    throw deviceError(e, "listing OpenCL platforms");
  }
  return out;
}

}  // namespace

std::vector<ClDevice> listClDevices() {
  std::vector<ClDevice> out;
  for (const cl::Platform& p : platforms()) {
    std::vector<cl::Device> devices;
    try {
      p.getDevices(CL_DEVICE_TYPE_ALL, &devices);
    } catch (const cl::Error&) {
      continue;  // CL_DEVICE_NOT_FOUND and broken drivers: nothing usable here
    }
    for (const cl::Device& d : devices) {
      ClDevice c;
      c.index = static_cast<int>(out.size());
      c.platform = p;
      c.device = d;
      clCall("querying an OpenCL device", [&] {
        c.platform_name = p.getInfo<CL_PLATFORM_NAME>();
        c.name = d.getInfo<CL_DEVICE_NAME>();
        c.vendor = d.getInfo<CL_DEVICE_VENDOR>();
        c.version = d.getInfo<CL_DEVICE_VERSION>();
        c.driver = d.getInfo<CL_DRIVER_VERSION>();
        c.compute_units = static_cast<int>(d.getInfo<CL_DEVICE_MAX_COMPUTE_UNITS>());
        c.global_memory = static_cast<int64_t>(d.getInfo<CL_DEVICE_GLOBAL_MEM_SIZE>());
        c.max_allocation = static_cast<int64_t>(d.getInfo<CL_DEVICE_MAX_MEM_ALLOC_SIZE>());
        const std::string extensions = d.getInfo<CL_DEVICE_EXTENSIONS>();
        c.fp16 = extensions.find("cl_khr_fp16") != std::string::npos;
        c.fp64 = extensions.find("cl_khr_fp64") != std::string::npos;
        c.cpu = (d.getInfo<CL_DEVICE_TYPE>() & CL_DEVICE_TYPE_CPU) != 0;
      });
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::string noDevicesReason() {
  if (platforms().empty())
    return "no OpenCL platform is installed (the ICD loader found none in "
           "/etc/OpenCL/vendors; on Debian, pocl-opencl-icd provides a CPU device)";
  if (listClDevices().empty()) return "the OpenCL platforms here report no devices";
  return "";
}

ClDevice clDevice(int index) {
  std::vector<ClDevice> all = listClDevices();
  if (index >= 0 && static_cast<size_t>(index) < all.size())
    return std::move(all[static_cast<size_t>(index)]);
  std::ostringstream os;
  os << "no OpenCL device " << index << ": ";
  if (all.empty()) {
    os << noDevicesReason();
  } else {
    os << "there are";
    for (const ClDevice& d : all) os << " " << d.label() << " (" << d.name << ")";
  }
  throw InvalidArgument(os.str());
}

}  // namespace tandem::opencl
