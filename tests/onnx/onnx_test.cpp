// ONNX in (onnx/): ONNX's own conformance cases (Debian's libonnx-testdata, the
// `node/` cases of the operators tandem imports) run through the importer and the CPU
// backend against their expected outputs; hostile files refused with clear errors; an
// imported model written as a model file and read back.
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
#include "core/error.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "onnx/onnx_export.h"
#include "onnx/onnx_import.h"
#include "tests/process_util.h"
#include "tests/test_util.h"

namespace tandem::onnx_io {
namespace {

namespace fs = std::filesystem;

const fs::path kCases = "/usr/share/libonnx-testdata/data";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

onnx::TensorProto readTensor(const fs::path& p) {
  onnx::TensorProto t;
  EXPECT_TRUE(t.ParseFromString(slurp(p))) << p;
  return t;
}

std::vector<float> floats(const onnx::TensorProto& t) {
  if (!t.raw_data().empty()) {
    std::vector<float> v(t.raw_data().size() / 4);
    std::memcpy(v.data(), t.raw_data().data(), v.size() * 4);
    return v;
  }
  return {t.float_data().begin(), t.float_data().end()};
}

// The imported model, built on the CPU with its imported weights, run forward (inference)
// on the batch `x`.
// (Integer ids, int64 in ONNX, go in as tandem's int32.)
std::vector<float> forward(const ImportedModel& imported, const onnx::TensorProto& x) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
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
  return toHost(model->forward(in, stash, ForwardContext{false, 0}));
}

// The operators whose conformance cases run — ONNX's `node/` cases (one operator each)
// and the `pytorch-converted/` ones (PyTorch modules as its exporter wrote them, weights as
// initializers): every case of theirs is imported and compared, or refused with the
// importer's reason.
const std::vector<std::pair<std::string, std::vector<std::string>>> kSuites = {
    {"node",
     {"test_relu", "test_tanh", "test_sigmoid", "test_gemm_", "test_matmul_2d", "test_basic_conv_",
      "test_conv_", "test_maxpool_", "test_averagepool_", "test_globalaveragepool", "test_flatten_",
      "test_identity", "test_dropout_default", "test_reshape_", "test_layer_normalization_"}},
    {"pytorch-converted",
     {"test_Linear", "test_Conv2d", "test_MaxPool2d", "test_AvgPool2d", "test_ReLU", "test_Tanh",
      "test_Sigmoid", "test_Softmax", "test_LogSoftmax", "test_Embedding", "test_BatchNorm2d"}}};

TEST(OnnxConformanceTest, TheCasesOfTheImportedOperatorsMatchTheirExpectedOutputs) {
  if (!fs::exists(kCases)) GTEST_SKIP() << "libonnx-testdata is not installed";
  std::vector<std::pair<fs::path, std::string>> cases;  // and the operator's family
  for (const auto& [suite, operators] : kSuites)
    for (const auto& e : fs::directory_iterator(kCases / suite)) {
      const std::string name = e.path().filename().string();
      for (const std::string& op : operators)
        if (name.rfind(op, 0) == 0 && name.find("_expanded") == std::string::npos) {
          cases.emplace_back(e.path(), op);
          break;
        }
    }
  std::sort(cases.begin(), cases.end());
  int passed = 0;
  std::vector<std::string> refused, failed;
  std::map<std::string, double> worst;  // per family, of the cases that ran
  for (const auto& [dir, family] : cases) {
    const std::string name = dir.parent_path().filename().string() + "/" + dir.filename().string();
    onnx::ModelProto m;
    ASSERT_TRUE(m.ParseFromString(slurp(dir / "model.onnx"))) << name;
    // The case's inputs after the first that are not initializers already are the node's
    // constant operands (weights, biases, shapes): they become initializers, as an
    // exported model has them.
    const fs::path set = dir / "test_data_set_0";
    onnx::GraphProto* g = m.mutable_graph();
    std::vector<std::string> fed;
    for (const auto& in : g->input()) {
      bool init = false;
      for (const auto& t : g->initializer()) init = init || t.name() == in.name();
      if (!init) fed.push_back(in.name());
    }
    for (size_t k = 1; k < fed.size(); ++k) {
      onnx::TensorProto t = readTensor(set / ("input_" + std::to_string(k) + ".pb"));
      t.set_name(fed[k]);
      *g->add_initializer() = t;
    }
    // Outputs after the first (LayerNormalization's mean and inverse deviation, MaxPool's
    // indices) are not a model's: they leave the graph, and output_0 is compared.
    while (g->output_size() > 1) g->mutable_output()->RemoveLast();
    const onnx::TensorProto x = readTensor(set / "input_0.pb");
    const std::vector<float> want = floats(readTensor(set / "output_0.pb"));
    ImportedModel imported;
    try {
      imported = importOnnx(m, name);
    } catch (const Error& e) {
      refused.push_back(e.what());
      continue;
    }
    if (x.data_type() != onnx::TensorProto::FLOAT && x.data_type() != onnx::TensorProto::INT64) {
      failed.push_back(name + ": imported an input that is neither float32 nor int64 ids");
      continue;
    }
    const std::vector<float> got = forward(imported, x);
    if (got.size() != want.size()) {
      failed.push_back(name + ": " + std::to_string(got.size()) + " outputs, expected " +
                       std::to_string(want.size()));
      continue;
    }
    double err = 0;
    for (size_t i = 0; i < got.size(); ++i)
      err = std::max(err, std::fabs(double(got[i]) - want[i]) / (1.0 + std::fabs(double(want[i]))));
    worst[family] = std::max(worst[family], err);
    if (err <= 1e-5)
      ++passed;
    else
      failed.push_back(name + ": error " + std::to_string(err));
  }
  std::printf("ONNX conformance cases: %zu run, %d passed, %zu refused, %zu failed\n", cases.size(),
              passed, refused.size(), failed.size());
  std::printf("largest error |ours - expected| / (1 + |expected|) per family:\n");
  for (const auto& [family, err] : worst) std::printf("  %-28s %.3g\n", family.c_str(), err);
  for (const std::string& r : refused) std::printf("  refused: %s\n", r.c_str());
  for (const std::string& f : failed) ADD_FAILURE() << f;
  // Most cases of these operators are ones tandem expresses: refusing them all would
  // pass nothing.
  EXPECT_GE(passed, 50);
}

// An ONNX model made here: Conv -> Relu -> MaxPool -> Flatten -> Gemm -> Softmax.
onnx::ModelProto smallCnn() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("small");
  auto input = g->add_input();
  input->set_name("x");
  auto* tt = input->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : {int64_t{-1}, int64_t{2}, int64_t{6}, int64_t{6}}) {
    auto* dim = tt->mutable_shape()->add_dim();
    if (d > 0)
      dim->set_dim_value(d);
    else
      dim->set_dim_param("N");
  }
  const auto init = [&](const std::string& name, std::vector<int64_t> dims, uint64_t seed) {
    onnx::TensorProto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    int64_t n = 1;
    for (int64_t d : dims) {
      t->add_dims(d);
      n *= d;
    }
    for (float v : testing::randomVector(seed, n)) t->add_float_data(v);
  };
  init("w", {3, 2, 3, 3}, 1);
  init("b", {3}, 2);
  init("fw", {4, 27}, 3);
  init("fb", {4}, 4);
  const auto node = [&](const std::string& op, std::vector<std::string> in,
                        const std::string& out) {
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(op + "_" + out);
    for (const std::string& i : in) n->add_input(i);
    n->add_output(out);
    return n;
  };
  auto* conv = node("Conv", {"x", "w", "b"}, "c");
  auto* pads = conv->add_attribute();
  pads->set_name("pads");
  pads->set_type(onnx::AttributeProto::INTS);
  for (int k = 0; k < 4; ++k) pads->add_ints(1);
  node("Relu", {"c"}, "r");
  auto* pool = node("MaxPool", {"r"}, "p");
  auto* ks = pool->add_attribute();
  ks->set_name("kernel_shape");
  ks->set_type(onnx::AttributeProto::INTS);
  ks->add_ints(2);
  ks->add_ints(2);
  auto* st = pool->add_attribute();
  st->set_name("strides");
  st->set_type(onnx::AttributeProto::INTS);
  st->add_ints(2);
  st->add_ints(2);
  node("Flatten", {"p"}, "f");
  auto* gemm = node("Gemm", {"f", "fw", "fb"}, "y");
  auto* tb = gemm->add_attribute();
  tb->set_name("transB");
  tb->set_type(onnx::AttributeProto::INT);
  tb->set_i(1);
  node("Softmax", {"y"}, "probs");
  auto* out = g->add_output();
  out->set_name("probs");
  auto* ot = out->mutable_type()->mutable_tensor_type();
  ot->set_elem_type(onnx::TensorProto::FLOAT);
  ot->mutable_shape()->add_dim()->set_dim_param("N");
  ot->mutable_shape()->add_dim()->set_dim_value(4);
  return m;
}

