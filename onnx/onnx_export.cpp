#include "onnx/onnx_export.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/layers/attention.h"
#include "core/layers/branches.h"
#include "core/layers/gate.h"
#include "core/layers/residual.h"
#include "core/layers/transformer.h"

namespace tandem::onnx_io {

namespace {

// The opset written: 17 is the first with LayerNormalization (ONNX 1.12, Debian 12's).
constexpr int64_t kOpset = 17;

class Exporter {
 public:
  explicit Exporter(onnx::GraphProto& g) : g_(g) {}

  // The nodes of the layers of `seq` (a Model or a block's Sequence) from value `x`;
  // `path` prefixes their names ("5." inside layer 5). Returns the value made.
  template <typename Layers>
  std::string sequence(const Layers& seq, std::string x, const std::string& path) {
    for (size_t i = 0; i < seq.size(); ++i) x = layer(seq.layer(i), x, path + std::to_string(i));
    return x;
  }

 private:
  onnx::NodeProto* node(const std::string& op, const std::vector<std::string>& in,
                        const std::string& out, const std::string& name) {
    onnx::NodeProto* n = g_.add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (const std::string& v : in) n->add_input(v);
    n->add_output(out);
    return n;
  }

  static void ints(onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t k : v) a->add_ints(k);
  }
  static void integer(onnx::NodeProto* n, const std::string& name, int64_t v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void real(onnx::NodeProto* n, const std::string& name, float v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }

  // An initializer of float32 values (raw little-endian bytes, as PyTorch writes them).
  std::string init(const std::string& name, const std::vector<int64_t>& dims, const float* data,
                   size_t count) {
    onnx::TensorProto* t = g_.add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    t->set_raw_data(data, count * sizeof(float));
    return name;
  }
  std::string param(const Param& p) {
    const std::vector<float> v = toHost(p.value);
    return init(p.name, p.value.shape().dims(), v.data(), v.size());
  }
  std::string scalar(const std::string& name, float v) { return init(name, {}, &v, 1); }
  // An int64 initializer (a shape, indices, slice bounds).
  std::string int64s(const std::string& name, const std::vector<int64_t>& dims,
                     const std::vector<int64_t>& v) {
    onnx::TensorProto* t = g_.add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    for (int64_t d : dims) t->add_dims(d);
    t->set_raw_data(v.data(), v.size() * sizeof(int64_t));
    return name;
  }
  // The weight [out, in] of a linear map as MatMul's [in, out], and its bias added after.
  std::string matmulLinear(const std::string& x, const Param& w, const Param& b,
                           const std::string& name) {
    const std::vector<float> v = toHost(w.value);
    const int64_t out = w.value.shape()[0], in = w.value.shape()[1];
    std::vector<float> wt(v.size());
    for (int64_t i = 0; i < out; ++i)
      for (int64_t j = 0; j < in; ++j)
        wt[static_cast<size_t>(j * out + i)] = v[static_cast<size_t>(i * in + j)];
    node("MatMul", {x, init(w.name, {in, out}, wt.data(), wt.size())}, name + ".matmul",
         name + ".matmul");
    node("Add", {name + ".matmul", param(b)}, name, name + ".bias");
    return name;
  }

  // Causal multi-head attention in the form PyTorch exports a module that writes it out
  // (benchmarks/torch_peer.py's Block): qkv projection, Reshape [N, T, 3, H, hs],
  // Transpose to [3, N, H, T, hs], Gather q, k and v, q k^T / sqrt(hs), the causal mask
  // as Where(mask, -inf, scores), Softmax, times v, back to [N, T, D], out projection.
  std::string attention(const Attention& a, const std::vector<Param*>& ps, const std::string& x,
                        const std::string& name) {
    if (a.kvHeads() != a.heads() || !a.qkvBias() || !a.outBias() || a.rope().enabled())
      throw InvalidArgument("layer " + name +
                            " (attention): no ONNX export for grouped-query attention, rotary "
                            "embedding or attention without biases");
    const int64_t t = a.inputShape()[0], d = a.inputShape()[1], h = a.heads(), hs = d / h;
    const std::string qkv = matmulLinear(x, *ps[0], *ps[1], name + ".qkv");
    node("Reshape", {qkv, int64s(name + ".split_shape", {5}, {0, 0, 3, h, hs})}, name + ".split",
         name + ".split");
    ints(node("Transpose", {name + ".split"}, name + ".heads", name + ".heads"), "perm",
         {2, 0, 3, 1, 4});
    const char* parts[] = {"q", "k", "v"};
    for (int64_t i = 0; i < 3; ++i) {
      const std::string part = name + "." + parts[i];
      integer(node("Gather", {name + ".heads", int64s(part + ".index", {}, {i})}, part, part),
              "axis", 0);
    }
    ints(node("Transpose", {name + ".k"}, name + ".kt", name + ".kt"), "perm", {0, 1, 3, 2});
    node("MatMul", {name + ".q", name + ".kt"}, name + ".qk", name + ".qk");
    std::string scores = name + ".scores";
    node("Div", {name + ".qk", scalar(name + ".sqrt_hs", std::sqrt(static_cast<float>(hs)))},
         scores, scores);
    if (a.causal()) {  // key j is hidden from query i when j > i
      onnx::TensorProto* m = g_.add_initializer();
      m->set_name(name + ".mask");
      m->set_data_type(onnx::TensorProto::BOOL);
      m->add_dims(t);
      m->add_dims(t);
      std::string bits(static_cast<size_t>(t * t), '\0');
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = i + 1; j < t; ++j) bits[static_cast<size_t>(i * t + j)] = 1;
      m->set_raw_data(bits);
      node("Where",
           {name + ".mask", scalar(name + ".hidden", -std::numeric_limits<float>::infinity()),
            scores},
           name + ".masked", name + ".masked");
      scores = name + ".masked";
    }
    integer(node("Softmax", {scores}, name + ".probs", name + ".probs"), "axis", -1);
    node("MatMul", {name + ".probs", name + ".v"}, name + ".context", name + ".context");
    ints(node("Transpose", {name + ".context"}, name + ".merged", name + ".merged"), "perm",
         {0, 2, 1, 3});
    node("Reshape", {name + ".merged", int64s(name + ".merge_shape", {3}, {0, 0, d})},
         name + ".joined", name + ".joined");
    return matmulLinear(name + ".joined", *ps[2], *ps[3], name);
  }

