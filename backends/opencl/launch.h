// OpenClBackend::launch: kernel arguments from C++ values, for the backend's own .cpp
// files. A Tensor becomes two arguments, its buffer and its element offset (a ulong),
// matching the (buffer, offset) pairs of every kernel in kernels/*.cl; a Window2d
// becomes the eleven longs of spatial.cl's WINDOW; anything else is passed as is, so
// call sites cast integers to the kernel's width (cl_ulong, cl_long, cl_int).
#pragma once

#include <mutex>

#include "backends/opencl/opencl_backend.h"

namespace tandem::opencl {
namespace detail {

inline void setArg(OpenClBackend& be, cl::Kernel& k, cl_uint& i, const Tensor& t) {
  k.setArg(i++, be.buffer(t));
  k.setArg(i++, static_cast<cl_ulong>(t.offset()));
}

inline void setArg(OpenClBackend&, cl::Kernel& k, cl_uint& i, const Window2d& g) {
  for (int64_t v : {g.channels, g.height, g.width, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w,
                    g.pad_h, g.pad_w, g.outHeight(), g.outWidth()})
    k.setArg(i++, static_cast<cl_long>(v));
}

template <typename T>
void setArg(OpenClBackend&, cl::Kernel& k, cl_uint& i, const T& v) {
  k.setArg(i++, v);
}

}  // namespace detail

template <typename... Args>
void OpenClBackend::launch(const char* name, size_t items, const Args&... args) {
  if (items == 0) return;
  Kernel& k = kernel(name);
  enqueue(k, name, (items + k.local - 1) / k.local * k.local, k.local, args...);
}

template <typename... Args>
void OpenClBackend::launchGroups(const char* name, size_t groups, size_t local,
                                 const Args&... args) {
  if (groups == 0) return;
  enqueue(kernel(name), name, groups * local, local, args...);
}

template <typename... Args>
void OpenClBackend::enqueue(Kernel& k, const char* name, size_t global, size_t local,
                            const Args&... args) {
  std::lock_guard<std::mutex> lock(launch_mutex_);
  try {
    cl_uint i = 0;
    (detail::setArg(*this, k.kernel, i, args), ...);
    queue_.enqueueNDRangeKernel(k.kernel, cl::NullRange, cl::NDRange(global), cl::NDRange(local));
  } catch (const cl::Error& e) {
    throw deviceError(e, std::string("running kernel ").append(name).append(" on ").append(label_));
  }
}

}  // namespace tandem::opencl
