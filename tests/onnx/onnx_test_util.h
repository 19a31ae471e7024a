// Helpers of the ONNX tests (onnx_test.cpp, onnx_export_test.cpp,
// onnx_patterns_test.cpp): protobuf files read, an imported model run forward, tandem
// models of every layer type saved and run.
#pragma once

#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"
#include "core/error.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "onnx/onnx_export.h"
#include "onnx/onnx_import.h"
#include "tests/process_util.h"
#include "tests/test_util.h"

namespace tandem::onnx_io::test {

namespace fs = std::filesystem;

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline onnx::TensorProto readTensor(const fs::path& p) {
  onnx::TensorProto t;
  EXPECT_TRUE(t.ParseFromString(slurp(p))) << p;
  return t;
}

inline std::vector<float> floats(const onnx::TensorProto& t) {
  if (!t.raw_data().empty()) {
    std::vector<float> v(t.raw_data().size() / 4);  // (none of an int8 tensor's 3 bytes)
    if (!v.empty()) std::memcpy(v.data(), t.raw_data().data(), v.size() * 4);
    return v;
  }
  return {t.float_data().begin(), t.float_data().end()};
}

// The imported model, built on `device` (backends/registry.h's name) with its imported
// weights, run forward (inference) on the batch `x`.
// (Integer ids, int64 in ONNX, go in as tandem's int32.)
inline std::vector<float> forward(const ImportedModel& imported, const onnx::TensorProto& x,
                                  bool training = false, const std::string& device = "cpu") {
  const std::unique_ptr<Backend> owned = makeBackend(device, BackendOptions{1});
  Backend& be = *owned;
  const std::unique_ptr<Model> model = loadModel(toModelFile(imported), be);
  const Shape shape(std::vector<int64_t>(x.dims().begin(), x.dims().end()));
  Stash stash;
  Tensor in;
  if (x.data_type() == onnx::TensorProto::INT64) {
    std::vector<int32_t> ids;
    if (!x.raw_data().empty()) {
      std::vector<int64_t> v(x.raw_data().size() / 8);
      std::memcpy(v.data(), x.raw_data().data(), v.size() * 8);
      ids.assign(v.begin(), v.end());
    } else {
      ids.assign(x.int64_data().begin(), x.int64_data().end());
    }
    in = toDeviceI32(be, shape, ids);
  } else {
    in = toDevice(be, shape, floats(x));
  }
  return toHost(model->forward(in, stash, ForwardContext{training, 0}));
}

// Models covering every layer type tandem has, for export.
inline const char* const kCnnYaml = R"(name: cnn
input: [3, 12, 12]
layers:
  - conv2d: {out: 8, kernel: 3, padding: 1}
  - relu
  - residual:
      layers:
        - conv2d: {out: 16, kernel: 3, stride: 2, padding: 1}
        - gelu
        - conv2d: {out: 16, kernel: 3, padding: 1, bias: false}
        - batchnorm
  - residual:
      layers:
        - conv2d: {out: 16, kernel: 3, padding: 1}
        - tanh
  - maxpool2d: {kernel: 3, stride: 2, ceil: true}
  - concat:
      layers:
        - conv2d: {out: 4, kernel: 1}
        - chain:
            layers:
              - conv2d: {out: 4, kernel: 3, padding: 1}
              - relu
  - maxpool2d: {kernel: 2}
  - avgpool2d: {kernel: 3, stride: 1, padding: 1}
  - concat:
      layers:
        - identity
        - chain:
            layers:
              - batchnorm
              - relu
              - conv2d: {out: 3, kernel: 3, padding: 1, bias: false}
  - dropout: {p: 0.25}
  - globalavgpool
  - linear: {out: 10}
)";
// The mobile networks' layers (ReLU6 a Clip, SiLU a Sigmoid and a Mul, depthwise and
// grouped convolutions, squeeze-and-excitation).
inline const char* const kMobileYaml = R"(name: mobile
input: [3, 12, 12]
layers:
  - conv2d: {out: 8, kernel: 3, padding: 1}
  - relu6
  - residual:
      layers:
        - conv2d: {out: 8, kernel: 3, padding: 1, groups: 8}
        - silu
        - conv2d: {out: 8, kernel: 1, groups: 2, bias: false}
        - hardsigmoid
  - conv2d: {out: 8, kernel: 3, stride: 2, padding: 1}
  - hardswish
  - gate:
      layers:
        - globalavgpool
        - {linear: {out: 4}}
        - relu
        - {linear: {out: 8}}
        - hardsigmoid
  - residual:
      proj_bias: true
      proj_norm: true
      layers:
        - conv2d: {out: 12, kernel: 3, stride: 2, padding: 1}
  - globalavgpool
  - linear: {out: 4}
)";

