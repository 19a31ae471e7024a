// The OpenCL backend: CLBlast for GEMM, our own kernels (kernels/*.cl, embedded) for
// everything else, on one device with one in-order command queue.
//
// Ordering: every op is enqueued on the one in-order queue, so ops see each other's
// results without events, and a buffer freed by one op can be handed to the next
// (its pending kernels run before anything enqueued later). upload() and download()
// block until their copy is done; dot() waits for its result.
//
// Threads: one thread at a time per backend (as for the CPU backend); kernel argument
// setting and enqueueing are serialised by a mutex anyway, since cl::Kernel objects
// are shared.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "backends/opencl/devices.h"
#include "backends/opencl/program.h"
#include "core/backend.h"

namespace tandem::opencl {

struct OpenClOptions {
  int device = 0;  // N of "opencl:N"
  // Program binary cache; empty: compile every start.
  std::filesystem::path cache_dir = ProgramCache::defaultDir();
  // Freed buffers up to this many bytes are kept for reuse, so a steady training step
  // does not allocate.
  size_t pool_bytes = size_t{256} << 20;
};

// What building the kernels took at start-up.
struct KernelSetup {
  double seconds = 0;  // all programs, created and built
  int programs = 0;    // built
  int from_cache = 0;  // of which loaded from the binary cache
};

class OpenClBackend final : public Backend {
 public:
  explicit OpenClBackend(const OpenClOptions& options = {});
  ~OpenClBackend() override;

  DeviceInfo info() const override;
  static DeviceInfo deviceInfo(const ClDevice& d);

  std::shared_ptr<Storage> allocate(size_t bytes) override;

  // Every op of core/backend_ops.h.
  bool supports(Op op, DType dtype) const override;
  TANDEM_BACKEND_OP_OVERRIDES

  // For benchmarks and tests that drive the device directly.
  const ClDevice& device() const { return device_; }
  const cl::Context& context() const { return context_; }
  cl::CommandQueue& queue() { return queue_; }
  const KernelSetup& kernelSetup() const { return setup_; }
  // The buffer under a tensor of this backend (InvalidArgument otherwise).
  const cl::Buffer& buffer(const Tensor& t) const;
  // Bytes of device memory held: live tensors and the pool's spare buffers.
  size_t allocatedBytes() const;

  // Runs kernel `name` over `items` work-items (rounded up to its work-group size);
  // defined in launch.h, which maps tensors to (buffer, offset) argument pairs.
  template <typename... Args>
  void launch(const char* name, size_t items, const Args&... args);

 private:
  friend class ClStorage;
  struct Kernel {
    cl::Kernel kernel;
    size_t local = 1;  // work-group size used for launches
  };
  Kernel& kernel(const char* name);
  // Runs kernel `name` as `groups` work-groups of `local` items (a power of two no larger
  // than the kernel's work-group size, kernel(name).local): for kernels that reduce in a
  // work-group.
  template <typename... Args>
  void launchGroups(const char* name, size_t groups, size_t local, const Args&... args);
  template <typename... Args>
  void enqueue(Kernel& k, const char* name, size_t global, size_t local, const Args&... args);
  // The work-group size for a reduction over one channel of `values` values (a group per
  // channel, of no more items than the channel has values).
  size_t channelGroup(const char* kernel_name, int64_t values);
  // Bytes of one accumulator in the kernels (acc_t: double where the device has fp64).
  size_t accBytes() const { return device_.fp64 ? sizeof(double) : sizeof(float); }
  void requireF32(const Tensor& t, const char* op) const;
  void requireI32(const Tensor& t, const char* op) const;
  // Host copy of an i32 tensor (ids and labels are checked on the host).
  std::vector<int32_t> hostIds(const Tensor& t);

  cl::Buffer takeBuffer(size_t bytes, size_t& capacity);
  void returnBuffer(cl::Buffer buffer, size_t capacity);

  ClDevice device_;
  std::string label_;  // "opencl:N"
  cl::Context context_;
  cl::CommandQueue queue_;
  KernelSetup setup_;
  // Looked up by const char* on every launch: the transparent hash and equality find a
  // name without building a std::string.
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, Kernel, NameHash, std::equal_to<>> kernels_;
  std::mutex launch_mutex_;  // kernel arguments and enqueueing

  size_t pool_limit_;
  mutable std::mutex buffers_mutex_;
  std::multimap<size_t, cl::Buffer> free_buffers_;  // guarded by buffers_mutex_
  size_t free_bytes_ = 0;                           // guarded by buffers_mutex_
  size_t allocated_bytes_ = 0;                      // guarded by buffers_mutex_
};

}  // namespace tandem::opencl
