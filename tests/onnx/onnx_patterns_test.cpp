// The importer's patterns of several nodes (onnx/import/): PyTorch's LayerNorm and GELU
// as primitive operators, a GPT's attention, positional embedding and transformer blocks,
// and attention patterns that are not tandem's, refused naming the node.
#include <limits>

#include "tests/onnx/onnx_test_util.h"

namespace tandem::onnx_io {
namespace {

using namespace test;

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

// The ShuffleNet stage PyTorch 1.13 exports (tests/data/onnx-parity/shuffle.onnx): its
// shapes computed from Shape nodes at run time (a dynamic batch), folded; chunk's Slices
// become `slice` branches of a `concat`, each view-transpose-view a `channel_shuffle`, the
// mean over H and W a globalavgpool. Spoiled, the arithmetic or the pattern is refused
// naming its node.
TEST(OnnxImportTest, PyTorchsShapeArithmeticFoldsAndBrokenShapesAreRefusedNamingTheNode) {
  onnx::ModelProto good;
  ASSERT_TRUE(good.ParseFromString(
      slurp(std::string(TANDEM_SOURCE_DIR) + "/tests/data/onnx-parity/shuffle.onnx")));
  const ImportedModel imported = importOnnx(good, "shuffle.onnx");
  std::vector<std::string> types;
  for (const LayerSpec& l : imported.spec.layers) types.push_back(l.type);
  EXPECT_EQ(types, (std::vector<std::string>{
                       "conv2d", "batchnorm", "relu", "concat", "channel_shuffle", "concat",
                       "channel_shuffle", "concat", "channel_shuffle", "globalavgpool", "linear"}));
  ASSERT_EQ(types.size(), 11u);
  const LayerSpec& unit = imported.spec.layers[5];  // x1, branch(x2) of its halves
  ASSERT_EQ(unit.children.size(), 2u);
  EXPECT_EQ(unit.children[0].type, "slice");
  EXPECT_TRUE(unit.children[0].attrs ==
              (std::map<std::string, AttrValue>{{"begin", int64_t{0}}, {"end", int64_t{4}}}));
  EXPECT_EQ(unit.children[1].children.at(0).type, "slice");
  EXPECT_TRUE(unit.children[1].children.at(0).attrs ==
              (std::map<std::string, AttrValue>{{"begin", int64_t{4}}, {"end", int64_t{8}}}));
  EXPECT_TRUE(imported.spec.layers[4].attrs ==
              (std::map<std::string, AttrValue>{{"groups", int64_t{2}}}));

  // The first node of `op` whose input `k` a Constant makes: that Constant's tensor.
  const auto constantOf = [](onnx::GraphProto& g, const std::string& op, int k,
                             const std::function<bool(const onnx::NodeProto&)>& which) {
    for (const onnx::NodeProto& n : g.node())
      if (n.op_type() == op && n.input_size() > k && which(n))
        for (onnx::NodeProto& c : *g.mutable_node())
          if (c.op_type() == "Constant" && c.output(0) == n.input(k))
            return c.mutable_attribute(0)->mutable_t();
    ADD_FAILURE() << "no " << op << " reading a Constant";
    return static_cast<onnx::TensorProto*>(nullptr);
  };
  const auto setInts = [](onnx::TensorProto* t, int64_t v) {
    if (t == nullptr) return;
    t->clear_int64_data();
    t->set_raw_data(std::string(reinterpret_cast<const char*>(&v), sizeof v));
  };
  const auto any = [](const onnx::NodeProto&) { return true; };
  const auto refused = [&](const std::function<void(onnx::GraphProto&)>& spoil,
                           const std::vector<std::string>& what) {
    onnx::ModelProto m = good;
    spoil(*m.mutable_graph());
    testing::expectThrowWith<InvalidArgument>([&] { importOnnx(m, "spoiled.onnx"); }, what);
  };
  // The channels divided by 0 where the shuffle's groups are computed.
  refused([&](onnx::GraphProto& g) { setInts(constantOf(g, "Div", 1, any), 0); },
          {"spoiled.onnx: node '", "(Div)", "it divides 8 by 0"});
  // A dimension past the shape's end.
  refused([&](onnx::GraphProto& g) { setInts(constantOf(g, "Gather", 1, any), 9); },
          {"(Gather)", "index 9 is outside the list of 4"});
  // chunk's Slice along H instead of the channels.
  refused(
      [&](onnx::GraphProto& g) {
        setInts(
            constantOf(g, "Slice", 3, [](const onnx::NodeProto& n) { return n.input_size() == 4; }),
            2);
      },
      {"(Slice)", "only a slice of the channels (axis 1)"});
  // A transpose that moves nothing after the split into groups.
  refused(
      [&](onnx::GraphProto& g) {
        for (onnx::NodeProto& n : *g.mutable_node())
          if (n.op_type() == "Transpose") {
            n.mutable_attribute(0)->clear_ints();
            for (const int64_t a : {0, 1, 2, 3, 4}) n.mutable_attribute(0)->add_ints(a);
            break;
          }
      },
      {"(Transpose)", "only the transpose of the channels' two group axes"});
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
  // Heads and head size whose product overflows (the fuzz target's find: once multiplied):
  // not the pattern, so its Reshape is refused as one.
  const onnx::ModelProto heads = spoiled([](onnx::GraphProto& g) {
    for (auto& t : *g.mutable_initializer())
      if (t.name() == "2.0.1.split_shape") {
        const int64_t to[5] = {0, 0, 3, int64_t{1} << 42, std::numeric_limits<int64_t>::max() - 1};
        t.set_raw_data(to, sizeof to);
      }
  });
  testing::expectThrowWith<InvalidArgument>([&] { importOnnx(heads, "heads.onnx"); },
                                            {"node '2.0.1.split' (Reshape)"});
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

}  // namespace
}  // namespace tandem::onnx_io
