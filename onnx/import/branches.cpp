// Branches that meet at a Concat along channels (SqueezeNet's fire modules, Inception's
// blocks, DenseNet's layers appending to their input): one `concat` layer whose branches
// are `chain`s (or single layers, or the input itself: `identity`).
#include <algorithm>
#include <set>

#include "core/error.h"
#include "onnx/import/importer.h"

namespace tandem::onnx_io {

bool Importer::descends(const std::string& value, const std::string& from) const {
  std::vector<std::string> todo{value};
  std::set<std::string> seen;
  while (!todo.empty()) {
    const std::string x = std::move(todo.back());
    todo.pop_back();
    if (x == from) return true;
    if (!seen.insert(x).second) continue;
    const auto made = producer_.find(x);
    if (made == producer_.end()) continue;
    for (const std::string& in : node(made->second).input())
      if (!in.empty() && !constants_.count(in)) todo.push_back(in);
  }
  return false;
}

std::optional<std::string> Importer::dense(const std::string& v, const std::vector<int>& next) {
  std::vector<int> joins(next.size(), -1);  // by their count of inputs - 1
  for (const int o : next) {
    const onnx::NodeProto& n = node(o);
    if (n.op_type() != "Concat" || n.input(0) != v ||
        n.input_size() > static_cast<int>(next.size()))
      return std::nullopt;
    int& slot = joins[static_cast<size_t>(n.input_size() - 1)];
    if (slot >= 0) return std::nullopt;
    slot = o;
  }
  for (const int o : joins) {
    int64_t axis = attrInt(node(o), "axis", 1);
    if (axis < 0) axis += shape_.rank() + 1;
    if (axis != 1) return std::nullopt;
  }
  take({joins[0]});  // the Concat of v alone: v
  std::string in = node(joins[0]).output(0);
  std::vector<std::string> features;
  for (size_t k = 1; k < joins.size(); ++k) {
    const onnx::NodeProto& j = node(joins[k]);
    for (size_t o = k; o < joins.size(); ++o) taken_[static_cast<size_t>(joins[o])] = true;
    const Shape before = shape_;
    std::vector<LayerSpec>* outer = layers_;
    LayerSpec chain{"chain", {}, {}, where(j)};
    layers_ = &chain.children;
    const std::string end = walk(in);
    layers_ = outer;
    for (size_t o = k + 1; o < joins.size(); ++o) taken_[static_cast<size_t>(joins[o])] = false;
    features.push_back(end);
    for (size_t i = 0; i < features.size(); ++i)
      if (j.input(static_cast<int>(i) + 1) != features[i])
        refuse(j, "a dense layer from '" + in + "' ends at '" + end + "'; this Concat of '" + v +
                      "' and the layers' features reads '" + j.input(static_cast<int>(i) + 1) +
                      "' in its place");
    if (chain.children.empty()) refuse(j, "a dense layer from '" + in + "' has no layer");
    if (shape_.rank() != before.rank() || shape_.dropFirst() != before.dropFirst())
      refuse(j, "it appends " + shape_.str() + " to " + before.str() +
                    ": they must agree past the channels");
    LayerSpec block{"concat", {}, {}, where(j)};
    block.children.push_back({"identity", {}, {}, where(j)});
    block.children.push_back(chain.children.size() == 1 ? chain.children[0] : chain);
    layers_->push_back(std::move(block));
    std::vector<int64_t> dims = before.dims();
    dims[0] += shape_[0];
    shape_ = Shape(dims);
    checkSize(j, shape_);
    in = j.output(0);
  }
  return in;
}

std::optional<std::string> Importer::concat(const std::string& v, const std::vector<int>& next) {
  // An Add of v, or a reader whose only reader is an Add of two computed values (a
  // shortcut projection): a residual block's, not branches that a Concat joins.
  if (sums(v, next) > 0) return std::nullopt;
  for (const int o : next)
    if (const int a = only(node(o).output(0), "Add"); a >= 0 && sum(a)) return std::nullopt;
  if (auto end = dense(v, next)) return end;
  // The join: each of v's other readers begins a branch ending at one of its inputs, and
  // an input that is v itself (the join reading it) is a branch passing v on (identity).
  int join = -1;
  for (int i = 0; i < m_.graph().node_size() && join < 0; ++i) {
    const onnx::NodeProto& n = node(i);
    if (taken_[static_cast<size_t>(i)] || n.op_type() != "Concat") continue;
    int self = 0;
    bool all = true;
    for (const std::string& in : n.input()) {
      if (in == v)
        ++self;
      else
        all = all && descends(in, v);
    }
    const bool reads = std::find(next.begin(), next.end(), i) != next.end();
    const int branches = static_cast<int>(next.size()) - (reads ? 1 : 0) + self;
    if (all && (self > 0) == reads && n.input_size() == branches && branches >= 2) join = i;
  }
  if (join < 0) return std::nullopt;
  const onnx::NodeProto& j = node(join);
  take({join});
  const Shape in = shape_;
  std::vector<LayerSpec>* outer = layers_;
  std::vector<std::optional<LayerSpec>> branches(static_cast<size_t>(j.input_size()));
  std::vector<Shape> shapes(branches.size());
  for (size_t k = 0; k < branches.size(); ++k)
    if (j.input(static_cast<int>(k)) == v) {
      branches[k] = LayerSpec{"identity", {}, {}, where(j)};
      shapes[k] = in;
    }
  for (const int reader : next) {
    if (reader == join) continue;
    std::vector<int> aside;  // the other readers, out of this branch's walk
    for (const int o : next)
      if (o != reader && !taken_[static_cast<size_t>(o)]) {
        taken_[static_cast<size_t>(o)] = true;
        aside.push_back(o);
      }
    shape_ = in;
    LayerSpec chain{"chain", {}, {}, where(node(reader))};
    layers_ = &chain.children;
    const std::string end = walk(v);
    layers_ = outer;
    for (const int o : aside) taken_[static_cast<size_t>(o)] = false;
    size_t k = 0;
    while (k < branches.size() && !(j.input(static_cast<int>(k)) == end && !branches[k])) ++k;
    if (k == branches.size())
      refuse(j, "the branch from '" + v + "' through " + named(node(reader)) + " ends at '" + end +
                    "', which is not one of its inputs");
    if (chain.children.empty()) refuse(j, "its input '" + end + "' is a branch with no layer");
    branches[k] = chain.children.size() == 1 ? chain.children[0] : chain;
    shapes[k] = shape_;
  }
  const int64_t rank = shapes[0].rank() + 1;
  int64_t axis = attrInt(j, "axis", 1);
  if (axis < 0) axis += rank;
  if (axis != 1)
    refuse(j, "axis " + std::to_string(attrInt(j, "axis", 1)) +
                  ": tandem concatenates along channels (axis 1) only");
  std::vector<int64_t> dims = shapes[0].dims();
  for (size_t k = 1; k < shapes.size(); ++k) {
    if (shapes[k].dropFirst() != shapes[0].dropFirst())
      refuse(j, "it joins " + shapes[0].str() + " and " + shapes[k].str() +
                    ": they must agree past the channels");
    dims[0] += shapes[k][0];
  }
  LayerSpec block{"concat", {}, {}, where(j)};
  for (auto& b : branches) block.children.push_back(std::move(*b));
  layers_->push_back(std::move(block));
  shape_ = Shape(dims);
  checkSize(j, shape_);
  return j.output(0);
}

}  // namespace tandem::onnx_io
