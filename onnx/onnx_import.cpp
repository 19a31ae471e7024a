#include "onnx/onnx_import.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"

namespace tandem::onnx_io {

namespace {

// The largest tensor an initializer may declare (dims multiplied, checked for overflow
// before anything is allocated): 4 Gi values.
constexpr int64_t kMaxValues = int64_t{1} << 32;
// The largest size, stride or pad along one dimension.
constexpr int64_t kMaxDim = int64_t{1} << 30;

class Importer {
 public:
  Importer(const onnx::ModelProto& m, std::string source) : m_(m), source_(std::move(source)) {}

  ImportedModel run() {
    const onnx::GraphProto& g = m_.graph();
    for (const onnx::TensorProto& t : g.initializer()) constants_[t.name()] = &t;
    taken_.assign(static_cast<size_t>(g.node_size()), false);
    // (ONNX's checker has made sure each value is made before it is used.)
    for (int i = 0; i < g.node_size(); ++i) {
      const onnx::NodeProto& node = g.node(i);
      for (const std::string& out : node.output()) producer_[out] = i;
      if (node.op_type() == "Constant") {
        constant(node);
        taken_[static_cast<size_t>(i)] = true;
        continue;
      }
      // An Identity of a constant is that constant under another name (PyTorch's exporter
      // makes one for each parameter whose values another's repeat, e.g. LayerNorms').
      if (node.op_type() == "Identity" && node.input_size() == 1 &&
          constants_.count(node.input(0)) && node.output_size() == 1) {
        constants_[node.output(0)] = constants_.at(node.input(0));
        taken_[static_cast<size_t>(i)] = true;
        continue;
      }
      for (const std::string& in : node.input())
        if (!in.empty() && !constants_.count(in)) {
          std::vector<int>& c = consumers_[in];
          if (c.empty() || c.back() != i) c.push_back(i);
        }
    }
    findInput(g);
    out_.spec.name = g.name().empty() ? "onnx" : g.name();
    layers_ = &out_.spec.layers;
    const std::string end = walk(value_);
    if (g.output_size() != 1 || g.output(0).name() != end)
      throw InvalidArgument(
          source_ + ": the graph's output is not the end of its chain of nodes ('" + end + "')");
    for (int i = 0; i < g.node_size(); ++i)
      if (!taken_[static_cast<size_t>(i)])
        refuse(g.node(i), "it is not on the way from the input to the output");
    if (padded_) refuse(*padded_, "a Pad at the output is not supported");
    if (out_.spec.layers.empty())
      throw InvalidArgument(source_ + ": no layer is left once dropped nodes are removed");
    mergeTransformers(out_.spec.layers);
    return std::move(out_);
  }

 private:
  const onnx::NodeProto& node(int i) const { return m_.graph().node(i); }

  // The default domain's opset the model declares.
  int64_t opset() const {
    for (const auto& o : m_.opset_import())
      if (o.domain().empty() || o.domain() == "ai.onnx") return o.version();
    return 1;
  }

  // The nodes not imported yet that read `value`, in graph order.
  std::vector<int> live(const std::string& value) const {
    std::vector<int> out;
    const auto it = consumers_.find(value);
    if (it != consumers_.end())
      for (int i : it->second)
        if (!taken_[static_cast<size_t>(i)]) out.push_back(i);
    return out;
  }

  bool isOutput(const std::string& value) const {
    for (const auto& o : m_.graph().output())
      if (o.name() == value) return true;
    return false;
  }

  // The one node of type `op` that reads `value`, when it is the value's only reader and
  // the value is not a graph output; else -1.
  int only(const std::string& value, const std::string& op) const {
    const std::vector<int> c = live(value);
    if (c.size() != 1 || isOutput(value) || node(c[0]).op_type() != op) return -1;
    return c[0];
  }

  void take(std::initializer_list<int> nodes) {
    for (int i : nodes) taken_[static_cast<size_t>(i)] = true;
  }

  // Imports the chain that starts at `v`, up to where no node reads on: the value there.
  std::string walk(std::string v) {
    for (;;) {
      const std::vector<int> next = live(v);
      if (next.empty()) return v;
      if (ids_ && node(next[0]).op_type() != "Gather")
        refuse(node(next[0]), "the input '" + v +
                                  "' holds integer ids: only an embedding (a Gather from an "
                                  "initializer) can take them");
      if (next.size() == 1) {
        if (auto end = attention(v, next[0])) {
          v = *end;
        } else if (auto end2 = positional(v, next[0])) {
          v = *end2;
        } else {
          v = single(next[0], v);
        }
      } else if (auto end = gelu(v, next)) {
        v = *end;
      } else if (auto end2 = layerNormPattern(v, next)) {
        v = *end2;
      } else if (next.size() == 2 || sums(v, next) == 1) {
        v = residual(v, next);
      } else {
        refuse(node(next[2]), "'" + v + "' is read by " + std::to_string(next.size()) +
                                  " nodes: a graph tandem's layer list cannot express");
      }
    }
  }

  // One node of the chain (with the bias Add after a MatMul): the value it makes.
  std::string single(int i, const std::string& v) {
    const onnx::NodeProto& node = this->node(i);
    take({i});
    const std::string& op = node.op_type();
    if (op == "Gather") return gather(node, v);
    if (node.input_size() == 0 || node.input(0) != v)
      refuse(node, "it does not continue the chain: its first input is '" +
                       (node.input_size() ? node.input(0) : std::string()) +
                       "', not the previous node's output '" + v + "'");
    for (int k = 1; k < node.input_size(); ++k)
      if (!node.input(k).empty() && !constants_.count(node.input(k)))
        refuse(node, "its input '" + node.input(k) +
                         "' is computed, not an initializer: a branch tandem's layer list "
                         "cannot express");
    for (int k = 1; k < node.output_size(); ++k)
      if (!node.output(k).empty() && (!live(node.output(k)).empty() || isOutput(node.output(k))))
        refuse(node, "its output '" + node.output(k) + "' is used: only one output may be");
    if (padded_ && op != "Conv" && op != "AveragePool")
      refuse(*padded_,
             "a Pad only before a Conv or an AveragePool (whose padding its zeros "
             "are) is supported; its reader is " +
                 op);
    if (op == "Gemm") {
      gemm(node);
    } else if (op == "MatMul") {
      return matmul(node);
    } else if (op == "Conv") {
      conv(node);
    } else if (op == "MaxPool" || op == "AveragePool") {
      pool(node);
    } else if (op == "GlobalAveragePool") {
      requireRank(node, 3);
      add({"globalavgpool", {}, {}, where(node)});
      shape_ = Shape{shape_[0]};
    } else if (op == "Relu" || op == "Tanh" || op == "Sigmoid") {
      add({op == "Relu" ? "relu" : op == "Tanh" ? "tanh" : "sigmoid", {}, {}, where(node)});
    } else if (op == "Flatten") {
      if (attrInt(node, "axis", 1) != 1)
        refuse(node, "axis " + std::to_string(attrInt(node, "axis", 1)) +
                         ": tandem flattens each sample (axis 1) only");
      flatten(node);
    } else if (op == "Reshape") {
      reshape(node);
    } else if (op == "Dropout") {
      double p = attrFloat(node, "ratio", 0.5);
      if (node.input_size() > 1 && !node.input(1).empty()) p = scalar(node, node.input(1));
      add({"dropout", {{"p", p}}, {}, where(node)});
    } else if (op == "LayerNormalization") {
      layerNorm(node);
    } else if (op == "Pad") {
      pad(node);
    } else if (op == "Identity") {
    } else if (op == "Softmax" || op == "LogSoftmax") {
      if (!isOutput(node.output(0)) || !live(node.output(0)).empty())
        refuse(node, "a softmax only at the output is dropped; this one is not");
      // Over the last axis only: before opset 13 the axis (default 1) splits the tensor in
      // two and normalises all that follows, which is the last axis for [N, C] alone.
      const int64_t rank = shape_.rank() + 1;
      int64_t axis = attrInt(node, "axis", opset() >= 13 ? -1 : 1);
      if (axis < 0) axis += rank;
      if (axis != rank - 1)
        refuse(node, "a softmax over other than the last axis is not supported");
      out_.output = op == "Softmax" ? "softmax" : "log_softmax";
      out_.notes.push_back("dropped " + op + " node '" + node.name() +
                           "' at the output: tandem's loss applies it in training, serving "
                           "applies it to the answers");
    } else {
      refuse(node, "tandem has no layer for this operator");
    }
    return node.output(0);
  }