  static std::vector<int64_t> pair(const LayerSpec& s, const std::string& key) {
    const auto& v = std::get<std::vector<int64_t>>(s.attrs.at(key));
    return {v.at(0), v.at(1)};
  }

  // An activation layer of type `t` as PyTorch exports it; nullopt for other types.
  std::optional<std::string> activation(const std::string& t, const std::string& x,
                                        const std::string& name) {
    if (t == "relu" || t == "tanh" || t == "sigmoid") {
      node(t == "relu" ? "Relu" : t == "tanh" ? "Tanh" : "Sigmoid", {x}, name, name);
      return name;
    }
    if (t == "relu6") {  // as PyTorch exports nn.ReLU6(): a Clip with its bounds as inputs
      node("Clip", {x, scalar(name + ".min", 0.0f), scalar(name + ".max", 6.0f)}, name, name);
      return name;
    }
    if (t == "hardsigmoid") {  // PyTorch's slope and offset, not the operator's defaults
      onnx::NodeProto* n = node("HardSigmoid", {x}, name, name);
      real(n, "alpha", 1.0f / 6);
      real(n, "beta", 0.5f);
      return name;
    }
    if (t == "hardswish") {
      node("HardSwish", {x}, name, name);
      return name;
    }
    if (t == "silu") {  // as PyTorch exports nn.SiLU(): no Silu operator
      node("Sigmoid", {x}, name + ".sigmoid", name + ".sigmoid");
      node("Mul", {x, name + ".sigmoid"}, name, name);
      return name;
    }
    if (t == "gelu") {  // as PyTorch exports nn.GELU(): no Gelu operator before opset 20
      node("Div", {x, scalar(name + ".sqrt2", static_cast<float>(std::sqrt(2.0)))}, name + ".div",
           name + ".div");
      node("Erf", {name + ".div"}, name + ".erf", name + ".erf");
      node("Add", {name + ".erf", scalar(name + ".one", 1.0f)}, name + ".add", name + ".add");
      node("Mul", {x, name + ".add"}, name + ".mul", name + ".mul");
      node("Mul", {name + ".mul", scalar(name + ".half", 0.5f)}, name, name);
      return name;
    }
    return std::nullopt;
  }

