// Shape arithmetic as PyTorch exports `x.size()` for a dynamic batch — Shape, then
// Gather, Unsqueeze, Concat, Div, Cast... of its dimensions into a Reshape's shape or a
// Slice's bounds — folded to constants with the shapes the walk has seen (the batch
// dimension kept as kBatch); and the layers such shapes describe: a Slice of channels
// (torch's chunk) and torchvision's channel shuffle.
#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "onnx/import/importer.h"

namespace tandem::onnx_io {

namespace {

// The operators a shape's arithmetic is made of (besides Shape).
bool arithmetic(const std::string& op) {
  return op == "Gather" || op == "Unsqueeze" || op == "Squeeze" || op == "Concat" || op == "Add" ||
         op == "Sub" || op == "Mul" || op == "Div" || op == "Cast" || op == "Slice";
}

// A folded value holds at most this many integers (a shape, a slice's bounds).
constexpr size_t kMaxFolded = 64;
// How deep one value's arithmetic may go.
constexpr int kMaxDepth = 256;

}  // namespace

bool Importer::shapeArithmetic(const onnx::NodeProto& n) const {
  if (n.op_type() == "Shape") return n.input_size() == 1 && n.output_size() == 1;
  if (!arithmetic(n.op_type()) || n.output_size() != 1) return false;
  // Of shape values and integer constants only (a Slice of a float table is a layer's).
  for (const std::string& in : n.input()) {
    if (in.empty() || shape_values_.count(in)) continue;
    const auto c = constants_.find(in);
    if (c == constants_.end()) return false;
    const int32_t type = c->second->data_type();
    if (type != onnx::TensorProto::INT64 && type != onnx::TensorProto::INT32) return false;
  }
  return true;
}

std::vector<int64_t> Importer::shapeInts(const onnx::NodeProto& reader, const std::string& name) {
  if (!shape_values_.count(name)) return int64s(reader, name);
  return fold(reader, name, 0).values;
}

Importer::Folded Importer::constFolded(const onnx::NodeProto& reader,
                                       const std::string& name) const {
  const auto it = constants_.find(name);
  if (it == constants_.end()) refuse(reader, "input '" + name + "' is not a constant");
  const onnx::TensorProto& t = *it->second;
  if (t.dims_size() > 1) refuse(reader, "'" + name + "' is not a scalar or a list of integers");
  Folded f;
  f.scalar = t.dims_size() == 0;
  if (t.data_type() == onnx::TensorProto::INT64) {
    f.values = int64s(reader, name);
  } else if (t.data_type() == onnx::TensorProto::INT32) {
    f.values.assign(t.int32_data().begin(), t.int32_data().end());
    if (f.values.empty() && t.raw_data().size() % 4 == 0 && t.raw_data().size() <= kMaxFolded * 4) {
      std::vector<int32_t> v(t.raw_data().size() / 4);
      std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
      f.values.assign(v.begin(), v.end());
    }
  } else {
    refuse(reader, "'" + name + "' is not int64 or int32");
  }
  const int64_t want = t.dims_size() == 0 ? 1 : t.dims(0);
  if (static_cast<int64_t>(f.values.size()) != want || f.values.size() > kMaxFolded)
    refuse(reader, "'" + name + "' holds " + std::to_string(f.values.size()) +
                       " integers; its dims say " + std::to_string(want));
  return f;
}

Importer::Folded Importer::fold(const onnx::NodeProto& reader, const std::string& name, int depth) {
  if (!shape_values_.count(name)) return constFolded(reader, name);
  if (const auto done = folded_.find(name); done != folded_.end()) return done->second;
  const onnx::NodeProto& n = node(producer_.at(name));
  if (depth > kMaxDepth) refuse(n, "its shape arithmetic is more than 256 nodes deep");
  const auto in = [&](int k) {
    if (k >= n.input_size() || n.input(k).empty()) refuse(n, "it lacks input " + std::to_string(k));
    return fold(n, n.input(k), depth + 1);
  };
  const auto real = [&](int64_t v, const char* what) {
    if (v == kBatch) refuse(n, std::string(what) + " the batch size, which the model leaves open");
    return v;
  };
  Folded out;
  const std::string& op = n.op_type();
  if (op == "Shape") {
    const auto seen = seen_shapes_.find(n.input(0));
    if (seen == seen_shapes_.end())
      refuse(n, "it asks the shape of '" + n.input(0) + "' before the walk reaches it");
    std::vector<int64_t> dims{kBatch};
    for (const int64_t d : seen->second.dims()) dims.push_back(d);
    const auto rank = static_cast<int64_t>(dims.size());
    int64_t start = attrInt(n, "start", 0), end = attrInt(n, "end", rank);
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, start, rank);
    out.values.assign(dims.begin() + start, dims.begin() + end);
  } else if (op == "Gather") {
    const Folded data = in(0), at = in(1);
    if (data.scalar || attrInt(n, "axis", 0) != 0) refuse(n, "it gathers from other than a list");
    for (int64_t i : at.values) {
      if (i < 0) i += static_cast<int64_t>(data.values.size());
      if (i < 0 || i >= static_cast<int64_t>(data.values.size()))
        refuse(n, "index " + std::to_string(i) + " is outside the list of " +
                      std::to_string(data.values.size()));
      out.values.push_back(data.values[static_cast<size_t>(i)]);
    }
    out.scalar = at.scalar;
  } else if (op == "Unsqueeze" || op == "Squeeze") {
    out = in(0);
    const bool unsqueeze = op == "Unsqueeze";
    if (out.scalar != unsqueeze || (!unsqueeze && out.values.size() != 1))
      refuse(n, unsqueeze ? "only a scalar is unsqueezed here" : "only a list of one is squeezed");
    out.scalar = !unsqueeze;
  } else if (op == "Concat") {
    for (int k = 0; k < n.input_size(); ++k) {
      const Folded part = in(k);
      if (part.scalar) refuse(n, "it concatenates a scalar");
      out.values.insert(out.values.end(), part.values.begin(), part.values.end());
      if (out.values.size() > kMaxFolded) refuse(n, "it makes more than 64 integers");
    }
  } else if (op == "Cast") {
    const int64_t to = attrInt(n, "to", 0);
    if (to != onnx::TensorProto::INT64 && to != onnx::TensorProto::INT32)
      refuse(n, "a shape cast to other than an integer type");
    out = in(0);
  } else if (op == "Slice") {
    const Folded data = in(0), starts = in(1), ends = in(2);
    if (data.scalar || starts.values.size() != 1 || ends.values.size() != 1 ||
        (n.input_size() > 3 && !n.input(3).empty() && in(3).values != std::vector<int64_t>{0}) ||
        (n.input_size() > 4 && !n.input(4).empty() && in(4).values != std::vector<int64_t>{1}))
      refuse(n, "only a slice of a list, with step 1, is folded");
    const auto size = static_cast<int64_t>(data.values.size());
    int64_t b = real(starts.values[0], "it starts at"), e = real(ends.values[0], "it ends at");
    if (b < 0) b += size;
    if (e < 0) e += size;
    b = std::clamp<int64_t>(b, 0, size);
    e = std::clamp<int64_t>(e, b, size);
    out.values.assign(data.values.begin() + b, data.values.begin() + e);
  } else {  // Add, Sub, Mul, Div, with a list of one broadcast
    const Folded a = in(0), b = in(1);
    const size_t size = std::max(a.values.size(), b.values.size());
    if ((a.values.size() != size && a.values.size() != 1) ||
        (b.values.size() != size && b.values.size() != 1))
      refuse(n, "its lists of " + std::to_string(a.values.size()) + " and " +
                    std::to_string(b.values.size()) + " integers do not broadcast");
    for (size_t i = 0; i < size; ++i) {
      const int64_t x = real(a.values[a.values.size() == 1 ? 0 : i], "it computes with");
      const int64_t y = real(b.values[b.values.size() == 1 ? 0 : i], "it computes with");
      int64_t r = 0;
      bool overflow = false;
      if (op == "Add") overflow = __builtin_add_overflow(x, y, &r);
      if (op == "Sub") overflow = __builtin_sub_overflow(x, y, &r);
      if (op == "Mul") overflow = __builtin_mul_overflow(x, y, &r);
      if (op == "Div") {
        if (y == 0 || (x == std::numeric_limits<int64_t>::min() && y == -1))
          refuse(n, "it divides " + std::to_string(x) + " by " + std::to_string(y));
        r = x / y;
      }
      if (overflow || r == kBatch) refuse(n, "its arithmetic overflows");
      out.values.push_back(r);
    }
    out.scalar = a.scalar && b.scalar;
  }
  folded_[name] = out;
  return out;
}

