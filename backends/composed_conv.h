// Convolution composed from a backend's primitives: im2col into a column buffer, gemm,
// and the [A, B, R] transpose between channel-major and sample-major layouts. A backend
// without convolution kernels of its own (OpenCL) runs conv2d and its gradients so; the
// CPU backend has direct kernels (cpu/conv.cpp) and is checked against these.
#pragma once

#include <string_view>

#include "core/backend.h"

namespace tandem::backends {

// The ops go through the batch convColumnChunk (core/backend.h) samples at a time.
// Backend::conv2d, conv2dBackwardData and conv2dBackwardWeight's contracts, on `b`'s ops;
// `device` names it in errors.
void composedConv2d(Backend& b, std::string_view device, const Tensor& x, const Tensor& w,
                    const Tensor& bias, const Window2d& g, const Tensor& y);
void composedConv2dBackwardData(Backend& b, std::string_view device, const Tensor& dy,
                                const Tensor& w, const Window2d& g, const Tensor& dx);
void composedConv2dBackwardWeight(Backend& b, std::string_view device, const Tensor& x,
                                  const Tensor& dy, const Window2d& g, const Tensor& dw,
                                  const Tensor& db);

}  // namespace tandem::backends