  // A scalar constant's value (float, double or integer), if `name` is one.
  std::optional<double> constScalar(const std::string& name) const {
    const auto it = constants_.find(name);
    if (it == constants_.end()) return std::nullopt;
    const onnx::TensorProto& t = *it->second;
    int64_t count = 1;
    for (int64_t d : t.dims()) count *= d;
    if (count != 1) return std::nullopt;
    const std::string& raw = t.raw_data();
    switch (t.data_type()) {
      case onnx::TensorProto::FLOAT: {
        float f;
        if (raw.size() == 4) return (std::memcpy(&f, raw.data(), 4), double(f));
        if (t.float_data_size() == 1) return t.float_data(0);
        return std::nullopt;
      }
      case onnx::TensorProto::DOUBLE: {
        double d;
        if (raw.size() == 8) return (std::memcpy(&d, raw.data(), 8), d);
        if (t.double_data_size() == 1) return t.double_data(0);
        return std::nullopt;
      }
      case onnx::TensorProto::INT64: {
        int64_t k;
        if (raw.size() == 8) return (std::memcpy(&k, raw.data(), 8), double(k));
        if (t.int64_data_size() == 1) return double(t.int64_data(0));
        return std::nullopt;
      }
      default:
        return std::nullopt;
    }
  }

  // A two-input node `op` of `v` and a scalar constant near `want` (either order when
  // `commutes`).
  bool withScalar(const onnx::NodeProto& n, const std::string& op, const std::string& v,
                  double want, bool commutes) const {
    if (n.op_type() != op || n.input_size() != 2) return false;
    std::optional<double> c;
    if (n.input(0) == v) c = constScalar(n.input(1));
    if (!c && commutes && n.input(1) == v) c = constScalar(n.input(0));
    return c && std::fabs(*c - want) <= 1e-6 * std::fabs(want);
  }

  // The node that reads both a and b, when it is `op` and the only reader of each.
  static bool reads(const onnx::NodeProto& n, const std::string& a, const std::string& b) {
    return n.input_size() == 2 &&
           ((n.input(0) == a && n.input(1) == b) || (n.input(0) == b && n.input(1) == a));
  }

  // GELU as PyTorch exports it: x * (1 + erf(x / sqrt(2))) * 0.5 — Div (or Mul by
  // 1/sqrt(2)), Erf, Add 1, then Mul by x and by 0.5 in either order.
  std::optional<std::string> gelu(const std::string& v, const std::vector<int>& next) {
    if (next.size() != 2) return std::nullopt;
    for (int a = 0; a < 2; ++a) {
      const int d = next[a], m = next[1 - a];
      if (!withScalar(node(d), "Div", v, std::sqrt(2.0), false) &&
          !withScalar(node(d), "Mul", v, std::sqrt(0.5), true))
        continue;
      const int e = only(node(d).output(0), "Erf");
      if (e < 0) continue;
      const int one = only(node(e).output(0), "Add");
      if (one < 0 || !withScalar(node(one), "Add", node(e).output(0), 1.0, true)) continue;
      const std::string& erf1 = node(one).output(0);
      int h = -1;
      if (node(m).op_type() == "Mul" && reads(node(m), v, erf1)) {  // (x * (1 + erf)) * 0.5
        h = only(node(m).output(0), "Mul");
        if (h >= 0 && !withScalar(node(h), "Mul", node(m).output(0), 0.5, true)) h = -1;
      } else if (withScalar(node(m), "Mul", v, 0.5, true)) {  // (x * 0.5) * (1 + erf)
        h = only(node(m).output(0), "Mul");
        if (h >= 0 && (only(erf1, "Mul") != h || !reads(node(h), node(m).output(0), erf1))) h = -1;
      }
      if (h < 0) continue;
      take({d, e, one, m, h});
      add({"gelu", {}, {}, where(node(h))});
      return node(h).output(0);
    }
    return std::nullopt;
  }

  // The axes of a ReduceMean (attribute, or input from opset 18) are the last one alone.
  bool lastAxis(const onnx::NodeProto& n) const {
    std::vector<int64_t> axes = attrInts(n, "axes");
    if (axes.empty() && n.input_size() > 1) {
      const auto c = constScalar(n.input(1));
      if (c) axes = {static_cast<int64_t>(*c)};
    }
    const int64_t rank = shape_.rank() + 1;
    return axes.size() == 1 && (axes[0] == -1 || axes[0] == rank - 1) &&
           attrInt(n, "keepdims", 1) == 1;
  }

  // A per-feature constant [dim] (or a scalar, broadcast) read by `n` beside `v`.
  std::optional<HostTensor> feature(const onnx::NodeProto& n, const std::string& v, int64_t dim) {
    if (n.input_size() != 2) return std::nullopt;
    const std::string& c = n.input(0) == v ? n.input(1) : n.input(0);
    if (!constants_.count(c) || (n.input(0) != v && n.input(1) != v)) return std::nullopt;
    HostTensor t = tensor(n, c);
    if (t.data.size() == 1) t.data.assign(static_cast<size_t>(dim), t.data[0]);
    if (t.data.size() != static_cast<size_t>(dim)) return std::nullopt;
    t.shape = Shape{dim};
    return t;
  }