  // The blocks whose branches meet again (chain, concat, gate); nullopt for other types.
  std::optional<std::string> branching(const Layer& l, const std::string& t, const std::string& x,
                                       const std::string& name) {
    if (t == "identity") return x;  // (a concat's branch that passes its input on)
    if (t == "chain") return sequence(dynamic_cast<const Chain&>(l).body(), x, name + ".");
    if (t == "concat") {  // each branch from x, joined along channels
      const Sequence& branches = dynamic_cast<const Concat&>(l).branches();
      std::vector<std::string> ends;
      for (size_t k = 0; k < branches.size(); ++k)
        ends.push_back(layer(branches.layer(k), x, name + "." + std::to_string(k)));
      integer(node("Concat", ends, name, name), "axis", 1);
      return name;
    }
    if (t == "gate") {  // per-channel values unsqueezed to [N, C, 1, 1], then the Mul
      const auto& gate = dynamic_cast<const Gate&>(l);
      std::string factor = sequence(gate.body(), x, name + ".");
      if (gate.perChannel()) {
        node("Unsqueeze", {factor, int64s(name + ".axes", {2}, {2, 3})}, name + ".channels",
             name + ".channels");
        factor = name + ".channels";
      }
      node("Mul", {x, factor}, name, name);
      return name;
    }
    return std::nullopt;
  }

  // slice (a Slice of axis 1) and channel_shuffle (as torchvision writes it: a Reshape of
  // the channels to [G, K], a Transpose of the two, a Reshape back; 0 keeps the batch);
  // nullopt for other types.
  std::optional<std::string> rearranging(const Layer& l, const std::string& t, const std::string& x,
                                         const std::string& name) {
    const LayerSpec s = l.spec();
    if (t == "slice") {
      node("Slice",
           {x, int64s(name + ".starts", {1}, {std::get<int64_t>(s.attrs.at("begin"))}),
            int64s(name + ".ends", {1}, {std::get<int64_t>(s.attrs.at("end"))}),
            int64s(name + ".axes", {1}, {1})},
           name, name);
      return name;
    }
    if (t != "channel_shuffle") return std::nullopt;
    const int64_t groups = std::get<int64_t>(s.attrs.at("groups"));
    const std::vector<int64_t> sample = l.inputShape().dims();
    std::vector<int64_t> split{0, groups, sample[0] / groups}, back{0};
    std::vector<int64_t> perm{0, 2, 1};
    for (size_t i = 0; i < sample.size(); ++i) {
      if (i > 0) split.push_back(sample[i]), perm.push_back(static_cast<int64_t>(i) + 2);
      back.push_back(sample[i]);
    }
    node("Reshape",
         {x, int64s(name + ".groups_shape", {static_cast<int64_t>(split.size())}, split)},
         name + ".groups", name + ".groups");
    ints(node("Transpose", {name + ".groups"}, name + ".swapped", name + ".swapped"), "perm", perm);
    node("Reshape",
         {name + ".swapped", int64s(name + ".shape", {static_cast<int64_t>(back.size())}, back)},
         name, name);
    return name;
  }

  // layernorm and batchnorm (its inference form, with the running statistics; ONNX's
  // momentum weighs the old running value, tandem's the new batch's).
  std::optional<std::string> normalization(const LayerSpec& s, const std::vector<Param*>& ps,
                                           const std::string& x, const std::string& name) {
    if (s.type != "layernorm" && s.type != "batchnorm") return std::nullopt;
    if (s.type == "layernorm") {
      onnx::NodeProto* n =
          node("LayerNormalization", {x, param(*ps[0]), param(*ps[1])}, name, name);
      integer(n, "axis", -1);
      real(n, "epsilon", static_cast<float>(std::get<double>(s.attrs.at("eps"))));
      return name;
    }
    return batchNorm(x, ps, 0, s.attrs.at("eps"), s.attrs.at("momentum"), name);
  }

  // BatchNormalization of x by ps[at, at + 4) (scale, bias, running mean and variance).
  std::string batchNorm(const std::string& x, const std::vector<Param*>& ps, size_t at,
                        const AttrValue& eps, const AttrValue& momentum, const std::string& name) {
    onnx::NodeProto* n =
        node("BatchNormalization",
             {x, param(*ps[at]), param(*ps[at + 1]), param(*ps[at + 2]), param(*ps[at + 3])}, name,
             name);
    real(n, "epsilon", static_cast<float>(std::get<double>(eps)));
    real(n, "momentum", static_cast<float>(1.0 - std::get<double>(momentum)));
    return name;
  }

