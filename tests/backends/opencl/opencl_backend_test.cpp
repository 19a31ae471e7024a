// The OpenCL backend as a whole: every layer kind forward and backward against the CPU
// reference (through the example models and two nets covering the remaining kinds),
// the device registry, the buffer pool and the errors a user can meet. Cases that need
// a device skip, with the reason, when the machine has none.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/opencl/opencl_backend.h"
#include "backends/registry.h"
#include "core/model.h"
#include "core/model_spec.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::expectThrowWith;
using testing::randomVector;

#define REQUIRE_DEVICE()               \
  if (opencl::listClDevices().empty()) \
  GTEST_SKIP() << "no OpenCL device: " << opencl::noDevicesReason()

void expectNear(const std::vector<float>& got, const std::vector<float>& want, double tol,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " element " << i;
}

// Forward (training, so dropout draws its mask) and backward of a whole model on both
// backends from the same seed and input: outputs, input gradients and every parameter
// gradient agree.
TEST(OpenClBackendTest, EveryLayerForwardAndBackwardMatchesTheCpu) {
  REQUIRE_DEVICE();
  const std::string models = std::string(TANDEM_SOURCE_DIR) + "/examples/models/";
  const std::vector<ModelSpec> specs = {
      loadModelSpec(models + "mlp.yaml"),
      loadModelSpec(models + "cnn.yaml"),
      loadModelSpec(models + "resnet-mini.yaml"),
      parseModelSpec(testing::kTinyNet),
      parseModelSpec("name: pools\ninput: [2, 9, 9]\nlayers: [{avgpool2d: {kernel: 3, stride: 2, "
                     "padding: 1}}, tanh, flatten, sigmoid, {linear: {out: 3}}]\n"),
      parseModelSpec("name: tokens\ninput: [6]\nlayers: [{embedding: {vocab: 20, dim: 8}}, "
                     "layernorm, flatten, {linear: {out: 5}}]\n"),
      parseModelSpec("name: gpt\ninput: [6]\nlayers: [{embedding: {vocab: 20, dim: 8}}, "
                     "{positional: {context: 8}}, {transformer: {heads: 2, mlp: 16}}, layernorm, "
                     "{linear: {out: 20}}]\n")};
  cpu::CpuBackend cpu;
  opencl::OpenClBackend cl;
  for (const ModelSpec& spec : specs) {
    Model a(spec), b(spec);
    a.build(cpu, 4);
    b.build(cl, 4);
    const Shape xs = a.inputShape().withBatch(3);
    const bool ids = a.inputDType() == DType::kI32;
    std::vector<int32_t> tokens;
    for (int64_t i = 0; i < xs.numel(); ++i) tokens.push_back(static_cast<int32_t>(i * 7 % 20));
    auto input = [&](Backend& be) {
      return ids ? toDeviceI32(be, xs, tokens) : toDevice(be, xs, randomVector(5, xs.numel()));
    };
    const ForwardContext ctx{true, 9};
    Stash sa, sb;
    const Tensor ya = a.forward(input(cpu), sa, ctx), yb = b.forward(input(cl), sb, ctx);
    expectNear(toHost(yb), toHost(ya), 1e-4, spec.name + " output");
    const auto dy = randomVector(6, ya.numel());
    const Tensor dxa = a.backward(toDevice(cpu, ya.shape(), dy), sa, !ids);
    const Tensor dxb = b.backward(toDevice(cl, yb.shape(), dy), sb, !ids);
    if (!ids) expectNear(toHost(dxb), toHost(dxa), 1e-4, spec.name + " input gradient");
    for (const Param* p : a.params())
      expectNear(toHost(b.param(p->name).grad), toHost(p->grad), 1e-4, spec.name + " " + p->name);
  }
}

TEST(OpenClBackendTest, TheRegistryNamesOpenClDevices) {
  expectThrowWith<InvalidArgument>([] { makeBackend("opencl:x"); },
                                   {"device 'opencl:x': expected opencl:N"});
  expectThrowWith<InvalidArgument>([] { makeBackend("opencl:"); }, {"expected opencl:N"});
  // A device that is not there names the ones that are (or why there are none).
  expectThrowWith<InvalidArgument>([] { makeBackend("opencl:9"); }, {"no OpenCL device 9"});
  const auto cl = opencl::listClDevices();
  const auto all = listDevices();
  ASSERT_EQ(all.size(), 1 + cl.size());
  EXPECT_EQ(all[0].name, "cpu");
  if (cl.empty()) GTEST_SKIP() << "no OpenCL device: " << opencl::noDevicesReason();
  expectThrowWith<InvalidArgument>([] { makeBackend("opencl:9"); }, {"there are opencl:0 ("});
  EXPECT_EQ(all[1].name, "opencl:0");
  EXPECT_EQ(all[1].kind, "opencl");
  EXPECT_EQ(all[1].memory_bytes, cl[0].global_memory);
  EXPECT_EQ(all[1].compute_units, cl[0].compute_units);
  const auto be = makeBackend("opencl:0");
  EXPECT_EQ(be->info().name, "opencl:0");
  EXPECT_NE(be->info().description.find(cl[0].name), std::string::npos);
}

