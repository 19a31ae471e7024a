// The OpenCL backend's device, programs, buffers and transfers, and the ops that are
// more than one kernel launch: GEMM (CLBlast), dot, conversions.
#include "backends/opencl/opencl_backend.h"

#include <clblast.h>

#include <chrono>
#include <sstream>

#include "backends/op_checks.h"
#include "backends/opencl/launch.h"

namespace tandem::opencl {

namespace {

// Programs built at start, one per kernel file (each compiled with common.cl first).
constexpr const char* kPrograms[] = {"elementwise", "quantized", "rows", "spatial"};
// Work-group size cap: 256 suits GPUs; CPU devices (POCL) run each work-group as one
// task, so fewer, larger groups cost less scheduling (measured: axpby on 1M floats
// 0.39 -> 0.64 of copy bandwidth going from 256 to 4096).
constexpr size_t kMaxLocalGpu = 256, kMaxLocalCpu = 4096;
constexpr size_t kAlign = 256;  // allocation granularity, bytes

size_t roundUp(size_t bytes) { return (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign; }

size_t powerOfTwoAtMost(size_t n) {
  size_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

std::string mib(size_t bytes) {
  std::ostringstream os;
  os.precision(1);
  os << std::fixed << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return os.str();
}

}  // namespace

// A buffer from the backend's pool (it may be larger than the tensor asked for).
class ClStorage final : public Storage {
 public:
  ClStorage(OpenClBackend* owner, size_t bytes) : Storage(owner, bytes), owner_(owner) {
    buffer_ = owner->takeBuffer(bytes, capacity_);
  }
  ~ClStorage() override { owner_->returnBuffer(std::move(buffer_), capacity_); }
  const cl::Buffer& buffer() const { return buffer_; }

 private:
  OpenClBackend* owner_;
  cl::Buffer buffer_;
  size_t capacity_ = 0;
};

OpenClBackend::OpenClBackend(const OpenClOptions& options)
    : device_(clDevice(options.device)), label_(device_.label()), pool_limit_(options.pool_bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  clCall("creating a context and queue on " + label_, [&] {
    context_ = cl::Context(device_.device);
    queue_ = cl::CommandQueue(context_, device_.device);  // in order, no profiling
  });
  const ProgramCache cache(options.cache_dir);
  const std::string build_options =
      std::string("-cl-std=CL1.2") + (device_.fp64 ? " -DTANDEM_FP64" : "");
  const bool cpu_device =
      clCall("querying " + label_, [&] { return device_.device.getInfo<CL_DEVICE_TYPE>(); }) &
      CL_DEVICE_TYPE_CPU;
  const size_t cap = cpu_device ? kMaxLocalCpu : kMaxLocalGpu;
  for (const char* name : kPrograms) {
    BuildReport report;
    cl::Program program =
        cache.build(context_, device_, name, programSource(name), build_options, &report);
    ++setup_.programs;
    setup_.from_cache += report.from_cache ? 1 : 0;
    clCall(std::string("creating the kernels of ") + name, [&] {
      std::vector<cl::Kernel> kernels;
      program.createKernels(&kernels);
      for (cl::Kernel& k : kernels) {
        std::string kname = k.getInfo<CL_KERNEL_FUNCTION_NAME>();
        while (!kname.empty() && kname.back() == '\0') kname.pop_back();
        const size_t most = k.getWorkGroupInfo<CL_KERNEL_WORK_GROUP_SIZE>(device_.device);
        kernels_[kname] = Kernel{std::move(k), powerOfTwoAtMost(std::min(cap, most))};
      }
    });
  }
  setup_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

OpenClBackend::~OpenClBackend() {
  try {
    queue_.finish();
  } catch (const cl::Error&) {  // destructors never throw; the device is going away
  }
}

DeviceInfo OpenClBackend::deviceInfo(const ClDevice& d) {
  DeviceInfo info;
  info.name = d.label();
  info.kind = "opencl";
  info.description =
      d.name + " (" + d.platform_name + ", " + d.vendor + ", driver " + d.driver + ")";
  info.memory_bytes = d.global_memory;
  info.compute_units = d.compute_units;
  info.platform = d.platform_name;
  info.model = d.name;
  info.vendor = d.vendor;
  info.max_allocation_bytes = d.max_allocation;
  info.fp16 = d.fp16;
  info.host_cores = d.cpu;
  return info;
}

DeviceInfo OpenClBackend::info() const { return deviceInfo(device_); }

// Its kernels (kernels/*.cl) and CLBlast's GEMM cover the common set, on f32.
bool OpenClBackend::supports(Op op, DType dtype) const { return commonOpSupport(op, dtype); }

OpenClBackend::Kernel& OpenClBackend::kernel(const char* name) {
  auto it = kernels_.find(std::string_view(name));
  TANDEM_CHECK_MSG(it != kernels_.end(), Error,
                   label_ << ": no kernel '" << name << "' in the embedded programs");
  return it->second;
}

// --- buffers ---

cl::Buffer OpenClBackend::takeBuffer(size_t bytes, size_t& capacity) {
  const size_t size = roundUp(bytes);
  TANDEM_CHECK_MSG(static_cast<int64_t>(size) <= device_.max_allocation, DeviceError,
                   label_ << " cannot allocate " << bytes << " bytes (" << mib(bytes)
                          << "): its largest buffer is " << device_.max_allocation << " bytes ("
                          << mib(static_cast<size_t>(device_.max_allocation)) << "), global memory "
                          << device_.global_memory << " bytes");
  std::lock_guard<std::mutex> lock(buffers_mutex_);
  // Best fit among spare buffers of at most twice the size (see CpuBackend::takeBlock).
  auto it = free_buffers_.lower_bound(size);
  if (it != free_buffers_.end() && it->first <= 2 * size) {
    cl::Buffer b = std::move(it->second);
    capacity = it->first;
    free_bytes_ -= it->first;
    free_buffers_.erase(it);
    return b;
  }
  // Out of room counting the spare buffers: give them back before giving up.
  const auto limit = static_cast<size_t>(device_.global_memory);
  if (allocated_bytes_ + size > limit) {
    allocated_bytes_ -= free_bytes_;
    free_bytes_ = 0;
    free_buffers_.clear();
  }
  TANDEM_CHECK_MSG(allocated_bytes_ + size <= limit, DeviceError,
                   label_ << " cannot allocate " << bytes << " bytes (" << mib(bytes)
                          << "): " << allocated_bytes_ << " of its " << limit << " bytes ("
                          << mib(limit) << ") are in use");
  cl::Buffer b = clCall("allocating " + std::to_string(bytes) + " bytes on " + label_,
                        [&] { return cl::Buffer(context_, CL_MEM_READ_WRITE, size); });
  capacity = size;
  allocated_bytes_ += size;
  return b;
}

void OpenClBackend::returnBuffer(cl::Buffer buffer, size_t capacity) {
  std::lock_guard<std::mutex> lock(buffers_mutex_);
  if (free_bytes_ + capacity <= pool_limit_) {
    free_buffers_.emplace(capacity, std::move(buffer));
    free_bytes_ += capacity;
  } else {
    allocated_bytes_ -= capacity;  // the cl::Buffer releases the memory as it goes
  }
}

size_t OpenClBackend::allocatedBytes() const {
  std::lock_guard<std::mutex> lock(buffers_mutex_);
  return allocated_bytes_;
}

std::shared_ptr<Storage> OpenClBackend::allocate(size_t bytes) {
  return std::make_shared<ClStorage>(this, bytes);
}

const cl::Buffer& OpenClBackend::buffer(const Tensor& t) const {
  TANDEM_CHECK_MSG(t.defined(), InvalidArgument, label_ << ": undefined tensor passed to an op");
  TANDEM_CHECK_MSG(&t.storage()->backend() == this, InvalidArgument,
                   label_ << ": tensor " << t.shape() << " belongs to another backend");
  return static_cast<ClStorage*>(t.storage())->buffer();
}

void OpenClBackend::requireF32(const Tensor& t, const char* op) const {
  TANDEM_CHECK_MSG(t.dtype() == DType::kF32, InvalidArgument,
                   label_ << " " << op << ": expected an f32 tensor, got " << dtypeName(t.dtype())
                          << " " << t.shape());
}

void OpenClBackend::requireI32(const Tensor& t, const char* op) const {
  TANDEM_CHECK_MSG(t.dtype() == DType::kI32, InvalidArgument,
                   label_ << " " << op << ": expected an i32 tensor, got " << dtypeName(t.dtype())
                          << " " << t.shape());
}

void OpenClBackend::upload(const Tensor& dst, const void* src) {
  const cl::Buffer& b = buffer(dst);
  if (!dst.bytes()) return;
  std::lock_guard<std::mutex> lock(launch_mutex_);
  clCall("uploading to " + label_, [&] {
    queue_.enqueueWriteBuffer(
        b, CL_TRUE, static_cast<size_t>(dst.offset()) * dtypeSize(dst.dtype()), dst.bytes(), src);
  });
}

void OpenClBackend::download(const Tensor& src, void* dst) {
  const cl::Buffer& b = buffer(src);
  if (!src.bytes()) return;
  std::lock_guard<std::mutex> lock(launch_mutex_);
  clCall("downloading from " + label_, [&] {
    queue_.enqueueReadBuffer(b, CL_TRUE, static_cast<size_t>(src.offset()) * dtypeSize(src.dtype()),
                             src.bytes(), dst);
  });
}

void OpenClBackend::copy(const Tensor& src, const Tensor& dst) {
  TANDEM_CHECK_MSG(src.bytes() == dst.bytes() && src.dtype() == dst.dtype(), InvalidArgument,
                   label_ << ": copy between " << src.shape() << " " << dtypeName(src.dtype())
                          << " and " << dst.shape() << " " << dtypeName(dst.dtype()));
  const cl::Buffer& from = buffer(src);
  const cl::Buffer& to = buffer(dst);
  const size_t bytes = src.bytes();
  if (!bytes) return;
  const size_t from_at = static_cast<size_t>(src.offset()) * dtypeSize(src.dtype());
  const size_t to_at = static_cast<size_t>(dst.offset()) * dtypeSize(dst.dtype());
  if (from() == to() && from_at == to_at) return;
  const bool overlap = from() == to() && from_at < to_at + bytes && to_at < from_at + bytes;
  if (overlap) {  // OpenCL refuses overlapping copies: go through a scratch buffer
    Tensor tmp = empty(src.shape(), src.dtype());
    copy(src, tmp);
    copy(tmp, dst);
    return;
  }
  std::lock_guard<std::mutex> lock(launch_mutex_);
  clCall("copying on " + label_,
         [&] { queue_.enqueueCopyBuffer(from, to, from_at, to_at, bytes); });
}

void OpenClBackend::synchronize() {
  std::lock_guard<std::mutex> lock(launch_mutex_);
  clCall("waiting for " + label_, [&] { queue_.finish(); });
}

std::vector<int32_t> OpenClBackend::hostIds(const Tensor& t) {
  std::vector<int32_t> out(static_cast<size_t>(t.numel()));
  download(t, out.data());
  return out;
}

void OpenClBackend::fill(const Tensor& dst, float value) {
  const auto n = static_cast<cl_ulong>(dst.numel());
  if (dst.dtype() == DType::kI32) {
    launch("fill_i32", n, dst, n, static_cast<cl_int>(value));
    return;
  }
  requireF32(dst, "fill");
  launch("fill_f32", n, dst, n, value);
}

void OpenClBackend::convert(const Tensor& src, const Tensor& dst) {
  backends::checkSameCount(src, dst, label_, "convert");
  const DType from = src.dtype(), to = dst.dtype();
  if (from == to) {
    copy(src, dst);
    return;
  }
  struct Conversion {
    DType from, to;
    const char* kernel;
  };
  static constexpr Conversion kConversions[] = {
      {DType::kF32, DType::kF16, "f32_to_f16"},   {DType::kF16, DType::kF32, "f16_to_f32"},
      {DType::kF32, DType::kBF16, "f32_to_bf16"}, {DType::kBF16, DType::kF32, "bf16_to_f32"},
      {DType::kF32, DType::kI32, "f32_to_i32"},   {DType::kI32, DType::kF32, "i32_to_f32"}};
  for (const Conversion& c : kConversions) {
    if (c.from != from || c.to != to) continue;
    const auto n = static_cast<cl_ulong>(src.numel());
    launch(c.kernel, n, src, dst, n);
    return;
  }
  throw Unsupported(label_ + " convert: " + std::string(dtypeName(from)) + " -> " +
                    std::string(dtypeName(to)) + " (i8 needs scales; see the transport codecs)");
}

// --- GEMM through CLBlast ---

namespace {

std::string clblastStatus(clblast::StatusCode s) {
  const int code = static_cast<int>(s);
  if (code > -1000) return errorName(code);  // the codes CLBlast shares with OpenCL
  return "CLBlast status " + std::to_string(code);
}

}  // namespace

void OpenClBackend::gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                         float beta, const Tensor& c) {
  const backends::GemmDims d = backends::gemmDims(trans_a, trans_b, a, b, c);
  requireF32(a, "gemm");
  requireF32(b, "gemm");
  requireF32(c, "gemm");
  if (d.m == 0 || d.n == 0) return;
  if (d.k == 0) {  // c = beta * c; CLBlast rejects k = 0
    launch("scale_f32", static_cast<size_t>(c.numel()), c, static_cast<cl_ulong>(c.numel()), beta);
    return;
  }
  const cl::Buffer& ab = buffer(a);
  const cl::Buffer& bb = buffer(b);
  const cl::Buffer& cb = buffer(c);
  std::lock_guard<std::mutex> lock(launch_mutex_);
  cl_command_queue q = queue_();
  const clblast::StatusCode s = clblast::Gemm<float>(
      clblast::Layout::kRowMajor, trans_a ? clblast::Transpose::kYes : clblast::Transpose::kNo,
      trans_b ? clblast::Transpose::kYes : clblast::Transpose::kNo, static_cast<size_t>(d.m),
      static_cast<size_t>(d.n), static_cast<size_t>(d.k), alpha, ab(),
      static_cast<size_t>(a.offset()), static_cast<size_t>(a.shape()[1]), bb(),
      static_cast<size_t>(b.offset()), static_cast<size_t>(b.shape()[1]), beta, cb(),
      static_cast<size_t>(c.offset()), static_cast<size_t>(d.n), &q, nullptr);
  TANDEM_CHECK_MSG(s == clblast::StatusCode::kSuccess, DeviceError,
                   "CLBlast Gemm failed: " << clblastStatus(s) << " (" << static_cast<int>(s)
                                           << ") while multiplying " << d.m << "x" << d.k << " by "
                                           << d.k << "x" << d.n << " on " << label_);
}

void OpenClBackend::gemmBatched(bool trans_a, bool trans_b, float alpha, const Tensor& a,
                                const Tensor& b, float beta, const Tensor& c) {
  const backends::BatchedGemm g = backends::batchedGemmDims(trans_a, trans_b, a, b, c);
  requireF32(a, "gemmBatched");
  requireF32(b, "gemmBatched");
  requireF32(c, "gemmBatched");
  const backends::GemmDims& d = g.dims;
  if (g.batch == 0 || d.m == 0 || d.n == 0) return;
  if (d.k == 0) {  // c = beta * c; CLBlast rejects k = 0
    launch("scale_f32", static_cast<size_t>(c.numel()), c, static_cast<cl_ulong>(c.numel()), beta);
    return;
  }
  const cl::Buffer& ab = buffer(a);
  const cl::Buffer& bb = buffer(b);
  const cl::Buffer& cb = buffer(c);
  const auto stride = [&](const Tensor& t) { return static_cast<size_t>(t.numel() / g.batch); };
  std::lock_guard<std::mutex> lock(launch_mutex_);
  cl_command_queue q = queue_();
  const clblast::StatusCode s = clblast::GemmStridedBatched<float>(
      clblast::Layout::kRowMajor, trans_a ? clblast::Transpose::kYes : clblast::Transpose::kNo,
      trans_b ? clblast::Transpose::kYes : clblast::Transpose::kNo, static_cast<size_t>(d.m),
      static_cast<size_t>(d.n), static_cast<size_t>(d.k), alpha, ab(),
      static_cast<size_t>(a.offset()), static_cast<size_t>(a.shape()[2]), stride(a), bb(),
      static_cast<size_t>(b.offset()), static_cast<size_t>(b.shape()[2]), stride(b), beta, cb(),
      static_cast<size_t>(c.offset()), static_cast<size_t>(d.n), stride(c),
      static_cast<size_t>(g.batch), &q, nullptr);
  TANDEM_CHECK_MSG(s == clblast::StatusCode::kSuccess, DeviceError,
                   "CLBlast GemmStridedBatched failed: "
                       << clblastStatus(s) << " (" << static_cast<int>(s) << ") on " << g.batch
                       << " products of " << d.m << "x" << d.k << " by " << d.k << "x" << d.n
                       << " on " << label_);
}

double OpenClBackend::dot(const Tensor& a, const Tensor& b) {
  backends::checkSameCount(a, b, label_, "dot");
  requireF32(a, "dot");
  requireF32(b, "dot");
  const auto n = static_cast<size_t>(a.numel());
  if (n == 0) return 0;
  Kernel& k = kernel("dot_partial_f32");
  const size_t groups = std::min<size_t>((n + k.local - 1) / k.local, 256);
  const size_t acc = accBytes();
  const Tensor partial = empty({static_cast<int64_t>(groups * acc / sizeof(float))});
  // groups * local items: the kernel's grid-stride loop covers n.
  launch("dot_partial_f32", groups * k.local, a, b, static_cast<cl_ulong>(n), buffer(partial),
         cl::Local(k.local * acc));
  double total = 0;
  if (device_.fp64) {
    std::vector<double> sums(groups);
    download(partial, sums.data());
    for (double s : sums) total += s;
  } else {
    std::vector<float> sums(groups);
    download(partial, sums.data());
    for (float s : sums) total += s;
  }
  return total;
}

}  // namespace tandem::opencl