TEST(OnnxImportTest, AChainOfLayersImportsWithItsWeightsAndTheSoftmaxDropped) {
  const ImportedModel imported = importOnnx(smallCnn(), "small.onnx");
  ASSERT_EQ(imported.spec.layers.size(), 5u);
  const std::vector<std::string> types = {"conv2d", "relu", "maxpool2d", "flatten", "linear"};
  for (size_t i = 0; i < types.size(); ++i) EXPECT_EQ(imported.spec.layers[i].type, types[i]);
  EXPECT_EQ(imported.spec.input, (Shape{2, 6, 6}));
  ASSERT_EQ(imported.notes.size(), 1u);
  EXPECT_NE(imported.notes[0].find("dropped Softmax"), std::string::npos);
  // Written as a model file and read back: the same weights, the ONNX initializers'.
  const std::string path = testing::freshDir("onnx") + "/small.tdm";
  cpu::CpuBackend be(cpu::CpuOptions{1});
  const ModelFile file = toModelFile(imported);
  const std::unique_ptr<Model> model = loadModel(file, be);
  saveModel(path, *model, nullptr, file.metadata);
  const ModelFile back = readModelFile(path);
  ASSERT_EQ(back.params.size(), 4u);
  EXPECT_EQ(back.params[0].data, testing::randomVector(1, 54));
  EXPECT_EQ(back.params[2].data, testing::randomVector(3, 108));  // transB: [out, in] as stored
  EXPECT_EQ(back.params[3].data, testing::randomVector(4, 4));
}

