// ONNX in (targets/onnx): ONNX's own conformance cases (Debian's libonnx-testdata, the
// `node/` cases of the operators tandem imports) run through the importer and the CPU
// backend against their expected outputs; hostile files refused with clear errors; an
// imported model written as a model file and read back.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/model_file.h"
#include "targets/onnx/onnx_import.h"
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
std::vector<float> forward(const ImportedModel& imported, const onnx::TensorProto& x) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  const std::unique_ptr<Model> model = loadModel(toModelFile(imported), be);
  std::vector<int64_t> dims(x.dims().begin(), x.dims().end());
  Stash stash;
  const Tensor y =
      model->forward(toDevice(be, Shape(dims), floats(x)), stash, ForwardContext{false, 0});
  return toHost(y);
}

// The operators whose conformance cases run — ONNX's `node/` cases (one operator each)
// and the `pytorch-converted/` ones (PyTorch modules as its exporter wrote them, weights as
// initializers): every case of theirs is imported and compared, or refused with the
// importer's reason.
const std::vector<std::pair<std::string, std::vector<std::string>>> kSuites = {
    {"node",
     {"test_relu", "test_tanh", "test_sigmoid", "test_gemm_", "test_matmul_2d", "test_basic_conv_",
      "test_conv_", "test_maxpool_", "test_averagepool_", "test_globalaveragepool", "test_flatten_",
      "test_identity", "test_dropout_default", "test_reshape_"}},
    {"pytorch-converted",
     {"test_Linear", "test_Conv2d", "test_MaxPool2d", "test_AvgPool2d", "test_ReLU", "test_Tanh",
      "test_Sigmoid", "test_Softmax", "test_LogSoftmax", "test_Embedding", "test_BatchNorm2d"}}};

TEST(OnnxConformanceTest, TheCasesOfTheImportedOperatorsMatchTheirExpectedOutputs) {
  if (!fs::exists(kCases)) GTEST_SKIP() << "libonnx-testdata is not installed";
  std::vector<fs::path> cases;
  for (const auto& [suite, operators] : kSuites)
    for (const auto& e : fs::directory_iterator(kCases / suite)) {
      const std::string name = e.path().filename().string();
      for (const std::string& op : operators)
        if (name.rfind(op, 0) == 0 && name.find("_expanded") == std::string::npos) {
          cases.push_back(e.path());
          break;
        }
    }
  std::sort(cases.begin(), cases.end());
  int passed = 0;
  std::vector<std::string> refused, failed;
  double worst = 0;
  for (const fs::path& dir : cases) {
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
    const onnx::TensorProto x = readTensor(set / "input_0.pb");
    const std::vector<float> want = floats(readTensor(set / "output_0.pb"));
    ImportedModel imported;
    try {
      imported = importOnnx(m, name);
    } catch (const Error& e) {
      refused.push_back(e.what());
      continue;
    }
    if (x.data_type() != onnx::TensorProto::FLOAT) {
      failed.push_back(name + ": imported an input that is not float32");
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
    worst = std::max(worst, err);
    if (err <= 1e-5)
      ++passed;
    else
      failed.push_back(name + ": error " + std::to_string(err));
  }
  std::printf(
      "ONNX conformance cases: %zu run, %d passed, %zu refused, %zu failed; largest error "
      "|ours - expected| / (1 + |expected|) %.3g\n",
      cases.size(), passed, refused.size(), failed.size(), worst);
  for (const std::string& r : refused) std::printf("  refused: %s\n", r.c_str());
  for (const std::string& f : failed) ADD_FAILURE() << f;
  // Most cases of these operators are ones tandem expresses: refusing them all would
  // pass nothing.
  EXPECT_GE(passed, 35);
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
  testing::expectThrowWith<InvalidArgument>(
      [&] { importOnnx(m, "m.onnx"); }, {"node 'Gemm_y' (Gemm)", "does not continue the chain"});
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
}

}  // namespace
}  // namespace tandem::onnx_io