void Importer::channels(const onnx::NodeProto& node) {
  // Slice(data, starts, ends[, axes[, steps]]) from opset 10, attributes before.
  if (node.input_size() < 3) refuse(node, "a Slice with its bounds as attributes is not supported");
  const std::vector<int64_t> starts = shapeInts(node, node.input(1)),
                             ends = shapeInts(node, node.input(2));
  std::vector<int64_t> axes{0};
  if (node.input_size() > 3 && !node.input(3).empty()) axes = shapeInts(node, node.input(3));
  const int64_t rank = shape_.rank() + 1;
  if (starts.size() != 1 || ends.size() != 1 || axes.size() != 1 ||
      (axes[0] != 1 && axes[0] != 1 - rank))
    refuse(node, "only a slice of the channels (axis 1) of each sample is supported");
  if (node.input_size() > 4 && !node.input(4).empty() &&
      shapeInts(node, node.input(4)) != std::vector<int64_t>{1})
    refuse(node, "only a slice with step 1 is supported");
  const int64_t c = shape_[0];
  int64_t b = starts[0], e = ends[0];
  if (b == kBatch || e == kBatch) refuse(node, "its bounds are the batch size");
  if (b < 0) b += c;
  if (e < 0) e += c;
  b = std::clamp<int64_t>(b, 0, c);
  e = std::clamp<int64_t>(e, 0, c);
  if (e <= b) refuse(node, "it takes no channel of " + std::to_string(c));
  add({"slice", {{"begin", b}, {"end", e}}, {}, where(node)});
  std::vector<int64_t> dims = shape_.dims();
  dims[0] = e - b;
  shape_ = Shape(dims);
}