TEST(OnnxImportTest, WhatTheLayersCannotExpressIsRefusedNamingTheNode) {
  onnx::ModelProto m = smallCnn();
  m.mutable_graph()->mutable_node(1)->set_op_type("Elu");
  testing::expectThrowWith<InvalidArgument>([&] { importOnnx(m, "m.onnx"); },
                                            {"m.onnx: node 'Relu_r' (Elu)", "no layer"});
  m = smallCnn();
  auto* dil = m.mutable_graph()->mutable_node(0)->add_attribute();
  dil->set_name("dilations");
  dil->set_type(onnx::AttributeProto::INTS);
  dil->add_ints(2);
  dil->add_ints(2);
  testing::expectThrowWith<InvalidArgument>([&] { importOnnx(m, "m.onnx"); },
                                            {"node 'Conv_c' (Conv)", "dilations"});
  m = smallCnn();  // a branch: the Gemm reads the pooled value, not the flattened one
  m.mutable_graph()->mutable_node(4)->set_input(0, "p");
  testing::expectThrowWith<InvalidArgument>([&] { importOnnx(m, "m.onnx"); },
                                            {"node 'Gemm_y' (Gemm)", "'p' is read by two nodes"});
}

TEST(OnnxImportTest, HostileFilesAreRefusedWithClearErrors) {
  const std::string dir = testing::freshDir("onnx-bad");
  std::ofstream(dir + "/garbage.onnx") << "this is not a protobuf \x01\x02\xff";
  testing::expectThrowWith<FormatError>([&] { importOnnx(dir + "/garbage.onnx"); },
                                        {"garbage.onnx", "not an ONNX model"});
  const std::string good = smallCnn().SerializeAsString();
  std::ofstream(dir + "/cut.onnx", std::ios::binary) << good.substr(0, good.size() / 2);
  EXPECT_THROW(importOnnx(dir + "/cut.onnx"), FormatError);
  // An initializer whose data disagrees with its dims.
  onnx::ModelProto m = smallCnn();
  m.mutable_graph()->mutable_initializer(1)->add_float_data(1.0f);
  testing::expectThrowWith<FormatError>([&] { importOnnx(m, "m.onnx"); },
                                        {"initializer 'b' has 4 values for dims of 3"});
  // A 10-giga-value dimension: refused before anything is allocated.
  m = smallCnn();
  m.mutable_graph()->mutable_initializer(0)->set_dims(0, int64_t{10} << 30);
  EXPECT_THROW(importOnnx(m, "m.onnx"), FormatError);
  // A cycle: the nodes are not in an order that computes them (ONNX's checker).
  m = smallCnn();
  m.mutable_graph()->mutable_node(0)->set_input(0, "r");
  EXPECT_THROW(importOnnx(m, "m.onnx"), FormatError);
  EXPECT_THROW(importOnnx(dir + "/missing.onnx"), IoError);
  // What the importer's fuzz target found: a zero stride (once divided by), a Reshape whose
  // shape holds no values (once copied from a null pointer), one that is not int64.
  m = smallCnn();
  auto* strides = m.mutable_graph()->mutable_node(2)->mutable_attribute(1);
  strides->set_ints(0, 0);
  testing::expectThrowWith<InvalidArgument>([&] { importOnnx(m, "m.onnx"); },
                                            {"node 'MaxPool_p' (MaxPool)", "strides must be in"});
  for (const auto type : {onnx::TensorProto::INT64, onnx::TensorProto::FLOAT}) {
    m = smallCnn();
    onnx::NodeProto* flat = m.mutable_graph()->mutable_node(3);
    flat->set_op_type("Reshape");
    flat->add_input("to");
    onnx::TensorProto* to = m.mutable_graph()->add_initializer();
    to->set_name("to");
    to->set_data_type(type);
    to->add_dims(0);
    testing::expectThrowWith<InvalidArgument>([&] { importOnnx(m, "m.onnx"); },
                                              {"node 'Flatten_f' (Reshape)"});
  }
}