  // LayerNorm over the last dimension as exporters before opset 17 write it:
  // d = x - ReduceMean(x); d / Sqrt(ReduceMean(Pow(d, 2)) + eps), then Mul by the scale
  // and Add of the bias when the model has them.
  std::optional<std::string> layerNormPattern(const std::string& v, const std::vector<int>& next) {
    if (next.size() != 2) return std::nullopt;
    for (int a = 0; a < 2; ++a) {
      const int r1 = next[a], s = next[1 - a];
      if (node(r1).op_type() != "ReduceMean" || node(r1).input(0) != v || !lastAxis(node(r1)))
        continue;
      if (node(s).op_type() != "Sub" || node(s).input_size() != 2 || node(s).input(0) != v ||
          node(s).input(1) != node(r1).output(0) || live(node(r1).output(0)).size() != 1)
        continue;
      const std::string& d = node(s).output(0);
      const std::vector<int> uses = live(d);
      if (uses.size() != 2 || isOutput(d)) continue;
      const int p = node(uses[0]).op_type() == "Pow" ? uses[0] : uses[1];
      const int div = p == uses[0] ? uses[1] : uses[0];
      if (!withScalar(node(p), "Pow", d, 2.0, false)) continue;
      const int r2 = only(node(p).output(0), "ReduceMean");
      if (r2 < 0 || !lastAxis(node(r2))) continue;
      const int e = only(node(r2).output(0), "Add");
      if (e < 0) continue;
      const onnx::NodeProto& eps_node = node(e);
      const std::string& var = node(r2).output(0);
      const std::optional<double> eps =
          constScalar(eps_node.input(0) == var ? eps_node.input(1) : eps_node.input(0));
      if (!eps || *eps <= 0) continue;
      const int q = only(eps_node.output(0), "Sqrt");
      if (q < 0 || only(node(q).output(0), "Div") != div || node(div).input(0) != d ||
          node(div).input(1) != node(q).output(0))
        continue;
      const int64_t dim = shape_[shape_.rank() - 1];
      take({r1, s, p, r2, e, q, div});
      std::string end = node(div).output(0);
      const onnx::NodeProto* last = &node(div);
      HostTensor gamma{"", Shape{dim}, std::vector<float>(static_cast<size_t>(dim), 1.0f)};
      HostTensor beta{"", Shape{dim}, std::vector<float>(static_cast<size_t>(dim), 0.0f)};
      if (const int mul = only(end, "Mul"); mul >= 0)
        if (auto g = feature(node(mul), end, dim)) {
          gamma = std::move(*g);
          take({mul});
          end = node(mul).output(0);
          last = &node(mul);
        }
      if (const int plus = only(end, "Add"); plus >= 0)
        if (auto b = feature(node(plus), end, dim)) {
          beta = std::move(*b);
          take({plus});
          end = node(plus).output(0);
          last = &node(plus);
        }
      add({"layernorm", {{"eps", *eps}}, {}, where(*last)}, {std::move(gamma), std::move(beta)});
      return end;
    }
    return std::nullopt;
  }

  // LayerNormalization (opset 17) over the last dimension.
  void layerNorm(const onnx::NodeProto& node) {
    const int64_t rank = shape_.rank() + 1;
    int64_t axis = attrInt(node, "axis", -1);
    if (axis < 0) axis += rank;
    if (axis != rank - 1)
      refuse(node, "axis " + std::to_string(attrInt(node, "axis", -1)) +
                       " normalizes more than the last dimension: tandem's layernorm "
                       "normalizes the last one");
    const int64_t dim = shape_[shape_.rank() - 1];
    if (node.input_size() < 2) refuse(node, "it has no scale input");
    HostTensor gamma = tensor(node, node.input(1));
    HostTensor beta{"", Shape{dim}, std::vector<float>(static_cast<size_t>(dim), 0.0f)};
    if (node.input_size() > 2 && !node.input(2).empty()) beta = tensor(node, node.input(2));
    if (gamma.data.size() != static_cast<size_t>(dim) ||
        beta.data.size() != static_cast<size_t>(dim))
      refuse(node, "its scale and bias must have " + std::to_string(dim) + " values");
    gamma.shape = beta.shape = Shape{dim};
    add({"layernorm", {{"eps", attrFloat(node, "epsilon", 1e-5)}}, {}, where(node)},
        {std::move(gamma), std::move(beta)});
  }

  // Gather of the input's integer ids from an initializer table: an embedding.
  std::string gather(const onnx::NodeProto& node, const std::string& v) {
    if (!ids_ || node.input_size() != 2 || node.input(1) != v)
      refuse(node,
             "only a Gather of the model's integer input ids from an initializer (an "
             "embedding) is supported");
    if (attrInt(node, "axis", 0) != 0) refuse(node, "only a Gather along axis 0 is supported");
    if (shape_.rank() != 1)
      refuse(node, "its ids are " + shape_.str() + " per sample; an embedding takes [T]");
    HostTensor table = tensor(node, node.input(0));
    if (table.shape.rank() != 2) refuse(node, "its table is " + table.shape.str() + ", not 2-d");
    const int64_t vocab = table.shape[0], dim = table.shape[1];
    add({"embedding", {{"vocab", vocab}, {"dim", dim}}, {}, where(node)}, {std::move(table)});
    shape_ = Shape{shape_[0], dim};
    checkSize(node, shape_);
    ids_ = false;
    return node.output(0);
  }

  // --- transformer layers ----------------------------------------------------------

  // A bool constant's values (raw bytes or int32_data), if `name` is one of `count`.
  std::optional<std::vector<bool>> constBools(const std::string& name, int64_t count) const {
    const auto it = constants_.find(name);
    if (it == constants_.end() || it->second->data_type() != onnx::TensorProto::BOOL)
      return std::nullopt;
    const onnx::TensorProto& t = *it->second;
    std::vector<bool> out;
    if (!t.raw_data().empty()) {
      if (static_cast<int64_t>(t.raw_data().size()) != count) return std::nullopt;
      for (char c : t.raw_data()) out.push_back(c != 0);
    } else {
      if (t.int32_data_size() != count) return std::nullopt;
      for (int32_t b : t.int32_data()) out.push_back(b != 0);
    }
    return out;
  }

  // The node of `op` that is the only reader of `value`, or a refusal naming what the
  // attention pattern expected there.
  int expect(const std::string& value, const std::string& op, const onnx::NodeProto& from) {
    const int i = only(value, op);
    if (i < 0)
      refuse(from,
             "in an attention pattern its output '" + value + "' must go to one " + op + " alone");
    return i;
  }

  void expectPerm(const onnx::NodeProto& n, const std::vector<int64_t>& perm) const {
    if (attrInts(n, "perm") == perm) return;
    std::string list;
    for (int64_t k : perm) list += (list.empty() ? "" : ", ") + std::to_string(k);
    refuse(n, "in an attention pattern its perm must be (" + list + ")");
  }

  // The out-projection or qkv MatMul with a weight initializer [in, out] and the Add of a
  // bias [out] after it: (weight [out, in], bias, the value made); nullopt if it is not.
  std::optional<std::tuple<HostTensor, HostTensor, std::string, int>> projected(int mm,
                                                                                int64_t in) {
    const onnx::NodeProto& m = node(mm);
    if (m.op_type() != "MatMul" || m.input_size() != 2 || !constants_.count(m.input(1)))
      return std::nullopt;
    const auto w = constants_.at(m.input(1));
    if (w->dims_size() != 2 || w->dims(0) != in) return std::nullopt;
    const int add = only(m.output(0), "Add");
    if (add < 0) return std::nullopt;
    const onnx::NodeProto& a = node(add);
    const std::string& b = a.input(0) == m.output(0) ? a.input(1) : a.input(0);
    if (!constants_.count(b)) return std::nullopt;
    HostTensor weight = transposed(tensor(m, m.input(1)));
    HostTensor bias = tensor(a, b);
    if (static_cast<int64_t>(bias.data.size()) != weight.shape[0])
      refuse(a, "its bias has " + std::to_string(bias.data.size()) + " values for " +
                    std::to_string(weight.shape[0]) + " outputs");
    bias.shape = Shape{weight.shape[0]};
    return std::tuple{std::move(weight), std::move(bias), a.output(0), add};
  }

