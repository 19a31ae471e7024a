// PyTorch parity: models PyTorch built, exported to ONNX and trained (the fixtures in
// tests/data/onnx-parity, written by scripts/onnx-parity-fixtures: an MLP, CNNs, a GPT of
// two transformer blocks whose attention is written out as GPTs usually write it, a CNN
// whose batch norms train on batch statistics, and a DenseNet as torchvision writes it),
// imported and run here on the CPU and on every OpenCL device: the forward output, the
// loss, the input and parameter gradients of one batch, and the parameters (and batch
// norms' running statistics) after K steps of SGD with momentum match PyTorch's. Prints
// the largest error of each per model and device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/opencl/devices.h"
#include "backends/registry.h"
#include "core/file.h"
#include "core/loss.h"
#include "core/model_file.h"
#include "core/optimizer.h"
#include "onnx/onnx_import.h"

namespace tandem::onnx_io {
namespace {

const std::string kFixtures = TANDEM_SOURCE_DIR "/tests/data/onnx-parity/";

struct Fixture {
  nlohmann::json meta;
  std::string bin;

  explicit Fixture(const std::string& name)
      : meta(nlohmann::json::parse(readFile(kFixtures + name + ".json", "fixture"))),
        bin(readFile(kFixtures + name + ".bin", "fixture")) {}