// Models covering every layer type tandem has, for export.
const char* const kCnnYaml = R"(name: cnn
input: [3, 12, 12]
layers:
  - conv2d: {out: 8, kernel: 3, padding: 1}
  - relu
  - residual:
      layers:
        - conv2d: {out: 16, kernel: 3, stride: 2, padding: 1}
        - gelu
        - conv2d: {out: 16, kernel: 3, padding: 1, bias: false}
  - residual:
      layers:
        - conv2d: {out: 16, kernel: 3, padding: 1}
        - tanh
  - maxpool2d: {kernel: 2}
  - avgpool2d: {kernel: 3, stride: 1, padding: 1}
  - dropout: {p: 0.25}
  - globalavgpool
  - linear: {out: 10}
)";
const char* const kMlpYaml = R"(name: mlp
input: [20]
layers:
  - linear: {out: 32}
  - layernorm: {eps: 0.001}
  - gelu
  - residual:
      layers:
        - linear: {out: 24}
        - sigmoid
  - residual:
      layers:
        - linear: {out: 24, bias: false}
        - relu
  - linear: {out: 5}
)";
const char* const kLmYaml = R"(name: lm
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
const char* const kGptYaml = R"(name: gpt
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

ModelFile savedModel(const std::string& yaml) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model model(parseModelSpec(yaml, "export.yaml"));
  model.build(be, 7);
  const std::vector<uint8_t> bytes = serializeModel(model, nullptr, {});
  return parseModelFile(bytes, "export.yaml");
}

// The model's forward output for a batch of 3 (ids for an embedding model).
std::vector<float> run(const ModelFile& file) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  const std::unique_ptr<Model> model = loadModel(file, be);
  const Shape shape = model->inputShape().withBatch(3);
  Tensor x;
  if (model->inputDType() == DType::kI32) {
    std::vector<int32_t> ids(static_cast<size_t>(shape.numel()));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7 + 3) % 30);
    x = toDeviceI32(be, shape, ids);
  } else {
    x = toDevice(be, shape, testing::randomVector(11, shape.numel()));
  }
  Stash stash;
  return toHost(model->forward(x, stash, ForwardContext{false, 0}));
}

void expectSameLayers(const std::vector<LayerSpec>& a, const std::vector<LayerSpec>& b,
                      const std::string& at) {
  ASSERT_EQ(a.size(), b.size()) << at;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].type, b[i].type) << at << i;
    EXPECT_TRUE(a[i].attrs == b[i].attrs) << at << i << " (" << a[i].type << ")";
    expectSameLayers(a[i].children, b[i].children, at + std::to_string(i) + ".");
  }
}