std::optional<std::string> Importer::channelShuffle(const onnx::NodeProto& node,
                                                    const std::vector<int64_t>& to) {
  // [batch, G, K, rest...] of a [G * K, rest...] sample, a Transpose of G and K, and a
  // Reshape back to the sample's shape.
  const int64_t rank = shape_.rank();
  if (static_cast<int64_t>(to.size()) != rank + 2 || (to[0] != kBatch && to[0] != 0)) return {};
  for (int64_t i = 1; i < rank; ++i)
    if (to[static_cast<size_t>(i) + 2] != shape_[i]) return {};
  const int64_t c = shape_[0];
  int64_t groups = to[1], k = to[2];
  if (groups == -1 && k > 0 && c % k == 0) groups = c / k;
  if (k == -1 && groups > 0 && c % groups == 0) k = c / groups;
  // (divided, not multiplied: a hostile file's G and K overflow a product)
  if (groups <= 0 || k <= 0 || c % groups != 0 || c / groups != k) return {};
  const int t = only(node.output(0), "Transpose");
  if (t < 0) refuse(node, "a reshape of the channels into groups is followed by no Transpose");
  std::vector<int64_t> perm{0, 2, 1};
  for (int64_t i = 3; i < rank + 2; ++i) perm.push_back(i);
  if (attrInts(this->node(t), "perm") != perm)
    refuse(this->node(t), "only the transpose of the channels' two group axes is supported");
  const int back = only(this->node(t).output(0), "Reshape");
  if (back < 0) refuse(this->node(t), "a channel shuffle is not reshaped back");
  const std::vector<int64_t> again = shapeInts(this->node(back), this->node(back).input(1));
  std::vector<int64_t> want{kBatch};
  for (const int64_t d : shape_.dims()) want.push_back(d);
  bool same = again.size() == want.size();
  for (size_t i = 0; same && i < want.size(); ++i)
    same = again[i] == want[i] || (i == 0 && again[i] == 0) || (i == 1 && again[i] == -1);
  if (!same) refuse(this->node(back), "a channel shuffle must end in the sample's own shape");
  take({t, back});
  add({"channel_shuffle", {{"groups", groups}}, {}, where(node)});
  return this->node(back).output(0);
}

std::string Importer::reshape(const onnx::NodeProto& node) {
  if (node.input_size() < 2) refuse(node, "it has no shape input");
  const std::vector<int64_t> to = shapeInts(node, node.input(1));
  if (std::optional<std::string> shuffled = channelShuffle(node, to)) return *shuffled;
  const int64_t n = shape_.numel();
  const bool batch = !to.empty() && (to[0] == kBatch || to[0] == -1 || to[0] == 0 || to[0] >= 1);
  const bool to_2d = to.size() == 2 && batch && (to[1] == n || (to[1] == -1 && to[0] != -1));
  if (!to_2d) refuse(node, "only a reshape of each sample to one dimension (flatten) is supported");
  flatten(node);
  return node.output(0);
}

}  // namespace tandem::onnx_io
