// The OpenCL runtime under the backend: error translation, the device list, embedded
// kernel sources and the program binary cache. Cases that need a device skip, with the
// reason, when this machine has no OpenCL platform (CI installs POCL, so they run there).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "backends/opencl/program.h"
#include "backends/registry.h"
#include "tests/test_util.h"

namespace tandem::opencl {
namespace {

using testing::expectThrowWith;

// Device 0 with its own context and queue, or a skip naming why there is none.
struct Device0 {
  ClDevice device;
  cl::Context context;
  cl::CommandQueue queue;
};

std::optional<Device0> device0() {
  const auto all = listClDevices();
  if (all.empty()) return std::nullopt;
  Device0 d{all[0], cl::Context(all[0].device), {}};
  d.queue = cl::CommandQueue(d.context, all[0].device);
  return d;
}

#define REQUIRE_DEVICE(var)                                                  \
  auto var##_opt = device0();                                                \
  if (!var##_opt) GTEST_SKIP() << "no OpenCL device: " << noDevicesReason(); \
  Device0& var = *var##_opt

std::filesystem::path freshDir(const std::string& name) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(OpenClRuntimeTest, ErrorsNameTheCallTheCodeAndTheContext) {
  EXPECT_EQ(errorName(CL_OUT_OF_RESOURCES), "CL_OUT_OF_RESOURCES");
  EXPECT_EQ(errorName(CL_INVALID_KERNEL_NAME), "CL_INVALID_KERNEL_NAME");
  EXPECT_EQ(errorName(-9999), "OpenCL error -9999");
  const DeviceError e = deviceError(cl::Error(CL_MEM_OBJECT_ALLOCATION_FAILURE, "clCreateBuffer"),
                                    "allocating 3 MiB");
  EXPECT_STREQ(
      e.what(),
      "clCreateBuffer failed: CL_MEM_OBJECT_ALLOCATION_FAILURE (-4) while allocating 3 MiB");
  expectThrowWith<DeviceError>(
      [] { clCall("testing", []() -> int { throw cl::Error(CL_INVALID_VALUE, "clFoo"); }); },
      {"clFoo failed: CL_INVALID_VALUE (-30) while testing"});
}

TEST(OpenClRuntimeTest, DevicesAreNumberedWithTheirFacts) {
  const auto all = listClDevices();
  if (all.empty()) GTEST_SKIP() << "no OpenCL device: " << noDevicesReason();
  EXPECT_EQ(noDevicesReason(), "");
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].index, static_cast<int>(i));
    EXPECT_EQ(all[i].label(), "opencl:" + std::to_string(i));
    EXPECT_FALSE(all[i].name.empty());
    EXPECT_FALSE(all[i].platform_name.empty());
    EXPECT_GT(all[i].compute_units, 0);
    EXPECT_GT(all[i].global_memory, 0);
    EXPECT_GT(all[i].max_allocation, 0);
    EXPECT_LE(all[i].max_allocation, all[i].global_memory);
  }
  EXPECT_EQ(clDevice(0).name, all[0].name);
  expectThrowWith<InvalidArgument>([] { clDevice(9); },
                                   {"no OpenCL device 9", "there are opencl:0 (", all[0].name});
  expectThrowWith<InvalidArgument>([] { clDevice(-1); }, {"no OpenCL device -1"});
}