TEST(OnnxExportTest, EveryLayerTypeExportsAndImportsBackBitwise) {
  for (const char* yaml : {kCnnYaml, kMlpYaml, kLmYaml, kGptYaml}) {
    const ModelFile file = savedModel(yaml);
    SCOPED_TRACE(file.spec.name);
    onnx::ModelProto m = exportOnnx(file);
    ASSERT_NO_THROW(onnx::checker::check_model(m));
    // Strict shape inference reaches every node's output.
    onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(true, 1));
    EXPECT_EQ(m.graph().value_info_size(), m.graph().node_size() - 1);
    const ModelFile back = toModelFile(importOnnx(m, file.spec.name + ".onnx"));
    EXPECT_EQ(back.spec.input, file.spec.input);
    // The same layers (as the built models write their specs) and bitwise the same
    // parameters under the same names.
    expectSameLayers(Model(back.spec).spec().layers, Model(file.spec).spec().layers, "layer ");
    ASSERT_EQ(back.params.size(), file.params.size());
    for (size_t i = 0; i < file.params.size(); ++i) {
      EXPECT_EQ(back.params[i].name, file.params[i].name);
      EXPECT_EQ(back.params[i].shape, file.params[i].shape) << file.params[i].name;
      EXPECT_TRUE(back.params[i].data == file.params[i].data) << file.params[i].name;
    }
    EXPECT_TRUE(run(back) == run(file));
  }
}

