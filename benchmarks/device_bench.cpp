// Per-device microbenchmarks, for the CPU and every OpenCL device: sgemm GFLOP/s,
// element-wise GB/s, host<->device bandwidth, and the forward and backward time of
// every layer of the example models. Each figure with a reference is printed beside it
// at the end, with the ratio (ours / reference, > 1 is faster):
//   sgemm       our Backend::gemm   vs standalone OpenBLAS (CPU) or CLBlast (OpenCL),
//               same sizes, same threads / device;
//   axpby, mul, relu (GB/s moved)   vs the device's own buffer copy (memcpy on the CPU);
//   upload, download                vs a host memcpy of the same size.
// Before the benchmarks it prints each OpenCL device's kernel set-up time on a first
// start (empty binary cache) and a second (from the cache). POCL keeps its own compiler
// cache: run with POCL_KERNEL_CACHE=0 to see the compile time ours replaces.
//
//   build/release/benchmarks/device_bench [--benchmark_filter=sgemm]
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <clblast.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "backends/cpu/blas_core.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/opencl/opencl_backend.h"
#include "benchmarks/ratio_reporter.h"
#include "core/model_spec.h"
#include "core/profile/measure.h"

namespace tandem::bench {
namespace {

int hostThreads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

// Backends live for the whole run: OpenCL start-up (and CLBlast's first compile) stays
// out of the timings.
Backend& device(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Backend>> all;
  auto& slot = all[name];
  if (!slot) {
    if (name == "cpu") {
      slot = std::make_unique<cpu::CpuBackend>(cpu::CpuOptions{hostThreads()});
    } else {
      opencl::OpenClOptions o;
      o.device = std::stoi(name.substr(7));
      slot = std::make_unique<opencl::OpenClBackend>(o);
    }
  }
  return *slot;
}

// FLOPs as items: the items_per_second column reads as FLOP/s.
void setFlops(benchmark::State& state, double flops_per_iteration) {
  state.SetItemsProcessed(static_cast<int64_t>(flops_per_iteration) * state.iterations());
}

// --- sgemm ---

void oursGemm(benchmark::State& state, std::string dev) {
  Backend& be = device(dev);
  if (dev == "cpu") openblas_set_num_threads(1);  // our CPU GEMM splits over its own pool
  GemmRunner g(be, state.range(0));
  g.run();  // warm-up: CLBlast compiles a kernel on its first use of a shape class
  for (auto _ : state) g.run();
  setFlops(state, g.flops());
}

void openblasGemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a), c(a.size());
  openblas_set_num_threads(hostThreads());  // the same cores our CPU GEMM uses
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(n),
                static_cast<blasint>(n), static_cast<blasint>(n), 1.0f, a.data(),
                static_cast<blasint>(n), b.data(), static_cast<blasint>(n), 0.0f, c.data(),
                static_cast<blasint>(n));
  }
  openblas_set_num_threads(1);
  setFlops(state, 2.0 * n * n * n);
}

// CLBlast on its own context and queue on the same device, as a user calling it directly.
void clblastGemm(benchmark::State& state, int index) {
  const opencl::ClDevice d = opencl::clDevice(index);
  cl::Context context(d.device);
  cl::CommandQueue queue(context, d.device);
  const auto n = static_cast<size_t>(state.range(0));
  std::vector<float> host(n * n, 0.5f);
  cl::Buffer a(context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * n * 4, host.data());
  cl::Buffer b(context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * n * 4, host.data());
  cl::Buffer c(context, CL_MEM_READ_WRITE, n * n * 4);
  cl_command_queue q = queue();
  auto gemm = [&] {
    const auto s = clblast::Gemm<float>(clblast::Layout::kRowMajor, clblast::Transpose::kNo,
                                        clblast::Transpose::kNo, n, n, n, 1.0f, a(), 0, n, b(), 0,
                                        n, 0.0f, c(), 0, n, &q, nullptr);
    queue.finish();
    return s == clblast::StatusCode::kSuccess;
  };
  if (!gemm()) state.SkipWithError("CLBlast Gemm failed");  // also the warm-up
  for (auto _ : state) {
    if (!gemm()) {
      state.SkipWithError("CLBlast Gemm failed");
      break;
    }
  }
  setFlops(state, 2.0 * static_cast<double>(n) * n * n);
}

// --- element-wise and copies ---

enum class Elementwise { kAxpby, kMul, kRelu, kCopy };

void elementwise(benchmark::State& state, std::string dev, Elementwise op) {
  Backend& be = device(dev);
  const int64_t n = state.range(0);
  Tensor x = be.zeros({n}), y = be.zeros({n});
  be.fill(x, 0.5f);
  // Arrays read or written per element.
  const int streams = op == Elementwise::kRelu || op == Elementwise::kCopy ? 2 : 3;
  for (auto _ : state) {
    switch (op) {
      case Elementwise::kAxpby:
        be.axpby(0.5f, x, 0.5f, y);  // reads x, y; writes y
        break;
      case Elementwise::kMul:
        be.mul(x, x, y);
        break;
      case Elementwise::kRelu:
        be.activation(Activation::kReLU, x, y);
        break;
      case Elementwise::kCopy:  // the device's own copy: the bandwidth reference
        be.copy(x, y);
        break;
    }
    be.synchronize();
  }
  state.SetBytesProcessed(state.iterations() * n * 4 * streams);
}

void hostMemcpy(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  std::vector<float> a(n, 0.5f), b(n);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), n * 4);
    benchmark::DoNotOptimize(b.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * 4 * 2));
}