  // Multi-head self-attention as PyTorch exports a module written out (and as tandem
  // exports it): x Wqkv + b, Reshape [N, T, 3, H, hs], Transpose (2, 0, 3, 1, 4), Gather
  // 0, 1, 2 on axis 0 (q, k, v), MatMul q by k Transposed (0, 1, 3, 2), Div by sqrt(hs)
  // (or Mul by its inverse), for a causal one Where(mask above the diagonal, -inf,
  // scores), Softmax on the last axis, MatMul by v, Transpose (0, 2, 1, 3), Reshape
  // [N, T, D], then x Wo + b. Not one: nullopt (a MatMul goes on as linear). Once the
  // Reshape to heads is seen, anything else is refused naming the node.
  std::optional<std::string> attention(const std::string& v, int mm) {
    if (shape_.rank() != 2) return std::nullopt;
    const int64_t t = shape_[0], d = shape_[1];
    const onnx::NodeProto& first = node(mm);
    if (first.op_type() != "MatMul" || first.input(0) != v) return std::nullopt;
    const auto qkv = projected(mm, d);
    if (!qkv || std::get<0>(*qkv).shape[0] != 3 * d) return std::nullopt;
    const int rs = only(std::get<2>(*qkv), "Reshape");
    if (rs < 0) return std::nullopt;
    const onnx::NodeProto& split = node(rs);
    if (split.input_size() != 2 || !constants_.count(split.input(1))) return std::nullopt;
    const std::vector<int64_t> to = int64s(split, split.input(1));
    if (to.size() != 5 || to[2] != 3 || to[3] <= 0 || to[3] * to[4] != d ||
        !(to[1] == 0 || to[1] == t))
      return std::nullopt;
    const int64_t heads = to[3], hs = to[4];
    std::vector<int> taken{mm, std::get<3>(*qkv), rs};
    const int tp = expect(split.output(0), "Transpose", split);
    expectPerm(node(tp), {2, 0, 3, 1, 4});
    taken.push_back(tp);
    const std::string& all = node(tp).output(0);
    std::string part[3];
    const std::vector<int> gathers = live(all);
    if (gathers.size() != 3 || isOutput(all))
      refuse(node(tp), "in an attention pattern its output goes to three Gathers (q, k, v)");
    for (int g : gathers) {
      const onnx::NodeProto& n = node(g);
      std::vector<int64_t> index;
      if (n.op_type() == "Gather" && n.input_size() == 2 && n.input(0) == all &&
          constants_.count(n.input(1)))
        index = int64s(n, n.input(1));
      if (index.size() != 1 || index[0] < 0 || index[0] > 2 || attrInt(n, "axis", 0) != 0 ||
          !part[index[0]].empty())
        refuse(n, "in an attention pattern q, k and v are Gathers of index 0, 1 and 2 on axis 0");
      part[index[0]] = n.output(0);
      taken.push_back(g);
    }
    const int kt = expect(part[1], "Transpose", node(gathers[1]));
    expectPerm(node(kt), {0, 1, 3, 2});
    const int qk = expect(part[0], "MatMul", node(gathers[0]));
    if (node(qk).input(0) != part[0] || node(qk).input(1) != node(kt).output(0) ||
        only(node(kt).output(0), "MatMul") != qk)
      refuse(node(qk), "in an attention pattern it multiplies q by k transposed");
    taken.insert(taken.end(), {kt, qk});
    const std::vector<int> after = live(node(qk).output(0));
    const double root = std::sqrt(static_cast<double>(hs));
    if (after.size() != 1 || isOutput(node(qk).output(0)) ||
        !(withScalar(node(after[0]), "Div", node(qk).output(0), root, false) ||
          withScalar(node(after[0]), "Mul", node(qk).output(0), 1.0 / root, true)))
      refuse(node(qk), "in an attention pattern the scores go to one Div by sqrt(" +
                           std::to_string(hs) + ") (or Mul by its inverse)");
    taken.push_back(after[0]);
    std::string scores = node(after[0]).output(0);
    bool causal = false;
    if (const int w = only(scores, "Where"); w >= 0) {
      const onnx::NodeProto& n = node(w);
      const auto mask = n.input_size() == 3 ? constBools(n.input(0), t * t) : std::nullopt;
      const double fill = n.input_size() == 3 ? constScalar(n.input(1)).value_or(0.0) : 0.0;
      bool is_causal = mask.has_value() && n.input(2) == scores;
      for (int64_t i = 0; is_causal && i < t; ++i)
        for (int64_t j = 0; j < t; ++j)
          if ((*mask)[static_cast<size_t>(i * t + j)] != (j > i)) is_causal = false;
      if (!is_causal || !(std::isinf(fill) && fill < 0))
        refuse(n, "in an attention pattern a Where is the causal mask: Where(mask [" +
                      std::to_string(t) + ", " + std::to_string(t) +
                      "] true above the diagonal, -inf, scores)");
      causal = true;
      scores = n.output(0);
      taken.push_back(w);
    }
    const int sm = expect(scores, "Softmax", node(taken.back()));
    const int64_t axis = attrInt(node(sm), "axis", -1);
    if (axis != -1 && axis != 3) refuse(node(sm), "in an attention pattern it is over the keys");
    const int pv = expect(node(sm).output(0), "MatMul", node(sm));
    if (node(pv).input(0) != node(sm).output(0) || node(pv).input(1) != part[2] ||
        only(part[2], "MatMul") != pv)
      refuse(node(pv), "in an attention pattern it multiplies the probabilities by v");
    const int back = expect(node(pv).output(0), "Transpose", node(pv));
    expectPerm(node(back), {0, 2, 1, 3});
    const int join = expect(node(back).output(0), "Reshape", node(back));
    const std::vector<int64_t> merged = node(join).input_size() == 2
                                            ? int64s(node(join), node(join).input(1))
                                            : std::vector<int64_t>{};
    if (merged.size() != 3 || merged[2] != d || !(merged[1] == 0 || merged[1] == t))
      refuse(node(join), "in an attention pattern it joins the heads to [N, " + std::to_string(t) +
                             ", " + std::to_string(d) + "]");
    taken.insert(taken.end(), {sm, pv, back, join});
    const std::vector<int> out_readers = live(node(join).output(0));
    const auto out = out_readers.size() == 1 && !isOutput(node(join).output(0))
                         ? projected(out_readers[0], d)
                         : std::nullopt;
    if (!out || std::get<0>(*out).shape[0] != d)
      refuse(node(join),
             "in an attention pattern the heads go to the output projection: a "
             "MatMul by a [" +
                 std::to_string(d) + ", " + std::to_string(d) +
                 "] initializer and the Add of a bias");
    taken.insert(taken.end(), {out_readers[0], std::get<3>(*out)});
    for (int i : taken) take({i});
    std::map<std::string, AttrValue> attrs{{"heads", heads}};
    if (!causal) attrs["causal"] = std::string("false");
    add({"attention", attrs, {}, where(first)},
        {std::move(std::get<0>(*qkv)), std::move(std::get<1>(*qkv)), std::move(std::get<0>(*out)),
         std::move(std::get<1>(*out))});
    return std::get<2>(*out);
  }

