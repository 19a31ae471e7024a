// YAML model specs: the examples parse and infer the documented shapes; malformed specs
// give errors that name the file position, the layer and what is wrong.
#include "core/model_spec.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "backends/cpu/cpu_backend.h"

#include "core/error.h"
#include "core/layers/residual.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::expectThrowWith;

Model parse(const std::string& yaml) { return Model(parseModelSpec(yaml, "m.yaml")); }

TEST(ModelSpecTest, ExamplesInferTheirShapes) {
  const Model mlp(loadModelSpec(TANDEM_SOURCE_DIR "/examples/models/mlp.yaml"));
  EXPECT_EQ(mlp.outputShape(), Shape{10});
  EXPECT_EQ(mlp.paramCount(), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  const Model cnn(loadModelSpec(TANDEM_SOURCE_DIR "/examples/models/cnn.yaml"));
  EXPECT_EQ(cnn.layer(5).outputShape(), (Shape{64, 7, 7}));
  EXPECT_EQ(cnn.layer(6).outputShape(), Shape{3136});
  const Model res(loadModelSpec(TANDEM_SOURCE_DIR "/examples/models/resnet-mini.yaml"));
  EXPECT_EQ(res.outputShape(), Shape{10});
  const auto& block = dynamic_cast<const Residual&>(res.layer(4));
  EXPECT_TRUE(block.hasProjection());
  EXPECT_EQ(block.outputShape(), (Shape{32, 14, 14}));
  EXPECT_FALSE(dynamic_cast<const Residual&>(res.layer(2)).hasProjection());
}

TEST(ModelSpecTest, UnknownLayerNamesItsPositionAndTheKnownTypes) {
  expectThrowWith<InvalidArgument>(
      [] { parse("input: [4]\nlayers:\n  - linear: {out: 3}\n  - softmaxx\n"); },
      {"layer 1", "unknown layer type 'softmaxx'", "m.yaml:4:5", "known: linear"});
}

TEST(ModelSpecTest, MissingFieldIsNamed) {
  expectThrowWith<InvalidArgument>([] { parse("input: [4]\nlayers:\n  - linear: {bias: true}\n"); },
                                   {"layer 0", "linear", "m.yaml:3:5", "field 'out' is required"});
  expectThrowWith<InvalidArgument>([] { parse("name: x\nlayers:\n  - relu\n"); },
                                   {"m.yaml", "missing required key 'input'"});
  expectThrowWith<InvalidArgument>([] { parse("input: [4]\n"); },
                                   {"missing required key 'layers'"});
}

TEST(ModelSpecTest, WrongTypeIsNamed) {
  expectThrowWith<InvalidArgument>([] { parse("input: [4]\nlayers:\n  - linear: {out: many}\n"); },
                                   {"field 'out' must be an integer", "m.yaml:3:5"});
  expectThrowWith<InvalidArgument>(
      [] { parse("input: [1, 8, 8]\nlayers:\n  - conv2d: {out: 2, kernel: [1, 2, 3]}\n"); },
      {"field 'kernel' must be an integer or a list of two integers"});
  expectThrowWith<InvalidArgument>(
      [] { parse("input: [4]\nlayers:\n  - linear: {out: 2, bias: maybe}\n"); },
      {"field 'bias' must be true or false"});
  expectThrowWith<InvalidArgument>([] { parse("input: [4, -1]\nlayers: [relu]\n"); },
                                   {"m.yaml:1:", "'input' sizes must be positive integers"});
  expectThrowWith<InvalidArgument>([] { parse("input: [4]\nlayers: relu\n"); },
                                   {"'layers' must be a list"});
}

TEST(ModelSpecTest, UnknownFieldAndUnknownKeyAreNamed) {
  expectThrowWith<InvalidArgument>(
      [] { parse("input: [4]\nlayers:\n  - linear: {out: 2, outs: 3}\n"); },
      {"unknown field 'outs'", "known:", "out"});
  expectThrowWith<InvalidArgument>([] { parse("input: [4]\nlayer:\n  - relu\n"); },
                                   {"m.yaml:2:1", "unknown key 'layer'"});
  expectThrowWith<InvalidArgument>(
      [] { parse("input: [4]\nlayers:\n  - relu: {layers: [tanh]}\n"); },
      {"'relu' does not take a 'layers' list"});
}

TEST(ModelSpecTest, ShapeMismatchNamesLayerIndexTypeAndBothShapes) {
  expectThrowWith<InvalidArgument>(
      [] { parse("input: [1, 28, 28]\nlayers:\n  - flatten\n  - linear: {in: 100, out: 10}\n"); },
      {"layer 1 (linear at m.yaml:4:5)", "expected input [100]", "got [784]"});
  expectThrowWith<InvalidArgument>(
      [] { parse("input: [784]\nlayers:\n  - conv2d: {out: 4, kernel: 3}\n"); },
      {"layer 0 (conv2d", "expected input [C, H, W]", "got [784]"});
  expectThrowWith<InvalidArgument>(
      [] { parse("input: [1, 4, 4]\nlayers:\n  - conv2d: {out: 4, kernel: 7}\n"); },
      {"layer 0 (conv2d", "does not fit input [1, 4, 4]"});
  expectThrowWith<InvalidArgument>(
      [] { parse("input: [3, 8, 8]\nlayers:\n  - residual: {layers: [flatten]}\n"); },
      {"layer 0 (residual", "[3, 8, 8] to [192]"});
}

TEST(ModelSpecTest, SyntaxErrorsAreFormatErrorsWithAPosition) {
  expectThrowWith<FormatError>([] { parse("input: [4\nlayers:\n  - relu\n"); },
                               {"m.yaml:", "YAML syntax error"});
  expectThrowWith<InvalidArgument>([] { parse("- just\n- a list\n"); }, {"must be a map"});
  EXPECT_THROW(loadModelSpec("/nonexistent/model.yaml"), IoError);
}

TEST(ModelSpecTest, DeepNestingIsRejectedNotOverflowed) {
  std::string yaml = "input: [4]\nlayers:\n  - ";
  for (int i = 0; i < 40; ++i) yaml += "residual: {layers: [";
  yaml += "relu";
  for (int i = 0; i < 40; ++i) yaml += "]}";
  expectThrowWith<InvalidArgument>([&] { parse(yaml + "\n"); }, {"nested more than 32 deep"});
}

TEST(ModelSpecTest, AbsurdSizesAreErrorsNotOverflows) {
  expectThrowWith<InvalidArgument>(
      [] { parse("input: [4000000000, 4000000000, 4000000000]\nlayers: [relu]\n"); },
      {"more elements than fit in 64 bits"});
  cpu::CpuBackend be;
  Model huge = parse("input: [100000]\nlayers:\n  - linear: {out: 100000000}\n");
  expectThrowWith<InvalidArgument>([&] { huge.build(be, 1); },
                                   {"parameters in layers [0, 1), needing", "cpu has"});
}

// Random edits of the example specs: every outcome is a model or a tandem::Error.
TEST(ModelSpecTest, MutatedSpecsNeverEscapeTheErrorHierarchy) {
  const char* files[] = {"mlp.yaml", "cnn.yaml", "resnet-mini.yaml"};
  const std::string alphabet = "{}[]:,- \n#abcxyz0123456789.";
  Rng rng(11);
  int errors = 0;
  for (int trial = 0; trial < 600; ++trial) {
    std::ifstream in(std::string(TANDEM_SOURCE_DIR "/examples/models/") + files[trial % 3]);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (int k = 0; k < 1 + static_cast<int>(rng.below(4)); ++k) {
      const size_t at = rng.below(text.size());
      switch (rng.below(3)) {
        case 0:
          text[at] = alphabet[rng.below(alphabet.size())];
          break;
        case 1:
          text.erase(at, 1 + rng.below(8));
          break;
        default:
          text.insert(at, 1, alphabet[rng.below(alphabet.size())]);
          break;
      }
    }
    try {
      Model m(parseModelSpec(text, "mutated.yaml"));
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 100);
}

void expectSameSpecs(const std::vector<LayerSpec>& a, const std::vector<LayerSpec>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].type, b[i].type) << i;
    EXPECT_TRUE(a[i].attrs == b[i].attrs) << i << " " << a[i].type;
    expectSameSpecs(a[i].children, b[i].children);
  }
}

