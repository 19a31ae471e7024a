#include "targets/onnx/onnx_import.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"

namespace tandem::onnx_io {

namespace {

// The largest tensor an initializer may declare (dims multiplied, checked for overflow
// before anything is allocated): 4 Gi values.
constexpr int64_t kMaxValues = int64_t{1} << 32;

class Importer {
 public:
  Importer(const onnx::ModelProto& m, std::string source) : m_(m), source_(std::move(source)) {}

  ImportedModel run() {
    const onnx::GraphProto& g = m_.graph();
    for (const onnx::TensorProto& t : g.initializer()) constants_[t.name()] = &t;
    findInput(g);
    out_.spec.name = g.name().empty() ? "onnx" : g.name();
    const int n = g.node_size();
    for (int i = 0; i < n; ++i) {
      const onnx::NodeProto& node = g.node(i);
      const std::string& op = node.op_type();
      if (op == "Constant") {
        constant(node);
        continue;
      }
      if (node.input_size() == 0 || node.input(0) != value_)
        refuse(node, "it does not continue the chain: its first input is '" +
                         (node.input_size() ? node.input(0) : std::string()) +
                         "', not the previous node's output '" + value_ + "'");
      for (int k = 1; k < node.input_size(); ++k)
        if (!node.input(k).empty() && !constants_.count(node.input(k)))
          refuse(node, "its input '" + node.input(k) +
                           "' is computed, not an initializer: a branch tandem's layer list "
                           "cannot express");
      for (int k = 1; k < node.output_size(); ++k)
        if (!node.output(k).empty() && used(node.output(k), i))
          refuse(node, "its output '" + node.output(k) + "' is used: only one output may be");
      if (op == "Gemm") {
        gemm(node);
      } else if (op == "MatMul") {
        i = matmul(node, i);
        continue;
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
      } else if (op == "Identity") {
      } else if (op == "Softmax" || op == "LogSoftmax") {
        if (i != n - 1) refuse(node, "a softmax only at the output is dropped; this one is not");
        out_.notes.push_back("dropped " + op + " node '" + node.name() +
                             "' at the output: tandem's loss applies it in training");
      } else {
        refuse(node, "tandem has no layer for this operator");
      }
      value_ = node.output(0);
    }
    if (g.output_size() != 1 || g.output(0).name() != value_)
      throw InvalidArgument(
          source_ + ": the graph's output is not the end of its chain of nodes ('" + value_ + "')");
    if (out_.spec.layers.empty())
      throw InvalidArgument(source_ + ": no layer is left once dropped nodes are removed");
    return std::move(out_);
  }

 private:
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
    if (t.elem_type() != onnx::TensorProto::FLOAT)
      throw InvalidArgument(source_ + ": input '" + in->name() + "' is not float32");
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
    shape_ = Shape(dims);
    out_.spec.input = shape_;
    value_ = in->name();
  }

  bool used(const std::string& name, int after) const {
    const onnx::GraphProto& g = m_.graph();
    for (int i = after + 1; i < g.node_size(); ++i)
      for (const std::string& in : g.node(i).input())
        if (in == name) return true;
    for (const auto& o : g.output())
      if (o.name() == name) return true;
    return false;
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
    out_.spec.layers.push_back(std::move(spec));
    for (HostTensor& p : params) out_.params.push_back(std::move(p));
  }

  void requireRank(const onnx::NodeProto& node, int rank) const {
    if (shape_.rank() != rank)
      refuse(node, "its input has samples of shape " + shape_.str() + ", expected rank " +
                       std::to_string(rank));
  }

  // linear from a weight [out, in] and an optional bias [out].
  void linear(const onnx::NodeProto& node, HostTensor w, std::optional<HostTensor> b) {
    requireRank(node, 1);
    const int64_t out = w.shape[0], in = w.shape[1];
    if (in != shape_[0])
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
    shape_ = Shape{out};
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
  // the index of the last node used.
  int matmul(const onnx::NodeProto& node, int i) {
    if (node.input_size() != 2) refuse(node, "expected two inputs");
    HostTensor b = tensor(node, node.input(1));
    if (b.shape.rank() != 2) refuse(node, "B is " + b.shape.str() + ", not a matrix");
    std::optional<HostTensor> bias;
    const onnx::GraphProto& g = m_.graph();
    if (i + 1 < g.node_size()) {
      const onnx::NodeProto& next = g.node(i + 1);
      if (next.op_type() == "Add" && next.input_size() == 2 && !used(node.output(0), i + 1)) {
        const int k = next.input(0) == node.output(0)   ? 1
                      : next.input(1) == node.output(0) ? 0
                                                        : -1;
        if (k >= 0 && constants_.count(next.input(k))) {
          bias = tensor(next, next.input(k));
          linear(node, transposed(b), std::move(bias));
          value_ = next.output(0);
          return i + 1;
        }
      }
    }
    linear(node, transposed(b), std::nullopt);
    value_ = node.output(0);
    return i;
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
    const auto pad = pads(node);
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
    shape_ = Shape{w.shape[0], (shape_[1] + 2 * pad.first - kernel.first) / stride.first + 1,
                   (shape_[2] + 2 * pad.second - kernel.second) / stride.second + 1};
  }

  void pool(const onnx::NodeProto& node) {
    requireRank(node, 3);
    noDilation(node);
    if (attrInt(node, "ceil_mode", 0) != 0) refuse(node, "ceil_mode is not supported");
    if (attrInt(node, "storage_order", 0) != 0) refuse(node, "storage_order is not supported");
    const auto kernel = twoInts(node, "kernel_shape", 0);
    if (kernel.first <= 0 || kernel.second <= 0) refuse(node, "it has no 2-d kernel_shape");
    const auto stride = twoInts(node, "strides", 1);
    const auto pad = pads(node);
    const bool avg = node.op_type() == "AveragePool";
    if (avg && (pad.first || pad.second) && attrInt(node, "count_include_pad", 0) == 0)
      refuse(node, "padding left out of the average (count_include_pad 0) is not supported");
    if (pad.first > kernel.first / 2 || pad.second > kernel.second / 2)
      refuse(node, "pads over half the kernel are not supported");
    add({avg ? "avgpool2d" : "maxpool2d",
         {{"kernel", list(kernel)}, {"stride", list(stride)}, {"padding", list(pad)}},
         {},
         where(node)});
    shape_ = Shape{shape_[0], (shape_[1] + 2 * pad.first - kernel.first) / stride.first + 1,
                   (shape_[2] + 2 * pad.second - kernel.second) / stride.second + 1};
  }

  void flatten(const onnx::NodeProto& node) {
    if (shape_.rank() > 1) add({"flatten", {}, {}, where(node)});
    shape_ = Shape{shape_.numel()};
  }

  void reshape(const onnx::NodeProto& node) {
    if (node.input_size() < 2) refuse(node, "it has no shape input");
    const auto it = constants_.find(node.input(1));
    const onnx::TensorProto& t = *it->second;
    std::vector<int64_t> to(t.int64_data().begin(), t.int64_data().end());
    if (to.empty() && t.raw_data().size() % 8 == 0) {
      to.resize(t.raw_data().size() / 8);
      std::memcpy(to.data(), t.raw_data().data(), t.raw_data().size());
    }
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
  std::deque<onnx::TensorProto> owned_;  // Constant nodes' tensors (stable addresses)
  ImportedModel out_;
  std::string value_;
  Shape shape_;
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
  return f;
}

}  // namespace tandem::onnx_io