// ShuffleNet's units: two branches joined then shuffled, and a unit that passes its
// input's first half on beside a branch of the second (slices of the channels).
inline const char* const kShuffleYaml = R"(name: shuffle
input: [3, 8, 8]
layers:
  - concat:
      layers:
        - conv2d: {out: 4, kernel: 3, stride: 2, padding: 1}
        - chain: {layers: [{conv2d: {out: 4, kernel: 1, stride: 2}}, relu]}
  - channel_shuffle: {groups: 2}
  - concat:
      layers:
        - slice: {begin: 0, end: 4}
        - chain: {layers: [{slice: {begin: 4, end: 8}}, {conv2d: {out: 4, kernel: 3, padding: 1, groups: 4}}, relu]}
  - channel_shuffle: {groups: 4}
  - globalavgpool
  - linear: {out: 3}
)";

inline const char* const kMlpYaml = R"(name: mlp
input: [20]
layers:
  - linear: {out: 32}
  - layernorm: {eps: 0.001}
  - gelu
  - gate:
      layers:
        - linear: {out: 32}
        - sigmoid
  - residual:
      proj_norm: true
      proj_eps: 0.001
      proj_momentum: 0.2
      layers:
        - linear: {out: 24}
        - sigmoid
  - residual:
      layers:
        - linear: {out: 24, bias: false}
        - batchnorm: {eps: 0.001, momentum: 0.05}
        - relu
  - linear: {out: 5}
)";
inline const char* const kLmYaml = R"(name: lm
input: [6]
layers:
  - embedding: {vocab: 30, dim: 8}
  - layernorm
  - residual:
      layers:
        - linear: {out: 16}
        - gelu
        - linear: {out: 8}
  - flatten
  - linear: {out: 30}
)";

// A GPT: positional rows sliced from a longer table, transformer blocks (one with the
// default MLP width), a non-causal attention layer of its own.
inline const char* const kGptYaml = R"(name: gpt
input: [6]
layers:
  - embedding: {vocab: 30, dim: 8}
  - positional: {context: 9}
  - transformer: {heads: 2, mlp: 12}
  - transformer: {heads: 4}
  - attention: {heads: 2, causal: false}
  - layernorm
  - linear: {out: 30}
)";

// A batch of 3 for the model: ids for an embedding model, else random values.
inline Tensor exampleInput(Backend& be, const Model& model) {
  const Shape shape = model.inputShape().withBatch(3);
  if (model.inputDType() == DType::kI32) {
    std::vector<int32_t> ids(static_cast<size_t>(shape.numel()));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7 + 3) % 30);
    return toDeviceI32(be, shape, ids);
  }
  return toDevice(be, shape, testing::randomVector(11, shape.numel()));
}

// The model built with seed 7 after one training forward (so batch norms' running
// statistics are not their initial zeros and ones), as a model file.
inline ModelFile savedModel(const std::string& yaml) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model model(parseModelSpec(yaml, "export.yaml"));
  model.build(be, 7);
  Stash stash;
  model.forward(exampleInput(be, model), stash, ForwardContext{true, 1});
  const std::vector<uint8_t> bytes = serializeModel(model, nullptr, {});
  return parseModelFile(bytes, "export.yaml");
}

// The model's inference output for exampleInput.
inline std::vector<float> run(const ModelFile& file) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  const std::unique_ptr<Model> model = loadModel(file, be);
  Stash stash;
  return toHost(model->forward(exampleInput(be, *model), stash, ForwardContext{false, 0}));
}

}  // namespace tandem::onnx_io::test