TEST(OpenClBackendTest, KernelsAreSetUpFromTheCacheOnTheSecondStart) {
  REQUIRE_DEVICE();
  const auto dir = std::filesystem::path(::testing::TempDir()) / "cl_backend_cache";
  std::filesystem::remove_all(dir);
  opencl::OpenClOptions options;
  options.cache_dir = dir;
  {
    opencl::OpenClBackend first(options);
    EXPECT_EQ(first.kernelSetup().programs, 4);
    EXPECT_EQ(first.kernelSetup().from_cache, 0);
  }
  opencl::OpenClBackend second(options);
  EXPECT_EQ(second.kernelSetup().from_cache, 4);
  Tensor t = second.empty({5});
  second.fill(t, 2.0f);  // the cached programs run
  EXPECT_EQ(toHost(t), std::vector<float>(5, 2.0f));
}

TEST(OpenClBackendTest, FreedBuffersAreReused) {
  REQUIRE_DEVICE();
  opencl::OpenClBackend be;
  { Tensor a = be.empty({1000}), b = be.empty({3000}); }
  const size_t held = be.allocatedBytes();
  EXPECT_GE(held, 4000 * sizeof(float));
  for (int i = 0; i < 10; ++i) {  // a steady step: the same sizes again
    Tensor a = be.empty({1000}), b = be.empty({3000});
    be.fill(a, 1.0f);
  }
  EXPECT_EQ(be.allocatedBytes(), held);
  opencl::OpenClOptions no_pool;
  no_pool.pool_bytes = 0;
  opencl::OpenClBackend unpooled(no_pool);
  { Tensor a = unpooled.empty({1000}); }
  EXPECT_EQ(unpooled.allocatedBytes(), 0u);
}

TEST(OpenClBackendTest, AnAllocationBeyondTheDeviceNamesTheTensorAndBothSizes) {
  REQUIRE_DEVICE();
  opencl::OpenClBackend be;
  const int64_t max = be.device().max_allocation;
  const int64_t rows = max / (1 << 20) / 4 + 1;  // [rows, 2^20] f32 is just over it
  const int64_t bytes = rows * (1 << 20) * 4;
  expectThrowWith<DeviceError>(
      [&] {
        be.empty({rows, 1 << 20});
      },
      {"tensor [" + std::to_string(rows) + ", 1048576] f32: opencl:0 cannot allocate " +
           std::to_string(bytes) + " bytes",
       "its largest buffer is " + std::to_string(max) + " bytes"});
  // A model that cannot fit is refused before anything is allocated, with both sizes.
  const int64_t in = max / 4 / 64 + 1;
  const ModelSpec spec = parseModelSpec("name: huge\ninput: [" + std::to_string(in) +
                                        "]\nlayers: [{linear: {out: 64}}]\n");
  Model m(spec);
  expectThrowWith<InvalidArgument>(
      [&] { m.build(be, 1); },
      {"model 'huge' has", "needing", "opencl:0 has " + std::to_string(be.device().global_memory)});
}

TEST(OpenClBackendTest, BadIdsAndLabelsAreNamed) {
  REQUIRE_DEVICE();
  opencl::OpenClBackend be;
  Tensor table = be.zeros({4, 3}), y = be.empty({2, 3});
  Tensor ids = toDeviceI32(be, {2}, {1, 4});
  expectThrowWith<InvalidArgument>([&] { be.embedding(ids, table, y); },
                                   {"embedding id 4 at position 1 is outside [0, 4)"});
  expectThrowWith<InvalidArgument>([&] { be.embeddingBackward(ids, y, table); },
                                   {"embedding id 4 at position 1"});
  Tensor logits = be.zeros({2, 3}), losses = be.empty({2});
  expectThrowWith<InvalidArgument>(
      [&] {
        be.softmaxCrossEntropy(logits, toDeviceI32(be, {2}, {-1, 0}), 1, losses, Tensor());
      },
      {"label -1 of sample 0 is outside [0, 3)"});
  expectThrowWith<InvalidArgument>([&] { be.axpby(1, be.empty({3}), 1, be.empty({4})); },
                                   {"opencl:0 axpby: element counts differ"});
  cpu::CpuBackend cpu;
  expectThrowWith<InvalidArgument>([&] { be.fill(cpu.empty({2}), 0); },
                                   {"belongs to another backend"});
}

}  // namespace
}  // namespace tandem
