// The graph and attribute helpers: who reads a value, constants, attributes,
// initializers checked against their dims, refusals naming the node.
#include "onnx/import/importer.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace tandem::onnx_io {

int64_t Importer::opset() const {
  for (const auto& o : m_.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") return o.version();
  return 1;
}

std::vector<int> Importer::live(const std::string& value) const {
  std::vector<int> out;
  const auto it = consumers_.find(value);
  if (it != consumers_.end())
    for (int i : it->second)
      if (!taken_[static_cast<size_t>(i)]) out.push_back(i);
  return out;
}

bool Importer::isOutput(const std::string& value) const {
  for (const auto& o : m_.graph().output())
    if (o.name() == value) return true;
  return false;
}

int Importer::only(const std::string& value, const std::string& op) const {
  const std::vector<int> c = live(value);
  if (c.size() != 1 || isOutput(value) || node(c[0]).op_type() != op) return -1;
  return c[0];
}

void Importer::take(std::initializer_list<int> nodes) {
  for (int i : nodes) taken_[static_cast<size_t>(i)] = true;
}

std::optional<double> Importer::constScalar(const std::string& name) const {
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

bool Importer::withScalar(const onnx::NodeProto& n, const std::string& op, const std::string& v,
                          double want, bool commutes) const {
  if (n.op_type() != op || n.input_size() != 2) return false;
  std::optional<double> c;
  if (n.input(0) == v) c = constScalar(n.input(1));
  if (!c && commutes && n.input(1) == v) c = constScalar(n.input(0));
  return c && std::fabs(*c - want) <= 1e-6 * std::fabs(want);
}

bool Importer::reads(const onnx::NodeProto& n, const std::string& a, const std::string& b) {
  return n.input_size() == 2 &&
         ((n.input(0) == a && n.input(1) == b) || (n.input(0) == b && n.input(1) == a));
}

std::string Importer::named(const onnx::NodeProto& node) {
  if (!node.name().empty()) return "node '" + node.name() + "'";
  return "the node making '" + (node.output_size() ? node.output(0) : std::string()) + "'";
}

[[noreturn]] void Importer::refuse(const onnx::NodeProto& node, const std::string& why) const {
  throw InvalidArgument(source_ + ": " + named(node) + " (" + node.op_type() + "): " + why);
}

void Importer::findInput(const onnx::GraphProto& g) {
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
                            std::to_string(k) + " is not fixed: tandem needs each sample's shape");
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

void Importer::constant(const onnx::NodeProto& node) {
  for (const onnx::AttributeProto& a : node.attribute())
    if (a.name() == "value" && a.has_t()) {
      owned_.push_back(a.t());
      constants_[node.output(0)] = &owned_.back();
      return;
    }
  refuse(node, "only a Constant holding a tensor ('value') is supported");
}

const onnx::AttributeProto* Importer::attr(const onnx::NodeProto& node,
                                           const std::string& name) const {
  for (const onnx::AttributeProto& a : node.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

int64_t Importer::attrInt(const onnx::NodeProto& node, const std::string& name,
                          int64_t fallback) const {
  const auto* a = attr(node, name);
  return a ? a->i() : fallback;
}

double Importer::attrFloat(const onnx::NodeProto& node, const std::string& name,
                           double fallback) const {
  const auto* a = attr(node, name);
  return a ? a->f() : fallback;
}

std::vector<int64_t> Importer::attrInts(const onnx::NodeProto& node,
                                        const std::string& name) const {
  const auto* a = attr(node, name);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : std::vector<int64_t>{};
}

HostTensor Importer::tensor(const onnx::NodeProto& node, const std::string& name) const {
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

double Importer::scalar(const onnx::NodeProto& node, const std::string& name) const {
  const HostTensor t = tensor(node, name);
  if (t.data.size() != 1) refuse(node, "'" + name + "' must be a scalar");
  return t.data[0];
}

void Importer::requireRank(const onnx::NodeProto& node, int rank) const {
  if (shape_.rank() != rank)
    refuse(node, "its input has samples of shape " + shape_.str() + ", expected rank " +
                     std::to_string(rank));
}

std::pair<int64_t, int64_t> Importer::twoInts(const onnx::NodeProto& node, const std::string& name,
                                              int64_t fallback) const {
  const std::vector<int64_t> v = attrInts(node, name);
  if (v.empty()) return {fallback, fallback};
  if (v.size() != 2) refuse(node, "'" + name + "' must have 2 values (a 2-d operation)");
  return {v[0], v[1]};
}

void Importer::noDilation(const onnx::NodeProto& node) const {
  for (int64_t d : attrInts(node, "dilations"))
    if (d != 1) refuse(node, "dilations are not supported");
}

std::vector<int64_t> Importer::int64s(const onnx::NodeProto& node, const std::string& name) const {
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

}  // namespace tandem::onnx_io
