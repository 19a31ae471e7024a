// The Khronos C++ bindings (RAII for every OpenCL object) with the settings tandem
// uses, and the translation of their errors into DeviceError. Every OpenCL call goes
// through the bindings with exceptions on, so a failure names its call; clCall turns
// that into "clCreateBuffer failed: CL_MEM_OBJECT_ALLOCATION_FAILURE (-4) while <what>".
#pragma once

#define CL_HPP_TARGET_OPENCL_VERSION 120  // what Mali, Adreno and older drivers offer
#define CL_HPP_MINIMUM_OPENCL_VERSION 120
#define CL_HPP_ENABLE_EXCEPTIONS
#include <CL/opencl.hpp>

#include <string>
#include <string_view>

#include "core/error.h"

namespace tandem::opencl {

// "CL_OUT_OF_RESOURCES" for -5; "OpenCL error -1234" for codes no header names.
std::string errorName(cl_int code);

// The DeviceError for a failed binding call: its function, the error name and number,
// and what tandem was doing.
DeviceError deviceError(const cl::Error& e, std::string_view doing);

// Runs f(); a cl::Error out of it becomes deviceError(e, doing).
template <typename F>
decltype(auto) clCall(std::string_view doing, F&& f) {
  try {
    return f();
  } catch (const cl::Error& e) {
    throw deviceError(e, doing);
  }
}

}  // namespace tandem::opencl
