// Backend: the narrow, op-level device interface that layers are written against.
//
// Three jobs, kept apart: device facts (info), buffers (allocate, upload, download,
// copy), and the primitive ops layers need. Compute is f32 unless an argument says
// otherwise. The CPU backend is the reference for every op; other backends are tested
// against it. Ops may run asynchronously; download() and synchronize() wait.
//
// Conventions: "dst" arguments are overwritten unless the op says it accumulates;
// gradient-of-parameter ops accumulate (+=) so microbatches can sum into one buffer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/backend_ops.h"
#include "core/tensor.h"

namespace tandem {

struct DeviceInfo {
  std::string name;         // "cpu", "opencl:0"
  std::string kind;         // "cpu" or "opencl"
  std::string description;  // human-readable model/vendor
  int64_t memory_bytes = 0;
  int compute_units = 0;
  std::string platform;              // OpenCL platform; for the CPU "OpenBLAS" and its kernel set
  std::string model;                 // the device's own name, e.g. its CPU or GPU model
  std::string vendor;                // as the driver or CPU reports it
  int64_t max_allocation_bytes = 0;  // largest single buffer
  bool fp16 = false;                 // half-precision arithmetic
  // It computes on the host's CPU cores (the CPU backend; an OpenCL CPU device such as
  // POCL's): stages on it and on the node's other host devices share those cores.
  bool host_cores = false;
};

// SiLU is x * sigmoid(x) (Llama's MLP gate). The mobile networks' piecewise-linear ones,
// as PyTorch defines them: ReLU6 min(max(x, 0), 6), hard sigmoid ReLU6(x + 3) / 6 and hard
// swish x * ReLU6(x + 3) / 6.
enum class Activation { kReLU, kGELU, kTanh, kSigmoid, kSiLU, kReLU6, kHardSigmoid, kHardSwish };

// activationBackward differentiates GELU, SiLU and the hard ones from x, the others from y.
inline bool activationGradFromInput(Activation kind) {
  return kind == Activation::kGELU || kind == Activation::kSiLU ||
         kind == Activation::kHardSigmoid || kind == Activation::kHardSwish;
}

// Geometry of a 2-D sliding window over [N, C, H, W] input (convolution and pooling).
struct Window2d {
  int64_t channels = 0, height = 0, width = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  // Ceil mode (max pooling only): a last, partial window where the stride leaves input
  // over, as long as it starts inside the input or its left padding (PyTorch's rule); its
  // values beyond the input are left out.
  bool ceil = false;
  int64_t outHeight() const { return outSize(height, kernel_h, stride_h, pad_h); }
  int64_t outWidth() const { return outSize(width, kernel_w, stride_w, pad_w); }

 private:
  int64_t outSize(int64_t in, int64_t k, int64_t s, int64_t p) const {
    const int64_t span = in + 2 * p - k;
    if (!ceil || span < 0) return span / s + 1;
    const int64_t out = (span + s - 1) / s + 1;
    return (out - 1) * s >= in + p ? out - 1 : out;
  }
};

// Samples per chunk where a backend composes convolution from im2col, gemm and transpose01
// (backends/composed_conv.h): the column buffer [C*kh*kw, chunk*OH*OW] and the channel-major
// output [out_channels, chunk*OH*OW] both within 4 MiB of f32; 1 to n.
int64_t convColumnChunk(const Window2d& g, int64_t out_channels, int64_t n);
// Samples per batched product where such a backend forms a chunk's weight gradient one
// product per sample, the samples' partial gradients [group, out_channels * C*kh*kw] then
// summed (biasGrad): as many as fit in the column buffer's size, up to `chunk`; 0 where
// fewer than two fit, and the chunk's gradient is one product over all its pixels. A
// gradient with few entries, each a sum over many pixels, is one small output with a long
// inner dimension as a single product, which leaves most of a GPU idle.
int64_t convWeightGradGroup(const Window2d& g, int64_t out_channels, int64_t chunk);

struct SgdStep {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;  // L2 added to the gradient
  bool nesterov = false;
};

struct AdamWStep {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.01f;  // decoupled: param -= lr * wd * param
  int64_t step = 1;            // 1-based, for bias correction
};

class Backend {
 public:
  virtual ~Backend() = default;

  // --- device facts ---
  virtual DeviceInfo info() const = 0;

  // --- buffers ---
  virtual std::shared_ptr<Storage> allocate(size_t bytes) = 0;
  // Bytes of device memory held for live tensors now, and the most held so far: what the
  // partitioner's memory model prices (weights, gradients, optimizer state, activations,
  // link buffers). -1 where a backend does not count them.
  struct MemoryUse {
    int64_t live = -1, peak = -1;
  };
  virtual MemoryUse memoryUse() const { return {}; }
  Tensor empty(const Shape& shape, DType dtype = DType::kF32);
  Tensor zeros(const Shape& shape, DType dtype = DType::kF32);
  // The tensor's bytes if they are ordinary host memory (a CPU backend), else nullptr
  // (device memory: use download). Valid while the tensor's storage lives.
  virtual const void* hostData(const Tensor& t) const {
    (void)t;
    return nullptr;
  }
  // Storage over `bytes` of host memory this backend can compute on in place (a CPU
  // backend), taking ownership: `release` runs when the storage dies. nullptr if the
  // backend cannot (device memory), and `release` is then not kept. Lets a receiver use
  // a message's buffer as a tensor without copying it.
  virtual std::shared_ptr<Storage> adoptHost(void* data, size_t bytes,
                                             std::function<void()> release) {
    (void)data, (void)bytes, (void)release;
    return nullptr;
  }

  // --- capabilities ---
  // Whether this backend runs `op` on `dtype` (OpUse says which dtype an op is keyed by).
  // The partitioner leaves a layer off a device whose backend lacks one of its ops, and
  // the importer refuses a graph for a device that cannot run it. An op called on a dtype
  // it is not supported for throws (Unsupported or InvalidArgument), never computes.
  virtual bool supports(Op op, DType dtype) const = 0;
  // Of `uses`, those this backend does not support, in their order.
  std::vector<OpUse> lacking(const std::vector<OpUse>& uses) const;

  // --- ops (core/backend_ops.h lists them with their contracts) ---
#define TANDEM_BACKEND_OP_PURE(Name, Ret, name, Params, Args) virtual Ret name Params = 0;
  TANDEM_BACKEND_OPS(TANDEM_BACKEND_OP_PURE)
#undef TANDEM_BACKEND_OP_PURE
};

// Host helpers built on upload/download.
Tensor toDevice(Backend& backend, const Shape& shape, const std::vector<float>& values);
Tensor toDeviceI32(Backend& backend, const Shape& shape, const std::vector<int32_t>& values);
std::vector<float> toHost(const Tensor& t);
std::vector<int32_t> toHostI32(const Tensor& t);

}  // namespace tandem
