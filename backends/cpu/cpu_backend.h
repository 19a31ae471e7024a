// The CPU backend: OpenBLAS sgemm for matrix products, hand-written kernels on a
// thread pool for everything else. It is the reference every other backend is tested
// against, so kernels favour clarity and determinism: every reduction runs in a fixed
// order that does not depend on the thread count.
#pragma once

#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "core/backend.h"

namespace tandem::cpu {

struct CpuOptions {
  int threads = 1;  // pool threads for every kernel, GEMM included
  // Freed buffers up to this many bytes are kept for reuse, so a steady training step
  // does not go back to the system allocator. Blocks of 1 MiB and more are mapped
  // directly, so what the pool does not keep really returns to the system.
  size_t pool_bytes = size_t{256} << 20;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuOptions& options = {});
  ~CpuBackend() override;

  DeviceInfo info() const override;
  int threads() const { return pool_.threads(); }
  // The host's facts, without creating a backend (which would reset BLAS threads).
  static DeviceInfo hostInfo(int threads);

  std::shared_ptr<Storage> allocate(size_t bytes) override;
  const void* hostData(const Tensor& t) const override { return data(t); }
  std::shared_ptr<Storage> adoptHost(void* data, size_t bytes,
                                     std::function<void()> release) override;

  // Every op of core/backend_ops.h.
  bool supports(Op op, DType dtype) const override;
  TANDEM_BACKEND_OP_OVERRIDES

  // Host address of a tensor's first element; checks it belongs to this backend.
  void* data(const Tensor& t) const;
  float* f32(const Tensor& t) const;
  int32_t* i32(const Tensor& t) const;
  ThreadPool& pool() { return pool_; }
  // The blocks live tensors hold (a block may be up to twice its tensor, takeBlock).
  MemoryUse memoryUse() const override { return {live_bytes_.load(), peak_bytes_.load()}; }

 private:
  friend class CpuStorage;
  // A block of at least `bytes`; its real size goes to `capacity`.
  void* takeBlock(size_t bytes, size_t& capacity);
  void* takeCachedOrNew(size_t size, size_t& capacity);
  void returnBlock(void* p, size_t capacity);

  ThreadPool pool_;
  size_t pool_limit_;
  std::mutex blocks_mutex_;
  std::multimap<size_t, void*> free_blocks_;  // guarded by blocks_mutex_
  size_t free_bytes_ = 0;                     // guarded by blocks_mutex_
  std::atomic<int64_t> live_bytes_{0}, peak_bytes_{0};
};

}  // namespace tandem::cpu
