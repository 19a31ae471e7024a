#include "backends/cpu/cpu_backend.h"

#include <cblas.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "backends/cpu/blas_core.h"
#include "backends/cpu/row_products.h"
#include "backends/op_checks.h"
#include "core/error.h"

namespace tandem::cpu {

namespace {
constexpr size_t kAlign = 64;
size_t roundUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
// Blocks of at least this size are mapped directly, so freeing them really returns the
// memory to the system (glibc keeps freed heap memory resident as fragmentation).
constexpr size_t kMapThreshold = size_t{1} << 20;

void* systemAlloc(size_t size) {
  if (size >= kMapThreshold) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  return std::aligned_alloc(kAlign, size);
}

void systemFree(void* p, size_t size) {
  if (size >= kMapThreshold) {
    munmap(p, size);
  } else {
    std::free(p);
  }
}

// The value of the first "key<tabs>: value" line of /proc/cpuinfo; "" when there is none.
std::string cpuinfoField(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t end = line.find_last_not_of(" \t", colon == 0 ? 0 : colon - 1);
    if (end == std::string::npos || line.compare(0, end + 1, key) != 0 || end + 1 != key.size())
      continue;
    const size_t start = line.find_first_not_of(' ', colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

}  // namespace

// A block from the backend's pool (it may be larger than requested, see takeBlock), or
// adopted host memory that `release_` gives back.
class CpuStorage final : public Storage {
 public:
  CpuStorage(CpuBackend* owner, size_t bytes) : Storage(owner, bytes), owner_(owner) {
    data_ = owner->takeBlock(bytes, capacity_);
  }
  CpuStorage(CpuBackend* owner, void* data, size_t bytes, std::function<void()> release)
      : Storage(owner, bytes), owner_(owner), data_(data), release_(std::move(release)) {}
  ~CpuStorage() override {
    if (release_) {
      release_();
    } else {
      owner_->returnBlock(data_, capacity_);
    }
  }
  void* data() const { return data_; }

 private:
  CpuBackend* owner_;
  void* data_;
  size_t capacity_ = 0;
  std::function<void()> release_;
};

CpuBackend::CpuBackend(const CpuOptions& options)
    : pool_(options.threads), pool_limit_(options.pool_bytes) {
  // OpenBLAS runs single-threaded and gemm() splits large products over our own pool:
  // with both thread sets alive, OpenBLAS's idle workers spin (sched_yield) while our
  // kernels run and starve them on small machines. One pool also keeps OpenBLAS's
  // process-wide thread count out of per-backend state.
  openblas_set_num_threads(1);
}

CpuBackend::~CpuBackend() {
  for (auto& [bytes, p] : free_blocks_) systemFree(p, bytes);
}

DeviceInfo CpuBackend::info() const { return hostInfo(pool_.threads()); }

// The reference backend runs the common set: every other backend is tested against it.
bool CpuBackend::supports(Op op, DType dtype) const { return commonOpSupport(op, dtype); }

void CpuBackend::synchronize() {}

DeviceInfo CpuBackend::hostInfo(int threads) {
  DeviceInfo d;
  d.name = "cpu";
  d.kind = "cpu";
  d.description = "host CPU, " + std::to_string(threads) + " thread(s), OpenBLAS " +
                  std::string(openblas_get_config());
  d.memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  d.compute_units = static_cast<int>(std::thread::hardware_concurrency());
  d.platform = "OpenBLAS " + blasCoreName();  // its kernel set decides the sgemm rate
  // x86 names its model and vendor; ARM boards often only a "Model" or "Hardware" line.
  d.model = cpuinfoField("model name");
  if (d.model.empty()) d.model = cpuinfoField("Model");
  if (d.model.empty()) d.model = cpuinfoField("Hardware");
  if (d.model.empty()) d.model = "host CPU";
  d.vendor = cpuinfoField("vendor_id");
  d.max_allocation_bytes = d.memory_bytes;
  d.host_cores = true;
  return d;
}

void* CpuBackend::takeBlock(size_t bytes, size_t& capacity) {
  const size_t size = roundUp(std::max<size_t>(bytes, 1));
  void* p = takeCachedOrNew(size, capacity);
  const int64_t live = live_bytes_ += static_cast<int64_t>(capacity);
  int64_t peak = peak_bytes_.load();
  while (live > peak && !peak_bytes_.compare_exchange_weak(peak, live)) {
  }
  return p;
}

void* CpuBackend::takeCachedOrNew(size_t size, size_t& capacity) {
  {
    // Best fit among cached blocks of at most twice the size. A repeating step converges
    // to a set of blocks that serves every request without allocating, and a smaller
    // last batch reuses the full batch's blocks instead of adding memory of its own.
    std::lock_guard<std::mutex> lock(blocks_mutex_);
    auto it = free_blocks_.lower_bound(size);
    if (it != free_blocks_.end() && it->first <= 2 * size) {
      void* p = it->second;
      capacity = it->first;
      free_bytes_ -= it->first;
      free_blocks_.erase(it);
      return p;
    }
  }
  void* p = systemAlloc(size);
  TANDEM_CHECK_MSG(p != nullptr, DeviceError, "cpu: out of memory allocating " << size << " bytes");
  capacity = size;
  return p;
}

void CpuBackend::returnBlock(void* p, size_t capacity) {
  live_bytes_ -= static_cast<int64_t>(capacity);
  {
    std::lock_guard<std::mutex> lock(blocks_mutex_);
    if (free_bytes_ + capacity <= pool_limit_) {
      free_blocks_.emplace(capacity, p);
      free_bytes_ += capacity;
      return;
    }
  }
  systemFree(p, capacity);
}

std::shared_ptr<Storage> CpuBackend::allocate(size_t bytes) {
  return std::make_shared<CpuStorage>(this, bytes);
}

std::shared_ptr<Storage> CpuBackend::adoptHost(void* data, size_t bytes,
                                               std::function<void()> release) {
  TANDEM_CHECK_MSG(data != nullptr || bytes == 0, InvalidArgument,
                   "cpu: adopting a null buffer of " << bytes << " bytes");
  TANDEM_CHECK_MSG(release != nullptr, InvalidArgument, "cpu: adopted memory needs a release");
  return std::make_shared<CpuStorage>(this, data, bytes, std::move(release));
}

void* CpuBackend::data(const Tensor& t) const {
  TANDEM_CHECK_MSG(t.defined(), InvalidArgument, "cpu: undefined tensor passed to an op");
  TANDEM_CHECK_MSG(&t.storage()->backend() == this, InvalidArgument,
                   "cpu: tensor " << t.shape() << " belongs to another backend");
  auto* s = static_cast<CpuStorage*>(t.storage());
  return static_cast<char*>(s->data()) + static_cast<size_t>(t.offset()) * dtypeSize(t.dtype());
}

float* CpuBackend::f32(const Tensor& t) const {
  TANDEM_CHECK_MSG(t.dtype() == DType::kF32, InvalidArgument,
                   "cpu: expected an f32 tensor, got " << dtypeName(t.dtype()) << " " << t.shape());
  return static_cast<float*>(data(t));
}

int32_t* CpuBackend::i32(const Tensor& t) const {
  TANDEM_CHECK_MSG(t.dtype() == DType::kI32, InvalidArgument,
                   "cpu: expected an i32 tensor, got " << dtypeName(t.dtype()) << " " << t.shape());
  return static_cast<int32_t*>(data(t));
}

void CpuBackend::upload(const Tensor& dst, const void* src) {
  if (dst.bytes()) std::memcpy(data(dst), src, dst.bytes());
}

void CpuBackend::download(const Tensor& src, void* dst) {
  if (src.bytes()) std::memcpy(dst, data(src), src.bytes());
}

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  TANDEM_CHECK_MSG(src.bytes() == dst.bytes() && src.dtype() == dst.dtype(), InvalidArgument,
                   "cpu: copy between " << src.shape() << " " << dtypeName(src.dtype()) << " and "
                                        << dst.shape() << " " << dtypeName(dst.dtype()));
  if (src.bytes()) std::memmove(data(dst), data(src), src.bytes());
}

void CpuBackend::gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                      float beta, const Tensor& c) {
  const backends::GemmDims dims = backends::gemmDims(trans_a, trans_b, a, b, c);
  const int64_t m = dims.m, n = dims.n, k = dims.k;
  if (m == 0 || n == 0) return;
  float* cp = f32(c);
  if (k == 0) {
    for (int64_t i = 0; i < m * n; ++i) cp[i] = beta == 0.0f ? 0.0f : beta * cp[i];
    return;
  }
  const float* ap = f32(a);
  const float* bp = f32(b);
  const auto lda = static_cast<blasint>(a.shape()[1]);
  const auto ldb = static_cast<blasint>(b.shape()[1]);
  const auto ldc = static_cast<blasint>(n);
  auto product = [&](int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
    // Sub-blocks of C: rows [i0, i0+rows) need rows of op(a), columns [j0, j0+cols) of op(b).
    const float* as = trans_a ? ap + i0 : ap + i0 * lda;
    const float* bs = trans_b ? bp + j0 * ldb : bp + j0;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(rows),
                static_cast<blasint>(cols), static_cast<blasint>(k), alpha, as, lda, bs, ldb, beta,
                cp + i0 * ldc + j0, ldc);
  };
  // A few rows times a weight matrix (decoding): the row kernels, which read the matrix
  // once where sgemm would first pack it (row_products.h).
  if (!trans_a && trans_b && m < kFewRows && lda == k && ldb == k) {
    fewRowsF32(pool_, ap, bp, alpha, beta, cp, m, n, k);
    return;
  }
  if (!trans_a && !trans_b && m < kFewRows && lda == k && ldb == n &&
      fewRowsNnF32(pool_, ap, bp, alpha, beta, cp, m, n, k))
    return;
  // OpenBLAS runs single-threaded (see the constructor); a large product is split into
  // one block of C per pool thread along its longer side, in multiples of 16.
  const int parts = static_cast<int>(
      std::min<int64_t>(pool_.threads(), std::max<int64_t>(1, m * n * k / (int64_t{1} << 18))));
  const bool by_cols = n >= m;
  const int64_t side = by_cols ? n : m;
  const int64_t block = (side + parts * 16 - 1) / (parts * 16) * 16;
  pool_.parallelFor((side + block - 1) / block, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t start = p * block, len = std::min(block, side - start);
      if (by_cols) {
        product(0, m, start, len);
      } else {
        product(start, len, 0, n);
      }
    }
  });
}