TEST(ModelSpecTest, ASpecWrittenAsYamlReadsBackTheSame) {
  std::vector<ModelSpec> specs;
  for (const char* f : {"mlp", "mlp-deep", "cnn", "resnet-mini"})
    specs.push_back(
        loadModelSpec(std::string(TANDEM_SOURCE_DIR "/examples/models/") + f + ".yaml"));
  // Numbers that YAML could take for another type: a double with an integral value, one
  // that needs 17 digits, a tiny one; a string flag; a name with YAML's specials.
  ModelSpec odd;
  odd.name = "a: [model] # 1";
  odd.input = Shape{5};
  odd.layers = {
      {"linear", {{"out", int64_t{3}}, {"bias", std::string("false")}}, {}, ""},
      {"dropout", {{"p", 0.1}}, {}, ""},
      {"layernorm", {{"eps", 1.0}}, {}, ""},
      {"layernorm", {{"eps", 1e-20}}, {}, ""},
      {"residual", {}, {{"relu", {}, {}, ""}, {"linear", {{"out", int64_t{3}}}, {}, ""}}, ""}};
  specs.push_back(odd);
  for (const ModelSpec& spec : specs) {
    const std::string yaml = modelSpecYaml(spec);
    const ModelSpec back = parseModelSpec(yaml, "written.yaml");
    EXPECT_EQ(back.name, spec.name) << yaml;
    EXPECT_EQ(back.input, spec.input) << yaml;
    expectSameSpecs(back.layers, spec.layers);
  }
  EXPECT_NO_THROW(Model(parseModelSpec(modelSpecYaml(odd), "odd.yaml")));
}

}  // namespace
}  // namespace tandem