  // The body's nodes, then Add of its end and the input or its projection: a Conv 1x1 (or
  // Gemm) with proj.weight (and proj.bias) after the body's parameters, followed by a
  // BatchNormalization when the projection has a norm (its four parameters last).
  std::string residual(const Residual& r, const std::vector<Param*>& ps, const std::string& x,
                       const std::string& name) {
    const std::string body = sequence(r.body(), x, name + ".");
    std::string shortcut = x;
    if (r.hasProjection()) {
      const size_t norm = r.projectionHasNorm() ? 4 : 0;
      const bool bias = r.projectionHasBias();
      const size_t weight = ps.size() - norm - (bias ? 2 : 1);
      std::vector<std::string> in{x, param(*ps[weight])};
      if (bias) in.push_back(param(*ps[weight + 1]));
      shortcut = name + ".proj";
      if (r.inputShape().rank() == 3) {
        onnx::NodeProto* n = node("Conv", in, shortcut, shortcut);
        const int64_t stride = projectionStride(r.inputShape()[1], r.outputShape()[1]);
        ints(n, "kernel_shape", {1, 1});
        ints(n, "strides", {stride, stride});
      } else {
        integer(node("Gemm", in, shortcut, shortcut), "transB", 1);
      }
      if (norm) {
        const LayerSpec s = r.spec();
        shortcut = batchNorm(shortcut, ps, ps.size() - 4, s.attrs.at("proj_eps"),
                             s.attrs.at("proj_momentum"), name + ".proj.norm");
      }
    }
    node("Add", {body, shortcut}, name, name);
    return name;
  }

  std::string layer(const Layer& l, const std::string& x, const std::string& name) {
    const LayerSpec s = l.spec();
    const std::string& t = s.type;
    // (params() is not const: the layer's parameters are only read here.)
    const std::vector<Param*> ps = const_cast<Layer&>(l).params();
    if (t == "linear") {
      if (l.inputShape().rank() == 1) {
        std::vector<std::string> in{x, param(*ps[0])};
        if (ps.size() > 1) in.push_back(param(*ps[1]));
        integer(node("Gemm", in, name, name), "transB", 1);
        return name;
      }
      // MatMul takes [in, out]: the weight transposed.
      if (ps.size() > 1) return matmulLinear(x, *ps[0], *ps[1], name);
      const std::vector<float> v = toHost(ps[0]->value);
      const int64_t out = ps[0]->value.shape()[0], in = ps[0]->value.shape()[1];
      std::vector<float> wt(v.size());
      for (int64_t i = 0; i < out; ++i)
        for (int64_t j = 0; j < in; ++j)
          wt[static_cast<size_t>(j * out + i)] = v[static_cast<size_t>(i * in + j)];
      node("MatMul", {x, init(ps[0]->name, {in, out}, wt.data(), wt.size())}, name, name);
      return name;
    }
    if (t == "conv2d") {
      std::vector<std::string> in{x, param(*ps[0])};
      if (ps.size() > 1) in.push_back(param(*ps[1]));
      onnx::NodeProto* n = node("Conv", in, name, name);
      ints(n, "kernel_shape", pair(s, "kernel"));
      ints(n, "strides", pair(s, "stride"));
      const auto p = pair(s, "padding");
      ints(n, "pads", {p[0], p[1], p[0], p[1]});
      if (const auto g = s.attrs.find("groups"); g != s.attrs.end())
        integer(n, "group", std::get<int64_t>(g->second));
      return name;
    }
    if (t == "maxpool2d" || t == "avgpool2d") {
      onnx::NodeProto* n = node(t == "maxpool2d" ? "MaxPool" : "AveragePool", {x}, name, name);
      ints(n, "kernel_shape", pair(s, "kernel"));
      ints(n, "strides", pair(s, "stride"));
      const auto p = pair(s, "padding");
      ints(n, "pads", {p[0], p[1], p[0], p[1]});
      if (t == "avgpool2d") integer(n, "count_include_pad", 1);  // tandem's average counts it
      if (s.attrs.count("ceil")) integer(n, "ceil_mode", 1);
      return name;
    }
    if (t == "globalavgpool") {
      node("GlobalAveragePool", {x}, name + ".pool", name + ".pool");
      integer(node("Flatten", {name + ".pool"}, name, name), "axis", 1);
      return name;
    }
    if (std::optional<std::string> y = activation(t, x, name)) return *y;
    if (t == "flatten") {
      integer(node("Flatten", {x}, name, name), "axis", 1);
      return name;
    }
    if (t == "dropout") {
      node("Dropout",
           {x, scalar(name + ".ratio", static_cast<float>(std::get<double>(s.attrs.at("p"))))},
           name, name);
      return name;
    }
    if (std::optional<std::string> y = normalization(s, ps, x, name)) return *y;
    if (t == "attention") return attention(dynamic_cast<const Attention&>(l), ps, x, name);
    if (t == "positional") {  // x + P[:T]: the table whole, sliced to the input's length
      const int64_t len = l.inputShape()[0];
      node("Slice",
           {param(*ps[0]), int64s(name + ".starts", {1}, {0}), int64s(name + ".ends", {1}, {len}),
            int64s(name + ".axes", {1}, {0})},
           name + ".rows", name + ".rows");
      node("Add", {x, name + ".rows"}, name, name);
      return name;
    }
    if (t == "transformer")  // its two residual blocks
      return sequence(dynamic_cast<const TransformerBlock&>(l).body(), x, name + ".");
    if (t == "embedding") {
      integer(node("Gather", {param(*ps[0]), x}, name, name), "axis", 0);
      return name;
    }
    if (std::optional<std::string> y = branching(l, t, x, name)) return *y;
    if (std::optional<std::string> y = rearranging(l, t, x, name)) return *y;
    if (t == "residual") return residual(dynamic_cast<const Residual&>(l), ps, x, name);
    throw InvalidArgument("layer " + name + " (" + t + "): no ONNX export for this layer type");
  }