  // A learned positional embedding, y = x + P[:T]: an Add of x [T, D] and either an
  // initializer [T, D] (PyTorch folds the slice of a table) or a Slice of rows [0, T) of
  // an initializer table [C, D]. Else nullopt.
  std::optional<std::string> positional(const std::string& v, int i) {
    const onnx::NodeProto& a = node(i);
    if (a.op_type() != "Add" || a.input_size() != 2 || shape_.rank() != 2 || ids_)
      return std::nullopt;
    const int64_t t = shape_[0], d = shape_[1];
    const std::string& other = a.input(0) == v ? a.input(1) : a.input(0);
    auto rowsOf = [&](const onnx::TensorProto& p) {
      return p.dims_size() == 2 && p.dims(1) == d ? p.dims(0) : int64_t{-1};
    };
    std::optional<HostTensor> table;
    int slice = -1;
    if (const auto c = constants_.find(other); c != constants_.end()) {
      if (rowsOf(*c->second) != t) return std::nullopt;
      table = tensor(a, other);
    } else if (const auto p = producer_.find(other); p != producer_.end()) {
      const onnx::NodeProto& s = node(p->second);
      if (s.op_type() != "Slice" || s.input_size() < 3 || !constants_.count(s.input(0)) ||
          live(other).size() != 1)
        return std::nullopt;
      const int64_t rows = rowsOf(*constants_.at(s.input(0)));
      const std::vector<int64_t> starts = int64s(s, s.input(1)), ends = int64s(s, s.input(2));
      const std::vector<int64_t> axes = s.input_size() > 3 && !s.input(3).empty()
                                            ? int64s(s, s.input(3))
                                            : std::vector<int64_t>{0};
      const std::vector<int64_t> steps = s.input_size() > 4 && !s.input(4).empty()
                                             ? int64s(s, s.input(4))
                                             : std::vector<int64_t>{1};
      if (rows < t || starts != std::vector<int64_t>{0} || axes != std::vector<int64_t>{0} ||
          steps != std::vector<int64_t>{1} || ends.size() != 1 || std::min(ends[0], rows) != t)
        return std::nullopt;
      table = tensor(s, s.input(0));
      slice = p->second;
    } else {
      return std::nullopt;
    }
    take({i});
    if (slice >= 0) take({slice});
    add({"positional", {{"context", table->shape[0]}}, {}, where(a)}, {std::move(*table)});
    return a.output(0);
  }