TEST(OnnxExportTest, WriteOnnxWritesAFileThatImports) {
  const std::string path = testing::freshDir("onnx-export") + "/mlp.onnx";
  const ModelFile file = savedModel(kMlpYaml);
  writeOnnx(file, path);
  EXPECT_TRUE(run(toModelFile(importOnnx(path))) == run(file));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

// A Pad of zeros before a MaxPool is not its padding (which is -inf): refused, naming it.
TEST(OnnxImportTest, APadOnlyFoldsIntoAConvOrAnAveragePool) {
  onnx::ModelProto m = smallCnn();
  onnx::GraphProto* g = m.mutable_graph();
  onnx::TensorProto* pads = g->add_initializer();
  pads->set_name("pads");
  pads->set_data_type(onnx::TensorProto::INT64);
  pads->add_dims(8);
  for (int64_t v : {0, 0, 1, 1, 0, 0, 1, 1}) pads->add_int64_data(v);
  onnx::NodeProto* pad = g->add_node();
  pad->set_op_type("Pad");
  pad->set_name("pad");
  pad->add_input("r");
  pad->add_input("pads");
  pad->add_output("rp");
  for (int i = g->node_size() - 1; i > 2; --i) g->mutable_node()->SwapElements(i, i - 1);
  g->mutable_node(3)->set_input(0, "rp");  // the MaxPool reads the padded value
  testing::expectThrowWith<InvalidArgument>(
      [&] { importOnnx(m, "m.onnx"); },
      {"node 'pad' (Pad)", "only before a Conv or an AveragePool", "its reader is MaxPool"});
  g->mutable_node(3)->set_op_type("AveragePool");     // its zeros are the average's padding
  onnx::TensorProto* fw = g->mutable_initializer(2);  // which makes [3, 4, 4] of [3, 6, 6]
  fw->set_dims(1, 48);
  for (int i = 0; i < 4 * (48 - 27); ++i) fw->add_float_data(0.5f);
  const ImportedModel imported = importOnnx(m, "m.onnx");
  EXPECT_EQ(imported.spec.layers[2].type, "avgpool2d");
  EXPECT_TRUE(imported.spec.layers[2].attrs.at("padding") == AttrValue(std::vector<int64_t>{1, 1}));
}

TEST(OnnxImportTest, AOneNodeBranchAndItsProjectionImportInEitherOrder) {
  const ModelFile file = savedModel(R"(input: [2, 6, 6]
layers:
  - residual:
      layers:
        - conv2d: {out: 4, kernel: 3, stride: 2, padding: 1}
  - flatten
  - linear: {out: 3}
)");
  onnx::ModelProto m = exportOnnx(file);
  ASSERT_EQ(m.graph().node(0).name(), "0.0");
  ASSERT_EQ(m.graph().node(1).name(), "0.proj");
  for (int swap = 0; swap < 2; ++swap) {
    if (swap) m.mutable_graph()->mutable_node()->SwapElements(0, 1);  // the shortcut first
    const ModelFile back = toModelFile(importOnnx(m, "m.onnx"));
    ASSERT_EQ(back.params.size(), file.params.size());
    EXPECT_EQ(back.params[2].name, "0.proj.weight");
    EXPECT_TRUE(back.params[2].data == file.params[2].data);
    EXPECT_TRUE(run(back) == run(file));
  }
}

TEST(OnnxImportTest, AShortcutTandemWouldNotMakeIsRefusedNamingIt) {
  onnx::ModelProto m = exportOnnx(savedModel(kCnnYaml));
  for (auto& n : *m.mutable_graph()->mutable_node())
    if (n.name() == "2.proj") n.add_input("2.body.0.bias");  // a bias tandem's projection lacks
  testing::expectThrowWith<InvalidArgument>(
      [&] { importOnnx(m, "m.onnx"); },
      {"node '2.proj' (Conv)", "a shortcut projection must be what tandem's residual makes"});
}

// A model as PyTorch 1.13's exporter writes nn.LayerNorm(8) -> nn.GELU() -> nn.Linear(8, 3)
// at its default opset 14: LayerNorm and GELU as patterns of primitive operators, their
// constants as Constant nodes.
onnx::ModelProto torchLayerNormGelu(float exponent) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(14);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("torch_jit");
  auto* input = g->add_input();
  input->set_name("x");
  auto* tt = input->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_param("N");
  tt->mutable_shape()->add_dim()->set_dim_value(8);
  const auto values = [](onnx::TensorProto* t, const std::string& name, std::vector<int64_t> dims,
                         const std::vector<float>& v) {
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    for (float f : v) t->add_float_data(f);
  };
  values(g->add_initializer(), "ln.weight", {8}, testing::randomVector(21, 8));
  values(g->add_initializer(), "ln.bias", {8}, testing::randomVector(22, 8));
  values(g->add_initializer(), "fc.weight", {3, 8}, testing::randomVector(23, 24));
  values(g->add_initializer(), "fc.bias", {3}, testing::randomVector(24, 3));
  int k = 0;
  const auto node = [&](const std::string& op, std::vector<std::string> in,
                        const std::string& out) {
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(op + "_" + std::to_string(k++));
    for (const std::string& i : in) n->add_input(i);
    n->add_output(out);
    return n;
  };
  const auto constant = [&](const std::string& out, float v) {
    onnx::AttributeProto* a = node("Constant", {}, out)->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    values(a->mutable_t(), "", {}, {v});
  };
  const auto axes = [](onnx::NodeProto* n) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name("axes");
    a->set_type(onnx::AttributeProto::INTS);
    a->add_ints(-1);
  };
  axes(node("ReduceMean", {"x"}, "mean"));
  node("Sub", {"x", "mean"}, "d");
  constant("two", exponent);
  node("Pow", {"d", "two"}, "d2");
  axes(node("ReduceMean", {"d2"}, "var"));
  constant("eps", 1e-5f);
  node("Add", {"var", "eps"}, "ve");
  node("Sqrt", {"ve"}, "sd");
  node("Div", {"d", "sd"}, "normed");
  node("Mul", {"normed", "ln.weight"}, "scaled");
  node("Add", {"scaled", "ln.bias"}, "ln");
  constant("sqrt2", 1.4142135381698608f);
  node("Div", {"ln", "sqrt2"}, "g1");
  node("Erf", {"g1"}, "g2");
  constant("one", 1.0f);
  node("Add", {"g2", "one"}, "g3");
  node("Mul", {"ln", "g3"}, "g4");
  constant("half", 0.5f);
  node("Mul", {"g4", "half"}, "g5");
  onnx::NodeProto* gemm = node("Gemm", {"g5", "fc.weight", "fc.bias"}, "y");
  onnx::AttributeProto* tb = gemm->add_attribute();
  tb->set_name("transB");
  tb->set_type(onnx::AttributeProto::INT);
  tb->set_i(1);
  auto* out = g->add_output();
  out->set_name("y");
  auto* ot = out->mutable_type()->mutable_tensor_type();
  ot->set_elem_type(onnx::TensorProto::FLOAT);
  ot->mutable_shape()->add_dim()->set_dim_param("N");
  ot->mutable_shape()->add_dim()->set_dim_value(3);
  return m;
}