void CpuBackend::gemmBatched(bool trans_a, bool trans_b, float alpha, const Tensor& a,
                             const Tensor& b, float beta, const Tensor& c) {
  const backends::BatchedGemm g = backends::batchedGemmDims(trans_a, trans_b, a, b, c);
  auto block = [](const Tensor& t, int64_t i) {
    return t.slice(i, 1).reshape(t.shape().dropFirst());
  };
  // Fewer blocks than threads: each block's gemm uses the pool. Otherwise the blocks are
  // shared out, each one gemm on one thread (the same products: each element's sum runs
  // in the same order either way).
  if (g.batch < pool_.threads()) {
    for (int64_t i = 0; i < g.batch; ++i)
      gemm(trans_a, trans_b, alpha, block(a, i), block(b, i), beta, block(c, i));
    return;
  }
  if (g.dims.m == 0 || g.dims.n == 0) return;
  const float* ap = f32(a);
  const float* bp = f32(b);
  float* cp = f32(c);
  const int64_t sa = a.numel() / g.batch, sb = b.numel() / g.batch, sc = c.numel() / g.batch;
  const auto lda = static_cast<blasint>(a.shape()[2]);
  const auto ldb = static_cast<blasint>(b.shape()[2]);
  const auto ldc = static_cast<blasint>(g.dims.n);
  pool_.parallelFor(g.batch, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      if (g.dims.k == 0) {
        float* ci = cp + i * sc;
        for (int64_t e = 0; e < sc; ++e) ci[e] = beta == 0.0f ? 0.0f : beta * ci[e];
        continue;
      }
      cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                  trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(g.dims.m),
                  static_cast<blasint>(g.dims.n), static_cast<blasint>(g.dims.k), alpha,
                  ap + i * sa, lda, bp + i * sb, ldb, beta, cp + i * sc, ldc);
    }
  });
}

}  // namespace tandem::cpu
