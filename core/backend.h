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

#include "core/tensor.h"

namespace tandem {

struct DeviceInfo {
  std::string name;         // "cpu", "opencl:0"
  std::string kind;         // "cpu" or "opencl"
  std::string description;  // human-readable model/vendor
  int64_t memory_bytes = 0;
  int compute_units = 0;
  std::string platform;              // OpenCL platform; "host" for the CPU
  std::string model;                 // the device's own name, e.g. its CPU or GPU model
  std::string vendor;                // as the driver or CPU reports it
  int64_t max_allocation_bytes = 0;  // largest single buffer
  bool fp16 = false;                 // half-precision arithmetic
  // It computes on the host's CPU cores (the CPU backend; an OpenCL CPU device such as
  // POCL's): stages on it and on the node's other host devices share those cores.
  bool host_cores = false;
};

enum class Activation { kReLU, kGELU, kTanh, kSigmoid };

// Geometry of a 2-D sliding window over [N, C, H, W] input (convolution and pooling).
struct Window2d {
  int64_t channels = 0, height = 0, width = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t outHeight() const { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
  int64_t outWidth() const { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
};

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
  // Copies dst.bytes() bytes from host memory into dst.
  virtual void upload(const Tensor& dst, const void* src) = 0;
  // Copies src.bytes() bytes of src into host memory; waits for pending work.
  virtual void download(const Tensor& src, void* dst) = 0;
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  // Sets every element (f32 or i32 tensors) to value.
  virtual void fill(const Tensor& dst, float value) = 0;
  // Element-wise dtype conversion between f32 and f16, bf16 or i32 (either way).
  virtual void convert(const Tensor& src, const Tensor& dst) = 0;
  virtual void synchronize() = 0;
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

  // --- dense math ---
  // c = alpha * op(a) * op(b) + beta * c, all 2-D row-major.
  virtual void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                    float beta, const Tensor& c) = 0;
  // The same for each i < batch of a, b and c viewed as [batch, rows, cols] (one gemm per
  // block, e.g. per sample and attention head); backends may run the blocks in parallel.
  virtual void gemmBatched(bool trans_a, bool trans_b, float alpha, const Tensor& a,
                           const Tensor& b, float beta, const Tensor& c) = 0;
  // y = alpha * x + beta * y
  virtual void axpby(float alpha, const Tensor& x, float beta, const Tensor& y) = 0;
  // out = a * b element-wise (out may alias a or b)
  virtual void mul(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // sum(a * b), accumulated in double; waits for the result.
  virtual double dot(const Tensor& a, const Tensor& b) = 0;
  // y[n, c, r] += bias[c] for y viewed as [N, C, R] with C = bias.numel().
  virtual void addBias(const Tensor& y, const Tensor& bias) = 0;
  // db[c] += sum over n, r of dy[n, c, r].
  virtual void biasGrad(const Tensor& dy, const Tensor& db) = 0;

  // --- activations ---
  virtual void activation(Activation kind, const Tensor& x, const Tensor& y) = 0;
  // dx = dy * f'(x). GELU reads x; ReLU, tanh and sigmoid read y (ReLU's y > 0 exactly
  // where x > 0). The other may be undefined. Inputs and outputs must not overlap.
  virtual void activationBackward(Activation kind, const Tensor& x, const Tensor& y,
                                  const Tensor& dy, const Tensor& dx) = 0;
  // mask[i] = 0 with probability p, else 1/(1-p), from a counter-based hash of (seed, i),
  // so every backend draws the same mask; y = x * mask.
  virtual void dropout(const Tensor& x, float p, uint64_t seed, const Tensor& mask,
                       const Tensor& y) = 0;

  // --- convolution support ---
  // x [n, C, H, W] -> col [C*kh*kw, n*OH*OW] (column index = sample * OH*OW + pixel).
  virtual void im2col(const Tensor& x, const Window2d& g, const Tensor& col) = 0;
  // The adjoint of im2col: dx [n, C, H, W] = sum of col's entries into their pixels.
  virtual void col2im(const Tensor& col, const Window2d& g, const Tensor& dx) = 0;
  // src viewed as [A, B, R] (A = dim 0, B = dim 1) -> dst [B, A, R].
  virtual void transpose01(const Tensor& src, const Tensor& dst) = 0;

  // --- pooling over [N, C, H, W] ---
  // argmax (i32) holds, per output, the flat index inside its input plane.
  virtual void maxPool(const Tensor& x, const Window2d& g, const Tensor& y,
                       const Tensor& argmax) = 0;
  virtual void maxPoolBackward(const Tensor& dy, const Tensor& argmax, const Window2d& g,
                               const Tensor& dx) = 0;
  // Average over the window, padding counted as zeros (divisor kh*kw).
  virtual void avgPool(const Tensor& x, const Window2d& g, const Tensor& y) = 0;
  virtual void avgPoolBackward(const Tensor& dy, const Window2d& g, const Tensor& dx) = 0;

  // --- normalisation: rows of x [M, D] ---
  virtual void layerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                         const Tensor& y, const Tensor& mean, const Tensor& rstd) = 0;
  // Writes dx; accumulates into dgamma and dbeta.
  virtual void layerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                 const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                 const Tensor& dgamma, const Tensor& dbeta) = 0;

  // --- embedding: ids i32 [M], table [V, D] ---
  // Ids outside [0, V) raise InvalidArgument naming the id.
  virtual void embedding(const Tensor& ids, const Tensor& table, const Tensor& y) = 0;
  virtual void embeddingBackward(const Tensor& ids, const Tensor& dy, const Tensor& dtable) = 0;

  // --- attention: softmax over the last dimension ---
  // y = softmax(x) per row of x viewed as [N, Tq, Tk]. With causal, query row i sees keys
  // [0, Tk - Tq + i] only and y is 0 beyond them: Tq = Tk for a whole sequence, Tq = 1
  // for one decoding step over a cache of Tk keys. y may alias x.
  virtual void softmax(const Tensor& x, bool causal, const Tensor& y) = 0;
  // dx = y * (dy - sum(dy * y)) per row, the gradient through y = softmax(x); dx may
  // alias dy.
  virtual void softmaxBackward(const Tensor& y, const Tensor& dy, const Tensor& dx) = 0;

  // --- loss ---
  // Per row of logits [N, C] with label i32 [N]: losses[n] = -log softmax(logits)[label],
  // dlogits = (softmax - onehot) * grad_scale. Labels outside [0, C) raise InvalidArgument.
  virtual void softmaxCrossEntropy(const Tensor& logits, const Tensor& labels, float grad_scale,
                                   const Tensor& losses, const Tensor& dlogits) = 0;

  // --- optimizers (in place on param and state) ---
  virtual void sgdStep(const Tensor& param, const Tensor& grad, const Tensor& velocity,
                       const SgdStep& s) = 0;
  virtual void adamwStep(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                         const AdamWStep& s) = 0;
};

// Host helpers built on upload/download.
Tensor toDevice(Backend& backend, const Shape& shape, const std::vector<float>& values);
Tensor toDeviceI32(Backend& backend, const Shape& shape, const std::vector<int32_t>& values);
std::vector<float> toHost(const Tensor& t);
std::vector<int32_t> toHostI32(const Tensor& t);

}  // namespace tandem