  // Two residual blocks that are a transformer block's — [layernorm, attention (causal)]
  // then [layernorm, linear D->M, gelu, linear M->D], with default eps and biases — become
  // one `transformer` layer (one cut point, as written in a spec); the parameters keep
  // their order.
  static void mergeTransformers(std::vector<LayerSpec>& layers) {
    auto plainNorm = [](const LayerSpec& s) {
      if (s.type != "layernorm") return false;
      const auto e = s.attrs.find("eps");
      return e == s.attrs.end() || static_cast<float>(std::get<double>(e->second)) == 1e-5f;
    };
    auto linearOf = [](const LayerSpec& s) -> std::pair<int64_t, int64_t> {
      if (s.type != "linear" || s.attrs.count("bias")) return {-1, -1};
      return {std::get<int64_t>(s.attrs.at("in")), std::get<int64_t>(s.attrs.at("out"))};
    };
    for (size_t i = 0; i + 1 < layers.size(); ++i) {
      const LayerSpec& a = layers[i];
      const LayerSpec& m = layers[i + 1];
      if (a.type != "residual" || m.type != "residual" || a.children.size() != 2 ||
          m.children.size() != 4 || !plainNorm(a.children[0]) || !plainNorm(m.children[0]) ||
          a.children[1].type != "attention" || a.children[1].attrs.count("causal") ||
          m.children[2].type != "gelu")
        continue;
      const auto [in1, hidden] = linearOf(m.children[1]);
      const auto [in2, out2] = linearOf(m.children[3]);
      if (in1 < 0 || in2 != hidden || out2 != in1) continue;
      LayerSpec block{"transformer", {{"heads", a.children[1].attrs.at("heads")}}, {}, a.where};
      if (hidden != 4 * in1) block.attrs["mlp"] = hidden;  // (4 D is the default)
      layers[i] = std::move(block);
      layers.erase(layers.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    }
  }

  // An Add of two computed values, one of them `v`: a residual block's join.
  bool sum(int i) const {
    const onnx::NodeProto& n = node(i);
    return n.op_type() == "Add" && n.input_size() == 2 && !constants_.count(n.input(0)) &&
           !constants_.count(n.input(1)) && n.input(0) != n.input(1);
  }
  // How many of `next` (the readers of `v`) are such Adds.
  int sums(const std::string& v, const std::vector<int>& next) const {
    int n = 0;
    for (int i : next) n += sum(i) && (node(i).input(0) == v || node(i).input(1) == v);
    return n;
  }

  // y = body(v) + shortcut: the node pair that reads `v` is the body's first node and
  // either the Add (identity shortcut) or a projection whose only reader is the Add; or,
  // when the body begins with a pattern of several nodes reading `v` (a LayerNorm as
  // exporters before opset 17 write it, in a pre-norm block), those and the one Add.
  std::string residual(const std::string& v, const std::vector<int>& next) {
    // The shortcut: an Add of v and a computed value (identity); else a Conv / Gemm /
    // MatMul of v whose only reader is such an Add — the one shaped like tandem's
    // projection first, when both readers could be it (a one-node body).
    struct Choice {
      int body, join, proj;
    };
    std::optional<Choice> pick;
    if (next.size() > 2) {
      for (int i : next)
        if (sum(i) && (node(i).input(0) == v || node(i).input(1) == v)) pick = Choice{-1, i, -1};
    }
    for (int a = 0; a < 2 && !pick && next.size() == 2; ++a)
      if (sum(next[1 - a])) pick = Choice{next[a], next[1 - a], -1};
    for (const bool strict : {true, false})
      for (int a = 0; a < 2 && !pick && next.size() == 2; ++a) {
        const onnx::NodeProto& o = node(next[1 - a]);
        if ((o.op_type() != "Conv" && o.op_type() != "Gemm" && o.op_type() != "MatMul") ||
            o.input(0) != v || (strict && !projectionLike(o)))
          continue;
        const int join = only(o.output(0), "Add");
        if (join >= 0 && sum(join)) pick = Choice{next[a], join, next[1 - a]};
      }
    if (pick && pick->join != pick->body) {
      const int join = pick->join, proj = pick->proj;
      const std::string shortcut = proj >= 0 ? node(proj).output(0) : v;
      take({join});
      if (proj >= 0) take({proj});
      const Shape in = shape_;
      std::vector<LayerSpec>* outer = layers_;
      LayerSpec block{"residual", {}, {}, where(node(join))};
      layers_ = &block.children;
      const std::string u = walk(v);
      layers_ = outer;
      const onnx::NodeProto& j = node(join);
      if (!reads(j, u, shortcut))
        refuse(j, "it adds '" + j.input(0) + "' and '" + j.input(1) +
                      "', not the end of the "
                      "branch from '" +
                      v + "' ('" + u + "') and its shortcut '" + shortcut + "'");
      if (block.children.empty()) refuse(j, "its branch has no layer");
      if (proj >= 0) {
        projection(node(proj), in);
      } else if (shape_ != in) {
        refuse(j, "it adds the branch's " + shape_.str() + " to the unchanged input's " + in.str());
      }
      layers_->push_back(std::move(block));
      return j.output(0);
    }
    refuse(node(next[1]), "'" + v +
                              "' is read by two nodes that are not a residual block (a "
                              "branch and an Add of it to '" +
                              v + "' or to a projection of it)");
  }

  // A 1x1 Conv with no bias, or a Gemm / MatMul with none: what tandem's projection is.
  bool projectionLike(const onnx::NodeProto& n) const {
    if (n.op_type() == "Conv") {
      const auto w = n.input_size() == 2 ? constants_.find(n.input(1)) : constants_.end();
      return w != constants_.end() && w->second->dims_size() == 4 && w->second->dims(2) == 1 &&
             w->second->dims(3) == 1;
    }
    return (n.op_type() == "Gemm" && n.input_size() == 2) || n.op_type() == "MatMul";
  }

  // A residual block's shortcut projection: tandem makes a 1x1 convolution with no bias
  // whose stride maps the input's H and W to the body's, or a linear layer with no bias;
  // anything else is refused. Its weight follows the body's parameters.
  void projection(const onnx::NodeProto& p, const Shape& in) {
    const Shape out = shape_;
    if (in == out)
      refuse(p, "the branch keeps the input's shape " + in.str() +
                    ": tandem's residual then adds the input unprojected");
    std::vector<LayerSpec> made;
    std::vector<LayerSpec>* outer = layers_;
    layers_ = &made;
    shape_ = in;
    if (p.op_type() == "Conv")
      conv(p);
    else if (p.op_type() == "Gemm")
      gemm(p);
    else
      matmul(p);
    layers_ = outer;
    const LayerSpec& s = made.at(0);
    const auto no_bias = s.attrs.find("bias");
    const int64_t stride = in.rank() == 3 && out.rank() == 3 && out[1] > 0 ? in[1] / out[1] : 1;
    const bool ok = no_bias != s.attrs.end() && shape_ == out &&
                    (s.type == "linear" ||
                     (s.attrs.at("kernel") == AttrValue(std::vector<int64_t>{1, 1}) &&
                      s.attrs.at("stride") == AttrValue(std::vector<int64_t>{stride, stride}) &&
                      s.attrs.at("padding") == AttrValue(std::vector<int64_t>{0, 0})));
    if (!ok)
      refuse(p,
             "a shortcut projection must be what tandem's residual makes: a 1x1 convolution "
             "with stride " +
                 std::to_string(stride) +
                 ", no padding and no bias (or a "
                 "linear layer with no bias) mapping " +
                 in.str() + " to " + out.str());
    shape_ = out;
  }

  // "node 'conv1'", or for an unnamed node (PyTorch's exporter leaves them unnamed) "the
  // node making 'y'".
  static std::string named(const onnx::NodeProto& node) {
    if (!node.name().empty()) return "node '" + node.name() + "'";
    return "the node making '" + (node.output_size() ? node.output(0) : std::string()) + "'";
  }

  [[noreturn]] void refuse(const onnx::NodeProto& node, const std::string& why) const {
    throw InvalidArgument(source_ + ": " + named(node) + " (" + node.op_type() + "): " + why);
  }

  std::string where(const onnx::NodeProto& node) const { return source_ + ": " + named(node); }

  void findInput(const onnx::GraphProto& g) {
    const onnx::ValueInfoProto* in = nullptr;
    for (const onnx::ValueInfoProto& v : g.input()) {
      if (constants_.count(v.name())) continue;
      if (in)
        throw InvalidArgument(source_ + ": the graph has two data inputs, '" + in->name() +
                              "' and '" + v.name() + "': tandem's models take one");
      in = &v;
    }
    if (!in) throw InvalidArgument(source_ + ": the graph has no data input");
    const auto& t = in->type().tensor_type();
    ids_ = t.elem_type() == onnx::TensorProto::INT64 || t.elem_type() == onnx::TensorProto::INT32;
    if (t.elem_type() != onnx::TensorProto::FLOAT && !ids_)
      throw InvalidArgument(source_ + ": input '" + in->name() +
                            "' is neither float32 nor integer ids (int64, int32)");
    const auto& s = t.shape();
    if (s.dim_size() < 2)
      throw InvalidArgument(source_ + ": input '" + in->name() +
                            "' must be a batch of samples: [N, ...]");
    std::vector<int64_t> dims;
    for (int k = 1; k < s.dim_size(); ++k) {
      if (!s.dim(k).has_dim_value() || s.dim(k).dim_value() <= 0)
        throw InvalidArgument(source_ + ": input '" + in->name() + "' dimension " +
                              std::to_string(k) +
                              " is not fixed: tandem needs each sample's shape");
      dims.push_back(s.dim(k).dim_value());
    }
    if (dims.size() > 3)
      throw InvalidArgument(source_ + ": input '" + in->name() + "' has samples of rank " +
                            std::to_string(dims.size()) + " (tandem: at most 3)");
    int64_t n = 1;
    for (int64_t d : dims)
      if (d > kMaxDim || __builtin_mul_overflow(n, d, &n) || n > kMaxValues)
        throw InvalidArgument(source_ + ": input '" + in->name() +
                              "' has samples of over 2^32 values, or a dimension over 2^30");
    shape_ = Shape(dims);
    out_.spec.input = shape_;
    value_ = in->name();
  }

  void constant(const onnx::NodeProto& node) {
    for (const onnx::AttributeProto& a : node.attribute())
      if (a.name() == "value" && a.has_t()) {
        owned_.push_back(a.t());
        constants_[node.output(0)] = &owned_.back();
        return;
      }
    refuse(node, "only a Constant holding a tensor ('value') is supported");
  }

  const onnx::AttributeProto* attr(const onnx::NodeProto& node, const std::string& name) const {
    for (const onnx::AttributeProto& a : node.attribute())
      if (a.name() == name) return &a;
    return nullptr;
  }
  int64_t attrInt(const onnx::NodeProto& node, const std::string& name, int64_t fallback) const {
    const auto* a = attr(node, name);
    return a ? a->i() : fallback;
  }
  double attrFloat(const onnx::NodeProto& node, const std::string& name, double fallback) const {
    const auto* a = attr(node, name);
    return a ? a->f() : fallback;
  }
  std::vector<int64_t> attrInts(const onnx::NodeProto& node, const std::string& name) const {
    const auto* a = attr(node, name);
    return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : std::vector<int64_t>{};
  }

  // An initializer's values as float32, its dims checked against its data.
  HostTensor tensor(const onnx::NodeProto& node, const std::string& name) const {
    const auto it = constants_.find(name);
    if (it == constants_.end()) refuse(node, "input '" + name + "' is not an initializer");
    const onnx::TensorProto& t = *it->second;
    HostTensor h;
    h.name = name;
    std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
    int64_t count = 1;
    for (int64_t d : dims) {
      if (d < 0 || (d > 0 && count > kMaxValues / d))
        throw FormatError(source_ + ": initializer '" + name + "' declares dims of more than " +
                          std::to_string(kMaxValues) + " values");
      count *= d;
    }
    if (t.data_type() != onnx::TensorProto::FLOAT)
      refuse(node, "initializer '" + name + "' is not float32");
    if (t.has_data_location() && t.data_location() == onnx::TensorProto::EXTERNAL)
      refuse(node, "initializer '" + name + "' is stored outside the file: not supported");
    const auto want = static_cast<size_t>(count);
    if (!t.raw_data().empty()) {
      if (t.raw_data().size() != want * 4)
        throw FormatError(source_ + ": initializer '" + name + "' has " +
                          std::to_string(t.raw_data().size()) + " bytes of data for " +
                          std::to_string(count) + " float32 values");
      h.data.resize(want);
      std::memcpy(h.data.data(), t.raw_data().data(), want * 4);  // little-endian, as ONNX's
    } else {
      if (static_cast<size_t>(t.float_data_size()) != want)
        throw FormatError(source_ + ": initializer '" + name + "' has " +
                          std::to_string(t.float_data_size()) + " values for dims of " +
                          std::to_string(count));
      h.data.assign(t.float_data().begin(), t.float_data().end());
    }
    h.shape = dims.empty() ? Shape{1} : Shape(dims);
    return h;
  }

  double scalar(const onnx::NodeProto& node, const std::string& name) const {
    const HostTensor t = tensor(node, name);
    if (t.data.size() != 1) refuse(node, "'" + name + "' must be a scalar");
    return t.data[0];
  }

  void add(LayerSpec spec, std::vector<HostTensor> params = {}) {
    layers_->push_back(std::move(spec));
    for (HostTensor& p : params) out_.params.push_back(std::move(p));
  }

  void requireRank(const onnx::NodeProto& node, int rank) const {
    if (shape_.rank() != rank)
      refuse(node, "its input has samples of shape " + shape_.str() + ", expected rank " +
                       std::to_string(rank));
  }

  // linear (over the last dimension) from a weight [out, in] and an optional bias [out].
  void linear(const onnx::NodeProto& node, HostTensor w, std::optional<HostTensor> b) {
    const int64_t out = w.shape[0], in = w.shape[1];
    if (in != shape_[shape_.rank() - 1])
      refuse(node,
             "its weight takes " + std::to_string(in) + " inputs, the chain gives " + shape_.str());
    std::map<std::string, AttrValue> attrs{{"out", out}, {"in", in}};
    std::vector<HostTensor> params{std::move(w)};
    if (b) {
      if (b->data.size() != static_cast<size_t>(out))
        refuse(node, "its bias has " + std::to_string(b->data.size()) + " values for " +
                         std::to_string(out) + " outputs");
      b->shape = Shape{out};
      params.push_back(std::move(*b));
    } else {
      attrs["bias"] = int64_t{0};
    }
    add({"linear", attrs, {}, where(node)}, std::move(params));
    shape_[shape_.rank() - 1] = out;
    checkSize(node, shape_);
  }

  static HostTensor transposed(const HostTensor& t) {
    HostTensor r = t;
    const int64_t rows = t.shape[0], cols = t.shape[1];
    r.shape = Shape{cols, rows};
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        r.data[static_cast<size_t>(j * rows + i)] = t.data[static_cast<size_t>(i * cols + j)];
    return r;
  }

  void gemm(const onnx::NodeProto& node) {
    requireRank(node, 1);
    if (attrFloat(node, "alpha", 1.0) != 1.0 || attrFloat(node, "beta", 1.0) != 1.0)
      refuse(node, "alpha and beta other than 1 are not supported");
    if (attrInt(node, "transA", 0) != 0) refuse(node, "transA is not supported");
    if (node.input_size() < 2) refuse(node, "it has no B input");
    HostTensor b = tensor(node, node.input(1));
    if (b.shape.rank() != 2) refuse(node, "B is " + b.shape.str() + ", not a matrix");
    HostTensor w = attrInt(node, "transB", 0) ? std::move(b) : transposed(b);
    std::optional<HostTensor> bias;
    if (node.input_size() > 2 && !node.input(2).empty()) bias = tensor(node, node.input(2));
    if (bias && bias->data.size() != static_cast<size_t>(w.shape[0]) && bias->data.size() == 1)
      bias->data.assign(static_cast<size_t>(w.shape[0]), bias->data[0]);  // broadcast scalar C
    linear(node, std::move(w), std::move(bias));
  }

  // MatMul with an initializer [in, out], and the Add of an initializer after it, if any:
  // the value made.
  std::string matmul(const onnx::NodeProto& node) {
    if (node.input_size() != 2) refuse(node, "expected two inputs");
    HostTensor b = tensor(node, node.input(1));
    if (b.shape.rank() != 2) refuse(node, "B is " + b.shape.str() + ", not a matrix");
    const std::string& y = node.output(0);
    if (const int next = only(y, "Add"); next >= 0) {
      const onnx::NodeProto& plus = this->node(next);
      const std::string& c = plus.input(0) == y ? plus.input(1) : plus.input(0);
      if (constants_.count(c)) {
        take({next});
        linear(node, transposed(b), tensor(plus, c));
        return plus.output(0);
      }
    }
    linear(node, transposed(b), std::nullopt);
    return y;
  }

  // Symmetric pads [top, left, bottom, right] as (h, w).
  std::pair<int64_t, int64_t> pads(const onnx::NodeProto& node) const {
    const auto* autopad = attr(node, "auto_pad");
    if (autopad && autopad->s() != "NOTSET" && autopad->s() != "VALID")
      refuse(node, "auto_pad " + autopad->s() + " is not supported (give pads)");
    const std::vector<int64_t> p = attrInts(node, "pads");
    if (p.empty()) return {0, 0};
    if (p.size() != 4 || p[0] != p[2] || p[1] != p[3])
      refuse(node, "asymmetric pads are not supported");
    return {p[0], p[1]};
  }

  std::pair<int64_t, int64_t> twoInts(const onnx::NodeProto& node, const std::string& name,
                                      int64_t fallback) const {
    const std::vector<int64_t> v = attrInts(node, name);
    if (v.empty()) return {fallback, fallback};
    if (v.size() != 2) refuse(node, "'" + name + "' must have 2 values (a 2-d operation)");
    return {v[0], v[1]};
  }

  void noDilation(const onnx::NodeProto& node) const {
    for (int64_t d : attrInts(node, "dilations"))
      if (d != 1) refuse(node, "dilations are not supported");
  }

  static std::vector<int64_t> list(std::pair<int64_t, int64_t> p) { return {p.first, p.second}; }

  void conv(const onnx::NodeProto& node) {
    requireRank(node, 3);
    noDilation(node);
    if (attrInt(node, "group", 1) != 1) refuse(node, "grouped convolution is not supported");
    HostTensor w = tensor(node, node.input(1));
    if (w.shape.rank() != 4) refuse(node, "its weight is " + w.shape.str() + ", not 4-d");
    if (w.shape[1] != shape_[0])
      refuse(node, "its weight takes " + std::to_string(w.shape[1]) +
                       " channels, the chain gives " + shape_.str());
    const auto kernel = std::make_pair(w.shape[2], w.shape[3]);
    const auto stride = twoInts(node, "strides", 1);
    const auto pad = withPadded(node, pads(node));
    std::map<std::string, AttrValue> attrs{{"out", w.shape[0]},
                                           {"in", w.shape[1]},
                                           {"kernel", list(kernel)},
                                           {"stride", list(stride)},
                                           {"padding", list(pad)}};
    std::vector<HostTensor> params{w};
    if (node.input_size() > 2 && !node.input(2).empty()) {
      HostTensor b = tensor(node, node.input(2));
      if (b.data.size() != static_cast<size_t>(w.shape[0]))
        refuse(node, "its bias has " + std::to_string(b.data.size()) + " values for " +
                         std::to_string(w.shape[0]) + " channels");
      b.shape = Shape{w.shape[0]};
      params.push_back(std::move(b));
    } else {
      attrs["bias"] = int64_t{0};
    }
    add({"conv2d", attrs, {}, where(node)}, std::move(params));
    shape_ = windowed(node, w.shape[0], kernel, stride, pad);
  }

  // The [C, H', W'] a 2-d window makes of [_, H, W], its sizes checked first: a hostile
  // file's zero stride or vast pad is refused, not divided by or overflowed.
  Shape windowed(const onnx::NodeProto& node, int64_t channels, std::pair<int64_t, int64_t> kernel,
                 std::pair<int64_t, int64_t> stride, std::pair<int64_t, int64_t> pad) {
    for (int64_t v : {kernel.first, kernel.second, stride.first, stride.second})
      if (v <= 0 || v > kMaxDim) refuse(node, "kernel sizes and strides must be in [1, 2^30]");
    for (int64_t v : {pad.first, pad.second})
      if (v < 0 || v > kMaxDim) refuse(node, "pads must be in [0, 2^30]");
    const int64_t h = shape_[1] + 2 * pad.first - kernel.first;
    const int64_t w = shape_[2] + 2 * pad.second - kernel.second;
    if (h < 0 || w < 0)
      refuse(node, "its window " + std::to_string(kernel.first) + "x" +
                       std::to_string(kernel.second) + " is larger than its padded input " +
                       shape_.str());
    Shape out{channels, h / stride.first + 1, w / stride.second + 1};
    checkSize(node, out);
    return out;
  }

  // A sample of at most kMaxValues values (the product checked for overflow).
  void checkSize(const onnx::NodeProto& node, const Shape& shape) const {
    int64_t n = 1;
    for (int k = 0; k < shape.rank(); ++k)
      if (shape[k] <= 0 || __builtin_mul_overflow(n, shape[k], &n) || n > kMaxValues)
        refuse(node, "it makes samples of " + shape.str() + ": empty, or over 2^32 values");
  }

  void pool(const onnx::NodeProto& node) {
    requireRank(node, 3);
    noDilation(node);
    if (attrInt(node, "ceil_mode", 0) != 0) refuse(node, "ceil_mode is not supported");
    if (attrInt(node, "storage_order", 0) != 0) refuse(node, "storage_order is not supported");
    const auto kernel = twoInts(node, "kernel_shape", 0);
    if (kernel.first <= 0 || kernel.second <= 0) refuse(node, "it has no 2-d kernel_shape");
    const auto stride = twoInts(node, "strides", 1);
    auto pad = pads(node);
    const bool avg = node.op_type() == "AveragePool";
    if (avg && (pad.first || pad.second) && attrInt(node, "count_include_pad", 0) == 0)
      refuse(node, "padding left out of the average (count_include_pad 0) is not supported");
    pad = withPadded(node, pad);  // a Pad's zeros before it: averaged as tandem's padding is
    if (pad.first > kernel.first / 2 || pad.second > kernel.second / 2)
      refuse(node, "pads over half the kernel are not supported");
    add({avg ? "avgpool2d" : "maxpool2d",
         {{"kernel", list(kernel)}, {"stride", list(stride)}, {"padding", list(pad)}},
         {},
         where(node)});
    shape_ = windowed(node, shape_[0], kernel, stride, pad);
  }

  // Pad (constant zeros) of H and W alike at both ends, as PyTorch's exporter writes
  // before AveragePool: all zeros is nothing; else the next node takes it as its padding.
  void pad(const onnx::NodeProto& node) {
    const auto* mode = attr(node, "mode");
    if (mode && mode->s() != "constant") refuse(node, "only constant padding is supported");
    if (node.input_size() > 2 && !node.input(2).empty() && scalar(node, node.input(2)) != 0)
      refuse(node, "only padding with zeros is supported");
    std::vector<int64_t> p = attrInts(node, "pads");  // (before opset 11)
    if (node.input_size() > 1 && !node.input(1).empty()) p = int64s(node, node.input(1));
    const size_t rank = static_cast<size_t>(shape_.rank()) + 1;
    if (p.size() != 2 * rank) refuse(node, "expected " + std::to_string(2 * rank) + " pads");
    bool zero = true;
    for (int64_t v : p) zero = zero && v == 0;
    if (zero) return;
    if (rank != 4 || p[0] || p[1] || p[4] || p[5] || p[2] != p[6] || p[3] != p[7])
      refuse(node, "only the same padding of H and W at both ends is supported");
    padded_ = &node;
    pending_pad_ = {p[2], p[3]};
  }

  // `pad` with a Pad's before it added (once), when its reader is `node`.
  std::pair<int64_t, int64_t> withPadded(const onnx::NodeProto& node,
                                         std::pair<int64_t, int64_t> pad) {
    if (!padded_) return pad;
    if (pad.first || pad.second)
      refuse(node, "padded twice (by a Pad before it, and its own pads)");
    padded_ = nullptr;
    return pending_pad_;
  }

  void flatten(const onnx::NodeProto& node) {
    if (shape_.rank() > 1) add({"flatten", {}, {}, where(node)});
    shape_ = Shape{shape_.numel()};
  }

  // A constant int64 vector (a shape, pads).
  std::vector<int64_t> int64s(const onnx::NodeProto& node, const std::string& name) const {
    const auto it = constants_.find(name);
    if (it == constants_.end()) refuse(node, "input '" + name + "' is not a constant");
    const onnx::TensorProto& t = *it->second;
    if (t.data_type() != onnx::TensorProto::INT64) refuse(node, "'" + name + "' is not int64");
    std::vector<int64_t> v(t.int64_data().begin(), t.int64_data().end());
    if (v.empty() && !t.raw_data().empty() && t.raw_data().size() % 8 == 0 &&
        t.raw_data().size() <= 64 * 8) {
      v.resize(t.raw_data().size() / 8);
      std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
    }
    return v;
  }

  void reshape(const onnx::NodeProto& node) {
    if (node.input_size() < 2) refuse(node, "it has no shape input");
    const std::vector<int64_t> to = int64s(node, node.input(1));
    const int64_t n = shape_.numel();
    const bool to_2d = to.size() == 2 && (to[0] == -1 || to[0] == 0 || to[0] >= 1) &&
                       (to[1] == n || (to[1] == -1 && to[0] != -1));
    if (!to_2d)
      refuse(node, "only a reshape of each sample to one dimension (flatten) is supported");
    flatten(node);
  }

  const onnx::ModelProto& m_;
  std::string source_;
  std::map<std::string, const onnx::TensorProto*> constants_;
  std::deque<onnx::TensorProto> owned_;                // Constant nodes' tensors (stable addresses)
  std::map<std::string, std::vector<int>> consumers_;  // value -> the nodes reading it
  std::map<std::string, int> producer_;                // value -> the node making it
  std::vector<bool> taken_;                            // per node: imported (or folded)
  ImportedModel out_;
  std::vector<LayerSpec>* layers_ = nullptr;  // where layers go: the model's or a block's
  std::string value_;                         // the graph's data input
  Shape shape_;                               // per sample, at the walk's current value
  bool ids_ = false;                          // the current value is the integer input
  const onnx::NodeProto* padded_ = nullptr;   // a Pad whose zeros the next node takes
  std::pair<int64_t, int64_t> pending_pad_;
};

}  // namespace

ImportedModel importOnnx(const onnx::ModelProto& model, const std::string& source) {
  try {
    onnx::checker::check_model(model);
  } catch (const std::exception& e) {
    throw FormatError(source + ": ONNX's checker refuses it: " + e.what());
  }
  Importer importer(model, source);
  return importer.run();
}

ImportedModel importOnnx(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw IoError("cannot open the ONNX model '" + path + "'");
  std::string data(static_cast<size_t>(in.tellg()), '\0');  // read once, straight in
  in.seekg(0);
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  if (!in) throw IoError("cannot read the ONNX model '" + path + "'");
  onnx::ModelProto model;
  if (data.empty() || !model.ParseFromString(data))
    throw FormatError(path + ": not an ONNX model (the protobuf does not parse)");
  return importOnnx(model, path);
}

ModelFile toModelFile(const ImportedModel& imported) {
  // (The backend first: the built parameters must go before it.)
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model model(imported.spec);
  model.build(be, 0);
  const std::vector<Param*>& params = model.params();
  TANDEM_CHECK_MSG(params.size() == imported.params.size(), InvalidArgument,
                   "the imported model has " << imported.params.size()
                                             << " parameter tensors, its layers " << params.size());
  ModelFile f;
  f.spec = imported.spec;
  for (size_t i = 0; i < params.size(); ++i) {
    HostTensor h = imported.params[i];
    h.name = params[i]->name;
    f.params.push_back(std::move(h));
  }
  f.metadata["imported_from"] = std::string("onnx");
  if (!imported.output.empty()) f.metadata["output"] = imported.output;
  return f;
}

}  // namespace tandem::onnx_io