// With no ICD to load (OCL_ICD_VENDORS pointing at an empty folder) the list is empty,
// asking for opencl:0 says what to install, and the CPU backend works as ever. Runs in a fresh
// process: the loader reads its vendors once.
TEST(OpenClRuntimeTest, NoPlatformIsAnEmptyListWithAReason) {
  if (tandem::testing::emulated())
    GTEST_SKIP() << "a threadsafe death test executes the test binary again, which qemu-user "
                    "cannot do on a machine without binfmt_misc";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto empty = freshDir("no_icds");
  std::filesystem::create_directories(empty);
  EXPECT_EXIT(
      {
        setenv("OCL_ICD_VENDORS", empty.c_str(), 1);
        const bool ok = listClDevices().empty() &&
                        noDevicesReason().find("no OpenCL platform is installed") == 0;
        bool named = false;
        try {
          makeBackend("opencl:0");
        } catch (const InvalidArgument& e) {
          named = std::string(e.what()).find("pocl-opencl-icd") != std::string::npos;
        }
        // The CPU backend is unaffected: listed alone, and it computes.
        const auto devices = listDevices();
        const auto cpu = makeBackend("cpu");
        const Tensor t = cpu->zeros({3});
        cpu->fill(t, 2.0f);
        const bool cpu_works = devices.size() == 1 && devices[0].name == "cpu" &&
                               toHost(t) == std::vector<float>(3, 2.0f);
        std::exit(ok && named && cpu_works ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(OpenClRuntimeTest, KernelSourcesAreEmbedded) {
  EXPECT_NE(embeddedSource("elementwise").find("__kernel void fill_f32"), std::string::npos);
  expectThrowWith<InvalidArgument>([] { embeddedSource("nope"); },
                                   {"no embedded OpenCL source 'nope'", "elementwise"});
}

// Fills n floats from offset 3 with `value` using the program's fill_f32 and reads them
// back: the program (compiled or loaded from the cache) really runs.
std::vector<float> runFill(Device0& d, const cl::Program& program, float value) {
  const size_t n = 1000;
  cl::Buffer buf(d.context, CL_MEM_READ_WRITE, (n + 3) * sizeof(float));
  cl::Kernel fill(program, "fill_f32");
  fill.setArg(0, buf);
  fill.setArg(1, cl_ulong{3});
  fill.setArg(2, cl_ulong{n});
  fill.setArg(3, value);
  d.queue.enqueueNDRangeKernel(fill, cl::NullRange, cl::NDRange(1024), cl::NullRange);
  std::vector<float> out(n);
  d.queue.enqueueReadBuffer(buf, CL_TRUE, 3 * sizeof(float), n * sizeof(float), out.data());
  return out;
}

TEST(OpenClRuntimeTest, TheSecondBuildComesFromTheDiskCache) {
  REQUIRE_DEVICE(d);
  const ProgramCache cache(freshDir("cl_cache"));
  const std::string src = programSource("elementwise");
  BuildReport first, second;
  const cl::Program p1 = cache.build(d.context, d.device, "elementwise", src, "", &first);
  EXPECT_FALSE(first.from_cache);
  ASSERT_TRUE(std::filesystem::exists(first.cache_file)) << first.cache_file;
  EXPECT_EQ(runFill(d, p1, 2.5f), std::vector<float>(1000, 2.5f));

  // A new context, as a second start would have.
  Device0 again{d.device, cl::Context(d.device.device), {}};
  again.queue = cl::CommandQueue(again.context, d.device.device);
  const cl::Program p2 = cache.build(again.context, d.device, "elementwise", src, "", &second);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(second.cache_file, first.cache_file);
  EXPECT_EQ(runFill(again, p2, -1.0f), std::vector<float>(1000, -1.0f));

  // Other options or another source are other programs.
  BuildReport other;
  cache.build(d.context, d.device, "elementwise", src, "-cl-fast-relaxed-math", &other);
  EXPECT_FALSE(other.from_cache);
  EXPECT_NE(other.cache_file, first.cache_file);
}

TEST(OpenClRuntimeTest, ACorruptCacheFileIsRebuiltAndReplaced) {
  REQUIRE_DEVICE(d);
  const ProgramCache cache(freshDir("cl_cache_corrupt"));
  const std::string src = programSource("elementwise");
  BuildReport r;
  cache.build(d.context, d.device, "elementwise", src, "", &r);
  std::ofstream(r.cache_file, std::ios::binary | std::ios::trunc) << "not a program binary";
  BuildReport again;
  const cl::Program p = cache.build(d.context, d.device, "elementwise", src, "", &again);
  EXPECT_FALSE(again.from_cache);
  EXPECT_GT(std::filesystem::file_size(again.cache_file), 100u);
  EXPECT_EQ(runFill(d, p, 7.0f), std::vector<float>(1000, 7.0f));
  BuildReport third;
  cache.build(d.context, d.device, "elementwise", src, "", &third);
  EXPECT_TRUE(third.from_cache);
}

TEST(OpenClRuntimeTest, ACompileErrorCarriesTheBuildLog) {
  REQUIRE_DEVICE(d);
  const ProgramCache no_disk{std::filesystem::path()};
  BuildReport r;
  expectThrowWith<DeviceError>(
      [&] {
        no_disk.build(d.context, d.device, "broken",
                      "__kernel void k(__global float* x) { x[0] = undeclared_name; }", "", &r);
      },
      {"building OpenCL program 'broken' for opencl:0", "CL_BUILD_PROGRAM_FAILURE",
       "build log:", "undeclared_name"});
}

TEST(OpenClRuntimeTest, TheCacheFolderFollowsTheEnvironment) {
  const char* saved = std::getenv("TANDEM_CACHE_DIR");
  setenv("TANDEM_CACHE_DIR", "/tmp/tandem-cache-test", 1);
  EXPECT_EQ(ProgramCache::defaultDir(), std::filesystem::path("/tmp/tandem-cache-test/opencl"));
  if (saved)
    setenv("TANDEM_CACHE_DIR", saved, 1);
  else
    unsetenv("TANDEM_CACHE_DIR");
}

}  // namespace
}  // namespace tandem::opencl
