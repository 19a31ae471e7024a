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
  for (const char* yaml : {kCnnYaml, kMlpYaml, kLmYaml, kGptYaml, kMobileYaml}) {
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

}  // namespace
}  // namespace tandem::onnx_io