// The GPT PyTorch 1.13 exports (tests/data/onnx-parity/gpt.onnx: attention written out,
// LayerNorms decomposed, a positional table added whole, the duplicate LayerNorm
// parameters as Identity nodes) imports as a spec would write it: two transformer blocks.
TEST(OnnxImportTest, PyTorchsGptImportsAsTransformerBlocks) {
  const ImportedModel imported =
      importOnnx(std::string(TANDEM_SOURCE_DIR) + "/tests/data/onnx-parity/gpt.onnx");
  std::vector<std::string> types;
  for (const LayerSpec& l : imported.spec.layers) types.push_back(l.type);
  EXPECT_EQ(types, (std::vector<std::string>{"embedding", "positional", "transformer",
                                             "transformer", "layernorm", "linear"}));
  ASSERT_EQ(types.size(), 6u);
  EXPECT_TRUE(imported.spec.layers[2].attrs ==
              (std::map<std::string, AttrValue>{{"heads", int64_t{2}}, {"mlp", int64_t{12}}}));
  EXPECT_TRUE(imported.spec.layers[3].attrs ==
              (std::map<std::string, AttrValue>{{"heads", int64_t{2}}, {"mlp", int64_t{16}}}));
  EXPECT_EQ(std::get<int64_t>(imported.spec.layers[1].attrs.at("context")), 6);
}

// An attention pattern that tandem's layer would compute otherwise is refused at the node
// where it departs: a mask that is not the causal one, a transpose of other axes, a scale
// that is not 1/sqrt(head size).
TEST(OnnxImportTest, AnAttentionPatternThatIsNotTandemsIsRefusedNamingTheNode) {
  const onnx::ModelProto good = exportOnnx(savedModel(kGptYaml));
  auto spoiled = [&](const std::function<void(onnx::GraphProto&)>& spoil) {
    onnx::ModelProto m = good;
    spoil(*m.mutable_graph());
    return m;
  };
  const onnx::ModelProto mask = spoiled([](onnx::GraphProto& g) {
    for (auto& t : *g.mutable_initializer())
      if (t.name() == "2.0.1.mask") (*t.mutable_raw_data())[1] = 0;
  });
  testing::expectThrowWith<InvalidArgument>([&] { importOnnx(mask, "mask.onnx"); },
                                            {"node '2.0.1.masked' (Where)", "causal mask"});
  const onnx::ModelProto perm = spoiled([](onnx::GraphProto& g) {
    for (auto& n : *g.mutable_node())
      if (n.name() == "2.0.1.kt") n.mutable_attribute(0)->set_ints(2, 1);
  });
  testing::expectThrowWith<InvalidArgument>([&] { importOnnx(perm, "perm.onnx"); },
                                            {"node '2.0.1.kt' (Transpose)", "perm must be"});
  const onnx::ModelProto scale = spoiled([](onnx::GraphProto& g) {
    for (auto& t : *g.mutable_initializer())
      if (t.name() == "2.0.1.sqrt_hs") {
        const float wrong = 3.0f;
        t.set_raw_data(&wrong, 4);
      }
  });
  testing::expectThrowWith<InvalidArgument>([&] { importOnnx(scale, "scale.onnx"); },
                                            {"node '2.0.1.qk' (MatMul)", "Div by sqrt(4)"});
}

