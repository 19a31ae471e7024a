// ONNX out (onnx/onnx_export.h): every layer type tandem has exported and imported back
// to the same layers and bitwise the same outputs; a written file imports.
#include "tests/onnx/onnx_test_util.h"

namespace tandem::onnx_io {
namespace {

using namespace test;

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
  for (const char* yaml : {kCnnYaml, kMlpYaml, kLmYaml, kGptYaml, kMobileYaml, kShuffleYaml}) {
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

// A gate's Mul whose factor is not its branch's end, and an Unsqueeze that does not make
// per-channel values [N, C, 1, 1], are refused naming the node.
TEST(OnnxExportTest, AGateThatIsNotTandemsIsRefusedNamingTheNode) {
  const onnx::ModelProto m = exportOnnx(savedModel(kMobileYaml));
  auto find = [](onnx::ModelProto& g, const std::string& op) {
    for (auto& n : *g.mutable_graph()->mutable_node())
      if (n.op_type() == op) return &n;
    throw std::runtime_error("no " + op);
  };
  onnx::ModelProto other = m;  // the Mul multiplies by the branch's input instead
  onnx::NodeProto* unsqueeze = find(other, "Unsqueeze");
  unsqueeze->set_input(0, "5.0");  // (the pooled values' GlobalAveragePool)
  testing::expectThrowWith<InvalidArgument>(
      [&] { importOnnx(other, "m.onnx"); },
      {"m.onnx: node '5' (Mul)", "not the end of the branch"});
  onnx::ModelProto axes = m;
  unsqueeze = find(axes, "Unsqueeze");
  for (auto& t : *axes.mutable_graph()->mutable_initializer())
    if (t.name() == unsqueeze->input(1)) {
      const int64_t v[2] = {1, 3};
      t.set_raw_data(v, sizeof v);
    }
  testing::expectThrowWith<InvalidArgument>([&] { importOnnx(axes, "m.onnx"); },
                                            {"node '5.channels' (Unsqueeze)", "[N, C, 1, 1]"});
  EXPECT_EQ(importOnnx(m, "m.onnx").spec.layers.at(5).type, "gate");
}

// The CNN's layer 5 is a concat of a 1x1 convolution and a chain: its inputs' order says
// which branch comes first; another axis, and ceil mode on an average, are refused named.
TEST(OnnxExportTest, ConcatBranchesFollowTheJoinsInputsAndBadOnesAreRefused) {
  const onnx::ModelProto m = exportOnnx(savedModel(kCnnYaml));
  auto edit = [&](const std::string& name, const std::function<void(onnx::NodeProto&)>& f) {
    onnx::ModelProto copy = m;
    for (auto& n : *copy.mutable_graph()->mutable_node())
      if (n.name() == name) f(n);
    return copy;
  };
  const ImportedModel plain = importOnnx(m, "m.onnx");
  ASSERT_EQ(plain.spec.layers.at(5).type, "concat");
  EXPECT_EQ(plain.spec.layers.at(5).children.at(0).type, "conv2d");
  EXPECT_EQ(plain.spec.layers.at(4).attrs.count("ceil"), 1u);
  const ImportedModel swapped = importOnnx(
      edit("5", [](onnx::NodeProto& n) { n.mutable_input()->SwapElements(0, 1); }), "m.onnx");
  EXPECT_EQ(swapped.spec.layers.at(5).children.at(0).type, "chain");
  EXPECT_EQ(Model(swapped.spec).outputShape(), Model(plain.spec).outputShape());
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        importOnnx(edit("5", [](onnx::NodeProto& n) { n.mutable_attribute(0)->set_i(2); }),
                   "m.onnx");
      },
      {"m.onnx: node '5' (Concat)", "axis 2: tandem concatenates along channels"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        importOnnx(edit("7",
                        [](onnx::NodeProto& n) {
                          auto* a = n.add_attribute();
                          a->set_name("ceil_mode");
                          a->set_type(onnx::AttributeProto::INT);
                          a->set_i(1);
                        }),
                   "m.onnx");
      },
      {"node '7' (AveragePool)", "ceil_mode is supported for MaxPool only"});
}

// A BatchNormalization tandem cannot take — statistics of another size, a negative
// variance, no variance (ONNX's checker) — is refused naming the node; ONNX's
// momentum (the running value's weight) becomes tandem's complement exactly.
TEST(OnnxExportTest, BatchNormalizationImportsOrIsRefusedNamingTheNode) {
  const onnx::ModelProto m = exportOnnx(savedModel(kCnnYaml));
  int at = -1;
  for (int i = 0; i < m.graph().node_size(); ++i)
    if (m.graph().node(i).op_type() == "BatchNormalization" && at < 0) at = i;
  ASSERT_GE(at, 0);
  const onnx::NodeProto& bn = m.graph().node(at);
  const std::string where = "node '" + bn.name() + "' (BatchNormalization)";
  auto initializer = [](onnx::ModelProto& g, const std::string& name) {
    for (auto& t : *g.mutable_graph()->mutable_initializer())
      if (t.name() == name) return &t;
    throw std::runtime_error("no initializer " + name);
  };
  auto refused = [&](const std::function<void(onnx::ModelProto&)>& edit,
                     std::initializer_list<std::string> parts) {
    onnx::ModelProto copy = m;
    edit(copy);
    std::vector<std::string> want{where};
    want.insert(want.end(), parts);
    testing::expectThrowWith<InvalidArgument>([&] { importOnnx(copy, "m.onnx"); }, want);
  };
  refused(
      [&](onnx::ModelProto& g) {
        onnx::TensorProto* var = initializer(g, bn.input(4));
        std::vector<float> v(16, 1.0f);
        v[3] = -0.5f;
        var->set_raw_data(v.data(), v.size() * 4);
        var->clear_float_data();
      },
      {"variance holds -0.5"});
  onnx::ModelProto three = m;  // (ONNX's checker names the node)
  three.mutable_graph()->mutable_node(at)->mutable_input()->RemoveLast();
  testing::expectThrowWith<FormatError>([&] { importOnnx(three, "m.onnx"); },
                                        {bn.name(), "BatchNormalization", "input size 4"});
  refused(
      [&](onnx::ModelProto& g) {
        onnx::TensorProto* mean = initializer(g, bn.input(3));
        mean->set_dims(0, 8);
        std::vector<float> v(8, 0.0f);
        mean->set_raw_data(v.data(), v.size() * 4);
        mean->clear_float_data();
      },
      {"its mean has 8 values for 16 channels"});
  for (const float onnx_momentum : {0.9f, 0.99f, 0.997f, 0.0f}) {
    onnx::ModelProto copy = m;
    for (auto& a : *copy.mutable_graph()->mutable_node(at)->mutable_attribute())
      if (a.name() == "momentum") a.set_f(onnx_momentum);
    const LayerSpec layer = importOnnx(copy, "m.onnx").spec.layers.at(2).children.at(3);
    ASSERT_EQ(layer.type, "batchnorm");
    const double ours = std::get<double>(layer.attrs.at("momentum"));
    EXPECT_EQ(static_cast<float>(1.0 - ours), onnx_momentum);
    if (onnx_momentum == 0.9f) {
      EXPECT_EQ(ours, 0.1);
    }
    if (onnx_momentum == 0.997f) {
      EXPECT_EQ(ours, 0.003);
    }
  }
}

TEST(OnnxExportTest, WriteOnnxWritesAFileThatImports) {
  const std::string path = testing::freshDir("onnx-export") + "/mlp.onnx";
  const ModelFile file = savedModel(kMlpYaml);
  writeOnnx(file, path);
  EXPECT_TRUE(run(toModelFile(importOnnx(path))) == run(file));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

}  // namespace
}  // namespace tandem::onnx_io