  onnx::GraphProto& g_;
};

void valueInfo(onnx::ValueInfoProto* v, const std::string& name, onnx::TensorProto::DataType type,
               const Shape& sample) {
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(type);
  tt->mutable_shape()->add_dim()->set_dim_param("N");
  for (int64_t d : sample.dims()) tt->mutable_shape()->add_dim()->set_dim_value(d);
}

}  // namespace

onnx::ModelProto exportOnnx(const ModelFile& file) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  const std::unique_ptr<Model> model = loadModel(file, be);
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("tandem");
  m.add_opset_import()->set_version(kOpset);
  onnx::GraphProto& g = *m.mutable_graph();
  g.set_name(model->name());
  const bool ids = model->inputDType() == DType::kI32;
  const std::string input = ids ? "ids" : "input";
  valueInfo(g.add_input(), input, ids ? onnx::TensorProto::INT64 : onnx::TensorProto::FLOAT,
            model->inputShape());
  Exporter exporter(g);
  std::string out = exporter.sequence(*model, input, "");
  // A model imported with a softmax at its output gets it back (the loss applied it in
  // training; an ONNX runtime serving the model applies it here).
  const auto applied = file.metadata.find("output");
  if (applied != file.metadata.end()) {
    const std::string* kind = std::get_if<std::string>(&applied->second);
    TANDEM_CHECK_MSG(kind && (*kind == "softmax" || *kind == "log_softmax"), InvalidArgument,
                     "the model file's metadata 'output' is neither softmax nor log_softmax");
    onnx::NodeProto* n = g.add_node();
    n->set_op_type(*kind == "softmax" ? "Softmax" : "LogSoftmax");
    n->set_name(*kind);
    n->add_input(out);
    n->add_output(*kind);
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name("axis");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(-1);
    out = *kind;
  }
  // The last value is named "output" (a rename of its node's output and of its readers).
  for (auto& n : *g.mutable_node())
    for (auto& o : *n.mutable_output())
      if (o == out) o = "output";
  valueInfo(g.add_output(), "output", onnx::TensorProto::FLOAT, model->outputShape());
  return m;
}

void writeOnnx(const ModelFile& file, const std::string& path) {
  onnx::ModelProto m = exportOnnx(file);
  try {
    onnx::checker::check_model(m);
    // Strict: a node whose output shape cannot be inferred, or whose types disagree, fails.
    onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(true, 1));
  } catch (const std::exception& e) {
    throw InvalidArgument("the exported graph fails ONNX's checks (a tandem bug): " +
                          std::string(e.what()));
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw IoError("cannot write ONNX model '" + tmp + "'");
    if (!m.SerializeToOstream(&f)) throw IoError("writing ONNX model '" + tmp + "' failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw IoError("cannot rename '" + tmp + "' to '" + path + "'");
  }
}

}  // namespace tandem::onnx_io
