// Branches that meet at a Concat along channels (SqueezeNet's fire modules, Inception's
// blocks): one `concat` layer whose branches are `chain`s (or single layers).
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

std::optional<std::string> Importer::concat(const std::string& v, const std::vector<int>& next) {
  // An Add of v, or a reader whose only reader is an Add of two computed values (a
  // shortcut projection): a residual block's, not branches that a Concat joins.
  if (sums(v, next) > 0) return std::nullopt;
  for (const int o : next)
    if (const int a = only(node(o).output(0), "Add"); a >= 0 && sum(a)) return std::nullopt;
  int join = -1;
  for (int i = 0; i < m_.graph().node_size() && join < 0; ++i) {
    const onnx::NodeProto& n = node(i);
    if (taken_[static_cast<size_t>(i)] || n.op_type() != "Concat" ||
        n.input_size() != static_cast<int>(next.size()))
      continue;
    bool all = true;
    for (const std::string& in : n.input()) all = all && in != v && descends(in, v);
    if (all) join = i;
  }
  if (join < 0) return std::nullopt;
  const onnx::NodeProto& j = node(join);
  take({join});
  const Shape in = shape_;
  std::vector<LayerSpec>* outer = layers_;
  std::vector<std::optional<LayerSpec>> branches(next.size());
  std::vector<Shape> shapes(next.size());
  for (const int reader : next) {
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