void transfer(benchmark::State& state, std::string dev, bool to_device) {
  Backend& be = device(dev);
  const int64_t n = state.range(0);
  std::vector<float> host(static_cast<size_t>(n), 0.5f);
  Tensor t = be.zeros({n});
  for (auto _ : state) {
    if (to_device) {
      be.upload(t, host.data());
      be.synchronize();
    } else {
      be.download(t, host.data());
    }
  }
  // Counted like memcpy (read + write), so the ratio compares like with like.
  state.SetBytesProcessed(state.iterations() * n * 4 * 2);
}

// --- layers of the example models ---

void layerTime(benchmark::State& state, std::string dev, std::string model_path, size_t i,
               bool backward) {
  Backend& be = device(dev);
  static std::map<std::string, std::pair<std::unique_ptr<Model>, std::unique_ptr<LayerRunner>>>
      prepared;
  auto& [model, runner] = prepared[dev + model_path];
  if (!runner) {
    model = std::make_unique<Model>(loadModelSpec(model_path));
    model->build(be, 1);
    runner = std::make_unique<LayerRunner>(*model, 64);
  }
  for (auto _ : state) {
    if (backward) {
      runner->backward(i);
    } else {
      runner->forward(i);
    }
  }
  state.SetItemsProcessed(state.iterations() * 64);  // samples
}

void printKernelSetup(const opencl::ClDevice& d) {
  const auto dir = std::filesystem::temp_directory_path() / "tandem_device_bench_cache";
  std::filesystem::remove_all(dir);
  opencl::OpenClOptions o;
  o.device = d.index;
  o.cache_dir = dir;
  const double first = opencl::OpenClBackend(o).kernelSetup().seconds;
  const opencl::KernelSetup second = opencl::OpenClBackend(o).kernelSetup();
  std::printf(
      "%s kernel set-up: first start %.3f s (compiled), second start %.3f s (%d of %d "
      "programs from the binary cache), %.1fx faster\n",
      d.label().c_str(), first, second.seconds, second.from_cache, second.programs,
      first / second.seconds);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  using namespace tandem;
  using namespace tandem::bench;
  cpu::useFasterBlasCore(argv);  // the kernels tandem's programs run
  benchmark::Initialize(&argc, argv);
  std::vector<std::string> devices{"cpu"};
  for (const opencl::ClDevice& d : opencl::listClDevices()) {
    printKernelSetup(d);
    devices.push_back(d.label());
  }
  std::vector<RatioRule> rules;
  for (const std::string& dev : devices) {
    const bool cpu = dev == "cpu";
    for (int64_t n : {256, 512, 1024, 2048})
      benchmark::RegisterBenchmark(("sgemm/ours/" + dev).c_str(), oursGemm, dev)
          ->Arg(n)
          ->UseRealTime();
    if (cpu) {
      benchmark::RegisterBenchmark("sgemm/openblas/cpu", openblasGemm)
          ->Arg(256)
          ->Arg(512)
          ->Arg(1024)
          ->Arg(2048)
          ->UseRealTime();
      rules.push_back({"sgemm/ours/cpu/", "sgemm/openblas/cpu/", "sgemm cpu vs OpenBLAS"});
    } else {
      const int index = std::stoi(dev.substr(7));
      benchmark::RegisterBenchmark(("sgemm/clblast/" + dev).c_str(), clblastGemm, index)
          ->Arg(256)
          ->Arg(512)
          ->Arg(1024)
          ->Arg(2048)
          ->UseRealTime();
      rules.push_back({"sgemm/ours/" + dev + "/", "sgemm/clblast/" + dev + "/",
                       "sgemm " + dev + " vs CLBlast"});
    }
    const std::string copy_ref = cpu ? "copy/memcpy/host/" : "copy/ours/" + dev + "/";
    for (auto [name, op] : {std::pair{"axpby", Elementwise::kAxpby},
                            {"mul", Elementwise::kMul},
                            {"relu", Elementwise::kRelu},
                            {"copy", Elementwise::kCopy}}) {
      benchmark::RegisterBenchmark((std::string(name) + "/ours/" + dev).c_str(), elementwise, dev,
                                   op)
          ->Arg(1 << 20)
          ->Arg(1 << 24)
          ->UseRealTime();
      if (op != Elementwise::kCopy || cpu)
        rules.push_back({std::string(name) + "/ours/" + dev + "/", copy_ref,
                         std::string(name) + " " + dev + " vs copy"});
    }
    if (!cpu) {
      for (bool up : {true, false}) {
        const std::string name = std::string(up ? "upload" : "download") + "/ours/" + dev;
        benchmark::RegisterBenchmark(name.c_str(), transfer, dev, up)
            ->Arg(1 << 20)
            ->Arg(1 << 24)
            ->UseRealTime();
        rules.push_back({name + "/", "copy/memcpy/host/",
                         std::string(up ? "upload " : "download ") + dev + " vs memcpy"});
      }
    }
    for (const char* m : {"mlp", "cnn", "resnet-mini"}) {
      const std::string path = std::string(TANDEM_SOURCE_DIR) + "/examples/models/" + m + ".yaml";
      Model spec_only(loadModelSpec(path));
      for (size_t i = 0; i < spec_only.size(); ++i) {
        for (bool bwd : {false, true}) {
          const std::string name = "layer/" + dev + "/" + m + "/" + std::to_string(i) + "_" +
                                   spec_only.layer(i).type() + (bwd ? "/backward" : "/forward");
          benchmark::RegisterBenchmark(name.c_str(), layerTime, dev, path, i, bwd)->UseRealTime();
        }
      }
    }
  }
  benchmark::RegisterBenchmark("copy/memcpy/host", hostMemcpy)
      ->Arg(1 << 20)
      ->Arg(1 << 24)
      ->UseRealTime();
  RatioReporter reporter(rules);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.printRatios();
  benchmark::Shutdown();
  return 0;
}