  std::vector<float> values(const std::string& key, Shape* shape = nullptr) const {
    const auto& t = meta.at("tensors").at(key);
    std::vector<int64_t> dims = t.at("shape").get<std::vector<int64_t>>();
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    const size_t at = t.at("offset").get<size_t>();
    EXPECT_LE(at + v.size() * 4, bin.size()) << key;
    std::memcpy(v.data(), bin.data() + at, v.size() * 4);
    if (shape) *shape = Shape(dims);
    return v;
  }
};

// Largest |a - b| / (1 + |b|).
double error(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double e = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    e = std::max(e, std::fabs(double(a[i]) - b[i]) / (1.0 + std::fabs(double(b[i]))));
  return e;
}

struct Errors {
  double forward = 0, loss = 0, input_grad = 0, grads = 0, after = 0;
  double stats_start = 0, stats_after = 0;  // batch norms' running statistics
};

Errors compare(const std::string& name, const std::string& device) {
  const Fixture f(name);
  const ImportedModel imported = importOnnx(kFixtures + name + ".onnx");
  const std::unique_ptr<Backend> be = makeBackend(device, BackendOptions{1});
  const std::unique_ptr<Model> model = loadModel(toModelFile(imported), *be);
  // The model's parameters by the ONNX initializer each came from: PyTorch's names; one
  // the exporter renamed (a weight it transposed for a MatMul) by its starting values.
  std::map<std::string, Param*> by_name;
  std::vector<std::vector<float>> start;
  for (size_t i = 0; i < imported.params.size(); ++i) {
    by_name[imported.params[i].name] = model->params()[i];
    start.push_back(toHost(model->params()[i]->value));
  }
  const auto param = [&](const std::string& torch_name) -> Param* {
    if (const auto it = by_name.find(torch_name); it != by_name.end()) return it->second;
    const std::vector<float> init = f.values("init/" + torch_name);
    Param* found = nullptr;
    for (size_t i = 0; i < start.size(); ++i)
      if (start[i] == init) {
        if (found) ADD_FAILURE() << name << ": '" << torch_name << "' matches two parameters";
        found = model->params()[i];
      }
    if (!found) ADD_FAILURE() << name << ": no parameter from '" << torch_name << "'";
    return found;
  };
  const int steps = f.meta.at("steps").get<int>();
  // A label per sample, or (a language model) per token.
  const auto labels = [&](int k) {
    std::vector<int32_t> l;
    for (const auto& v : f.meta.at("labels").at(k))
      if (v.is_array()) {
        for (const auto& w : v) l.push_back(w.get<int32_t>());
      } else {
        l.push_back(v.get<int32_t>());
      }
    return toDeviceI32(*be, Shape{static_cast<int64_t>(l.size())}, l);
  };
  const auto input = [&](int k) {
    Shape s;
    const std::vector<float> v = f.values("input." + std::to_string(k), &s);
    if (model->inputDType() != DType::kI32) return toDevice(*be, s, v);
    return toDeviceI32(*be, s, std::vector<int32_t>(v.begin(), v.end()));  // token ids
  };
  const auto count = static_cast<float>(
      f.meta.at("labels").at(0).size() *
      (f.meta.at("labels").at(0).at(0).is_array() ? f.meta.at("labels").at(0).at(0).size() : 1));
  Errors e;
  const nlohmann::json buffers = f.meta.value("buffers", nlohmann::json::array());
  for (const auto& b : buffers)
    if (Param* mine = param(b.get<std::string>()))
      e.stats_start = std::max(
          e.stats_start, error(toHost(mine->value), f.values("init/" + b.get<std::string>())));
  // One batch: forward, loss, backward.
  Stash stash;
  const Tensor y = model->forward(input(0), stash, ForwardContext{true, 0});
  e.forward = error(toHost(y), f.values("output"));
  const Tensor dy = be->empty(y.shape());
  const double loss = softmaxCrossEntropy(*be, y, labels(0), 1.0f / count, dy) / double(count);
  const double want = f.meta.at("losses").at(0).get<double>();
  e.loss = std::fabs(loss - want) / (1 + std::fabs(want));
  model->zeroGrad();
  const bool ids = model->inputDType() == DType::kI32;  // (token ids have no gradient)
  const Tensor dx = model->backward(dy, stash, !ids);
  if (!ids) e.input_grad = error(toHost(dx), f.values("input_grad"));
  for (const auto& p : f.meta.at("params"))
    if (Param* mine = param(p.get<std::string>()))
      e.grads =
          std::max(e.grads, error(toHost(mine->grad), f.values("grad/" + p.get<std::string>())));
  // K steps of SGD with momentum, one batch each.
  model->zeroGrad();
  OptimizerOptions o;
  o.lr = f.meta.at("lr").get<float>();
  o.momentum = f.meta.at("momentum").get<float>();
  Optimizer opt(*be, o);
  for (int k = 0; k < steps; ++k) {
    Stash s;
    const Tensor yk = model->forward(input(k), s, ForwardContext{true, 0});
    const Tensor g = be->empty(yk.shape());
    softmaxCrossEntropy(*be, yk, labels(k), 1.0f / count, g);
    model->backward(g, s, false);
    opt.step(model->params());
    model->zeroGrad();
  }
  for (const auto& p : f.meta.at("params"))
    if (Param* mine = param(p.get<std::string>()))
      e.after =
          std::max(e.after, error(toHost(mine->value), f.values("after/" + p.get<std::string>())));
  for (const auto& b : buffers)
    if (Param* mine = param(b.get<std::string>()))
      e.stats_after = std::max(
          e.stats_after, error(toHost(mine->value), f.values("after/" + b.get<std::string>())));
  return e;
}

TEST(OnnxParityTest, PyTorchsModelsMatchForwardGradientsAndTrainingOnEveryDevice) {
  std::vector<std::string> devices = {"cpu"};
  for (const auto& d : opencl::listClDevices()) devices.push_back(d.label());
  std::printf("PyTorch parity (largest |ours - torch| / (1 + |torch|)):\n");
  std::printf("%-8s %-10s %10s %10s %10s %10s %10s %10s %10s\n", "model", "device", "forward",
              "loss", "input grad", "grads", "after K", "bn start", "bn after");
  for (const char* model : {"mlp", "cnn", "rescnn", "gpt", "mobile", "bncnn", "dense", "shuffle"})
    for (const std::string& device : devices) {
      SCOPED_TRACE(std::string(model) + " on " + device);
      const Errors e = compare(model, device);
      std::printf("%-8s %-10s %10.2g %10.2g %10.2g %10.2g %10.2g %10.2g %10.2g\n", model,
                  device.c_str(), e.forward, e.loss, e.input_grad, e.grads, e.after, e.stats_start,
                  e.stats_after);
      EXPECT_LE(e.forward, 1e-5);
      EXPECT_LE(e.loss, 1e-5);
      EXPECT_LE(e.input_grad, 1e-4);
      EXPECT_LE(e.grads, 1e-4);
      // Batch norms divide by a batch's deviation (BatchNorm1d's of 4 samples per feature),
      // which magnifies the two sides' rounding over K steps: 9e-5 here.
      EXPECT_LE(e.after, std::string(model) == "bncnn" ? 1e-3 : 1e-4);
      EXPECT_EQ(e.stats_start, 0.0);
      EXPECT_LE(e.stats_after, 1e-5);
    }
}

}  // namespace
}  // namespace tandem::onnx_io
