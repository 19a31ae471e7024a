// torchvision's models (issue 48's zoo) as PyTorch exports them, batch-norm statistics
// perturbed so that their folding matters (scripts/torchvision-zoo, which needs
// torchvision: skipped without it, as in CI): each one tandem expresses imports and its
// output matches PyTorch's eval output; each other is refused naming a node. Prints
// every model's error or refusal.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file.h"
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

TEST(OnnxZooTest, TorchvisionModelsImportAndMatchPyTorchOrAreRefusedNamed) {
  if (std::system("/usr/bin/python3 -c 'import torchvision' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "no torchvision (python3-torchvision; scripts/setup --with-peer)";
  const std::string dir = testing::freshDir("zoo");
  const std::string script = std::string(TANDEM_SOURCE_DIR) + "/scripts/torchvision-zoo";
  ASSERT_EQ(std::system((script + " " + dir + " > " + dir + "/export.log 2>&1").c_str()), 0)
      << readFile(dir + "/export.log", "export log");
  std::ifstream list(dir + "/models.txt");
  std::string name;
  int64_t h = 0, w = 0;
  std::set<std::string> imported;
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
    const std::vector<float> got = test::forward(m, x);
    const std::vector<float> want = floatsIn(dir + "/" + name + ".output.bin");
    ASSERT_EQ(got.size(), want.size());
    double err = 0;
    for (size_t i = 0; i < got.size(); ++i)
      err = std::max(err, std::fabs(double(got[i]) - want[i]) / (1.0 + std::fabs(double(want[i]))));
    std::printf("  %-20s %zu layers, error %.2g\n", name.c_str(), m.spec.layers.size(), err);
    EXPECT_LE(err, 1e-4);
    imported.insert(name);
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
}

}  // namespace
}  // namespace tandem::onnx_io