TEST(OnnxImportTest, PyTorchsLayerNormAndGeluPatternsImportAsTheLayers) {
  const ImportedModel imported = importOnnx(torchLayerNormGelu(2.0f), "torch.onnx");
  ASSERT_EQ(imported.spec.layers.size(), 3u);
  EXPECT_EQ(imported.spec.layers[0].type, "layernorm");
  EXPECT_EQ(imported.spec.layers[1].type, "gelu");
  EXPECT_EQ(imported.spec.layers[2].type, "linear");
  // The forward output against the operators' own arithmetic, in double.
  const std::vector<float> x = testing::randomVector(25, 2 * 8);
  const std::vector<float> gamma = testing::randomVector(21, 8),
                           beta = testing::randomVector(22, 8);
  const std::vector<float> w = testing::randomVector(23, 24), b = testing::randomVector(24, 3);
  std::vector<double> want;
  for (int n = 0; n < 2; ++n) {
    double mean = 0, var = 0;
    for (int i = 0; i < 8; ++i) mean += x[n * 8 + i] / 8.0;
    for (int i = 0; i < 8; ++i) var += (x[n * 8 + i] - mean) * (x[n * 8 + i] - mean) / 8.0;
    std::vector<double> h(8);
    for (int i = 0; i < 8; ++i) {
      const double ln = (x[n * 8 + i] - mean) / std::sqrt(var + 1e-5) * gamma[i] + beta[i];
      h[i] = ln * (1 + std::erf(ln / std::sqrt(2.0))) * 0.5;
    }
    for (int o = 0; o < 3; ++o) {
      double y = b[o];
      for (int i = 0; i < 8; ++i) y += w[o * 8 + i] * h[i];
      want.push_back(y);
    }
  }
  onnx::TensorProto in;
  in.set_data_type(onnx::TensorProto::FLOAT);
  in.add_dims(2);
  in.add_dims(8);
  for (float v : x) in.add_float_data(v);
  const std::vector<float> got = forward(imported, in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i])));
  // A Pow of 3 is no variance: nothing matches, and the fan-out of x is refused.
  testing::expectThrowWith<InvalidArgument>([&] { importOnnx(torchLayerNormGelu(3.0f), "t.onnx"); },
                                            {"t.onnx: node", "'x' is read by two nodes"});
}

// The softmax a graph ends in: dropped for training, kept as the model file's metadata,
// written back by export, applied to the answers by tandem infer.
TEST(OnnxImportTest, AnOutputSoftmaxIsKeptForServingAndExport) {
  const ImportedModel imported = importOnnx(smallCnn(), "small.onnx");
  EXPECT_EQ(imported.output, "softmax");
  const ModelFile file = toModelFile(imported);
  EXPECT_TRUE(file.metadata.at("output") == AttrValue(std::string("softmax")));
  const onnx::ModelProto out = exportOnnx(file);
  const onnx::GraphProto& g = out.graph();
  EXPECT_EQ(g.node(g.node_size() - 1).op_type(), "Softmax");
  EXPECT_EQ(g.node(g.node_size() - 1).output(0), g.output(0).name());
  EXPECT_NO_THROW(onnx::checker::check_model(out));
  const ImportedModel back = importOnnx(out, "back.onnx");
  EXPECT_EQ(back.output, "softmax");
  EXPECT_TRUE(toModelFile(back).params[0].data == file.params[0].data);
  // Over another axis than the last, it is not what serving would apply: refused.
  onnx::ModelProto m = smallCnn();
  onnx::AttributeProto* axis = m.mutable_graph()->mutable_node(5)->add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(0);
  testing::expectThrowWith<InvalidArgument>([&] { importOnnx(m, "m.onnx"); },
                                            {"(Softmax)", "other than the last axis"});
}

TEST(OnnxImportTest, ServingAnOnnxModelThatEndsInASoftmaxAnswersProbabilities) {
  // A Fashion-MNIST classifier, exported, with a Softmax appended as PyTorch models have.
  ModelFile file = savedModel("input: [1, 28, 28]\nlayers: [flatten, {linear: {out: 10}}]\n");
  file.metadata["output"] = std::string("softmax");
  const std::string dir = testing::freshDir("onnx-serve");
  writeOnnx(file, dir + "/softmax.onnx");
  std::ofstream(dir + "/job.yaml") << "model: softmax.onnx\ntest_limit: 64\nbatch: 32\n"
                                   << "partition: equal\nstages: 1\n";
  const auto r = testing::runCommand(std::string(TANDEM_CLI) + " infer " + dir +
                                     "/job.yaml --answers " + dir + "/answers.txt");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("outputs after the model's softmax"), std::string::npos) << r.out;
  std::ifstream answers(dir + "/answers.txt");
  std::string line;
  int rows = 0;
  while (std::getline(answers, line)) {
    std::istringstream in(line);
    int64_t index, best;
    in >> index >> best;
    std::vector<double> p;
    for (double v; in >> v;) p.push_back(v);
    ASSERT_EQ(p.size(), 10u) << line;
    double sum = 0;
    for (double v : p) {
      EXPECT_GE(v, 0.0) << line;
      sum += v;
    }
    EXPECT_NEAR(sum, 1.0, 1e-5) << line;
    EXPECT_EQ(std::max_element(p.begin(), p.end()) - p.begin(), best) << line;
    ++rows;
  }
  EXPECT_EQ(rows, 64);
}

}  // namespace
}  // namespace tandem::onnx_io
