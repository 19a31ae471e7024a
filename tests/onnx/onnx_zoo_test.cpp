// torchvision's models (issue 48's zoo) as PyTorch exports them, batch-norm statistics
// perturbed so that their folding matters (scripts/torchvision-zoo, which needs
// torchvision: skipped without it, as in CI): each one tandem expresses imports, its
// output matches PyTorch's eval output on the CPU and every OpenCL device, and it exports
// back to a graph ONNX's checker accepts that imports as the same model; each other is
// refused naming a node. Prints every model's error or refusal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/opencl/devices.h"
#include "core/error.h"
#include "core/file.h"
#include "core/model_spec.h"
#include "tests/onnx/onnx_test_util.h"
#include "tests/test_util.h"

namespace tandem::onnx_io {
namespace {

std::vector<float> floatsIn(const std::string& path) {
  const std::string bytes = readFile(path, "zoo tensor");
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// How much farther from PyTorch's float64 gradients ours may be than its float32 ones.
constexpr double kStepFactor = 4;

// Largest |a - b| / (1 + |b|).
double largestError(const float* a, const float* b, size_t n) {
  double err = 0;
  for (size_t i = 0; i < n; ++i)
    err = std::max(err, std::fabs(double(a[i]) - b[i]) / (1.0 + std::fabs(double(b[i]))));
  return err;
}

// A training step's gradients, ours and PyTorch's float32 ones, each against PyTorch's
// float64 ones (the input's, and the largest over the parameters).
struct StepErrors {
  double output = 0;  // ours against PyTorch's float32 output
  double input = 0, params = 0, torch_input = 0, torch_params = 0;
  size_t compared = 0;  // parameters
};

// One training step of NAME.train.onnx (batch norms on the batch's statistics) for the
// loss sum(y * dy).
StepErrors trainingStep(const std::string& base, int64_t h, int64_t w) {
  const ImportedModel imported = importOnnx(base + ".train.onnx");
  cpu::CpuBackend be(cpu::CpuOptions{1});
  const std::unique_ptr<Model> model = loadModel(toModelFile(imported), be);
  Stash stash;
  const Shape xs{2, 3, h, w};
  const Tensor y = model->forward(toDevice(be, xs, floatsIn(base + ".batch.bin")), stash,
                                  ForwardContext{true, 0});
  const std::vector<float> dy = floatsIn(base + ".dy.bin"), y_torch = floatsIn(base + ".y.bin");
  EXPECT_EQ(static_cast<size_t>(y.numel()), dy.size());
  EXPECT_EQ(y_torch.size(), dy.size());
  StepErrors e;
  e.output = largestError(toHost(y).data(), y_torch.data(), std::min(dy.size(), y_torch.size()));
  model->zeroGrad();
  const std::vector<float> dx = toHost(model->backward(toDevice(be, y.shape(), dy), stash, true));
  const std::vector<float> f32 = floatsIn(base + ".dx.bin"), f64 = floatsIn(base + ".dx64.bin");
  EXPECT_EQ(f32.size(), f64.size());
  EXPECT_GE(f64.size(), dx.size());
  e.input = largestError(dx.data(), f64.data(), dx.size());
  e.torch_input = largestError(f32.data(), f64.data(), dx.size());
  std::map<std::string, Param*> by_name;
  for (size_t i = 0; i < imported.params.size(); ++i)
    by_name[imported.params[i].name] = model->params()[i];
  std::ifstream names(base + ".grads.txt");
  std::string name;
  size_t count = 0, at = dx.size();
  while (names >> name >> count) {
    const auto it = by_name.find(name);
    EXPECT_NE(it, by_name.end()) << "no parameter '" << name << "'";
    if (it != by_name.end() && at + count <= f64.size()) {
      const std::vector<float> g = toHost(it->second->grad);
      EXPECT_EQ(g.size(), count) << name;
      const size_t n = std::min(g.size(), count);
      e.params = std::max(e.params, largestError(g.data(), f64.data() + at, n));
      e.torch_params = std::max(e.torch_params, largestError(f32.data() + at, f64.data() + at, n));
      ++e.compared;
    }
    at += count;
  }
  EXPECT_EQ(at, f64.size());
  return e;
}

TEST(OnnxZooTest, TorchvisionModelsImportAndMatchPyTorchOrAreRefusedNamed) {
  if (std::system("/usr/bin/python3 -c 'import torchvision' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "no torchvision (python3-torchvision; scripts/setup --with-peer)";
  const std::string dir = testing::freshDir("zoo");
  const std::string script = std::string(TANDEM_SOURCE_DIR) + "/scripts/torchvision-zoo";
  ASSERT_EQ(std::system((script + " " + dir + " > " + dir + "/export.log 2>&1").c_str()), 0)
      << readFile(dir + "/export.log", "export log");
  std::vector<std::string> devices = {"cpu"};
  for (const auto& d : opencl::listClDevices()) devices.push_back(d.label());
  std::ifstream list(dir + "/models.txt");
  std::string name;
  int64_t h = 0, w = 0;
  std::set<std::string> imported, trained;
  std::printf("torchvision's models (largest |ours - torch| / (1 + |torch|), or the refusal):\n");
  while (list >> name >> h >> w) {
    SCOPED_TRACE(name);
    ImportedModel m;
    try {
      m = importOnnx(dir + "/" + name + ".onnx");
    } catch (const Error& e) {
      std::printf("  %-20s refused: %s\n", name.c_str(), e.what());
      EXPECT_NE(std::string(e.what()).find("node '"), std::string::npos) << e.what();
      continue;
    }
    onnx::TensorProto x;
    x.set_data_type(onnx::TensorProto::FLOAT);
    for (const int64_t d : {int64_t{1}, int64_t{3}, h, w}) x.add_dims(d);
    for (const float v : floatsIn(dir + "/" + name + ".input.bin")) x.add_float_data(v);
    const std::vector<float> want = floatsIn(dir + "/" + name + ".output.bin");
    for (const std::string& device : devices) {
      const std::vector<float> got = test::forward(m, x, false, device);
      ASSERT_EQ(got.size(), want.size()) << device;
      const double err = largestError(got.data(), want.data(), got.size());
      std::printf("  %-20s %zu layers, error %.2g (%s)\n", name.c_str(), m.spec.layers.size(), err,
                  device.c_str());
      EXPECT_LE(err, 1e-4) << device;
    }
    imported.insert(name);
    // Exported, checked by ONNX's checker, imported again: the same layers and bitwise the
    // same weights.
    const ModelFile file = toModelFile(m);
    const onnx::ModelProto out = exportOnnx(file);
    EXPECT_NO_THROW(onnx::checker::check_model(out));
    const ModelFile back = toModelFile(importOnnx(out, name + ".exported.onnx"));
    EXPECT_EQ(modelSpecYaml(Model(back.spec).spec()), modelSpecYaml(Model(file.spec).spec()));
    EXPECT_EQ(back.params.size(), file.params.size());
    size_t same = 0;
    for (size_t i = 0; i < std::min(back.params.size(), file.params.size()); ++i)
      same += back.params[i].name == file.params[i].name &&
              back.params[i].shape == file.params[i].shape &&
              back.params[i].data == file.params[i].data;
    EXPECT_EQ(same, file.params.size()) << "parameters back bitwise";
    try {
      const StepErrors step = trainingStep(dir + "/" + name, h, w);
      std::printf(
          "  %-20s training step: output %.2g; against float64, input gradient %.2g (PyTorch's "
          "float32 %.2g), %zu parameters' gradients %.2g (%.2g)\n",
          "", step.output, step.input, step.torch_input, step.compared, step.params,
          step.torch_params);
      EXPECT_LE(step.output, 1e-4);
      // As close to the exact gradients as PyTorch's own float32 ones, within a factor.
      EXPECT_LE(step.input, std::max(kStepFactor * step.torch_input, 1e-5));
      EXPECT_LE(step.params, std::max(kStepFactor * step.torch_params, 1e-4));
      trained.insert(name);
    } catch (const Error& e) {
      std::printf("  %-20s training step refused: %s\n", "", e.what());
      EXPECT_NE(std::string(e.what()).find("node '"), std::string::npos) << e.what();
    }
  }
  // What imports today (a regression if it stops): the chains of depthwise convolutions
  // and ReLU6, and of residual blocks whose downsampling shortcut has a (folded) bias;
  // squeeze-and-excitation gates (hard swish and hard sigmoid, or SiLU and sigmoid).
  EXPECT_TRUE(imported.count("mobilenet_v2"));
  EXPECT_TRUE(imported.count("resnet18"));
  EXPECT_TRUE(imported.count("resnet50"));        // bottleneck blocks
  EXPECT_TRUE(imported.count("regnet_x_400mf"));  // grouped convolutions too
  EXPECT_TRUE(imported.count("mobilenet_v3_small"));
  EXPECT_TRUE(imported.count("efficientnet_b0"));
  EXPECT_TRUE(imported.count("squeezenet1_1"));  // fire modules' concats, ceil-mode pooling
  EXPECT_TRUE(imported.count("densenet121"));    // dense blocks, batch norms after the joins
  // chunk's slices, channel shuffles, shapes folded from Shape nodes; and as it trains.
  EXPECT_TRUE(imported.count("shufflenet_v2_x0_5"));
  EXPECT_TRUE(trained.count("shufflenet_v2_x0_5"));
}

}  // namespace
}  // namespace tandem::onnx_io
