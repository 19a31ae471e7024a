// Residual blocks (a body and its shortcut joined by an Add), their shortcut
// projections, and the merge of a transformer block's two residual blocks into one layer.
#include "onnx/import/importer.h"

#include "core/error.h"
#include "core/layers/residual.h"

namespace tandem::onnx_io {

void Importer::mergeTransformers(std::vector<LayerSpec>& layers) {
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

bool Importer::sum(int i) const {
  const onnx::NodeProto& n = node(i);
  return n.op_type() == "Add" && n.input_size() == 2 && !constants_.count(n.input(0)) &&
         !constants_.count(n.input(1)) && n.input(0) != n.input(1);
}

int Importer::sums(const std::string& v, const std::vector<int>& next) const {
  int n = 0;
  for (int i : next) n += sum(i) && (node(i).input(0) == v || node(i).input(1) == v);
  return n;
}

std::string Importer::residual(const std::string& v, const std::vector<int>& next) {
  // The shortcut: an Add of v and a computed value (identity); else a Conv / Gemm /
  // MatMul of v whose only reader is such an Add — the one shaped like tandem's
  // projection first, when both readers could be it (a one-node body).
  struct Choice {
    int body, join, proj, norm = -1;  // norm: a BatchNormalization after the projection
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
      const int norm = only(o.output(0), "BatchNormalization");
      const int join = only(norm >= 0 ? node(norm).output(0) : o.output(0), "Add");
      if (join >= 0 && sum(join)) pick = Choice{next[a], join, next[1 - a], norm};
    }
  if (pick && pick->join != pick->body) {
    const int join = pick->join, proj = pick->proj, norm = pick->norm;
    const std::string shortcut = norm >= 0   ? node(norm).output(0)
                                 : proj >= 0 ? node(proj).output(0)
                                             : v;
    take({join});
    if (proj >= 0) take({proj});
    if (norm >= 0) take({norm});
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
      if (projection(node(proj), in)) block.attrs["proj_bias"] = int64_t{1};
      if (norm >= 0) projectionNorm(node(norm), block);
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

void Importer::projectionNorm(const onnx::NodeProto& n, LayerSpec& block) {
  std::vector<LayerSpec> made;
  std::vector<LayerSpec>* outer = layers_;
  layers_ = &made;
  batchNorm(n);  // (its parameters follow the projection's, as the residual's do)
  layers_ = outer;
  block.attrs["proj_norm"] = int64_t{1};
  block.attrs["proj_eps"] = made.at(0).attrs.at("eps");
  block.attrs["proj_momentum"] = made.at(0).attrs.at("momentum");
}

bool Importer::projectionLike(const onnx::NodeProto& n) const {
  if (n.op_type() == "Conv") {
    const auto w = n.input_size() == 2 ? constants_.find(n.input(1)) : constants_.end();
    return w != constants_.end() && w->second->dims_size() == 4 && w->second->dims(2) == 1 &&
           w->second->dims(3) == 1;
  }
  return (n.op_type() == "Gemm" && n.input_size() == 2) || n.op_type() == "MatMul";
}

bool Importer::projection(const onnx::NodeProto& p, const Shape& in) {
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
  const int64_t stride = in.rank() == 3 && out.rank() == 3 ? projectionStride(in[1], out[1]) : 1;
  const bool ok = shape_ == out && !s.attrs.count("groups") &&
                  (s.type == "linear" ||
                   (s.attrs.at("kernel") == AttrValue(std::vector<int64_t>{1, 1}) &&
                    s.attrs.at("stride") == AttrValue(std::vector<int64_t>{stride, stride}) &&
                    s.attrs.at("padding") == AttrValue(std::vector<int64_t>{0, 0})));
  if (!ok)
    refuse(p,
           "a shortcut projection must be what tandem's residual makes: a 1x1 convolution "
           "with stride " +
               std::to_string(stride) +
               " and no padding (or a linear layer), with or without a bias, mapping " + in.str() +
               " to " + out.str());
  shape_ = out;
  return !s.attrs.count("bias");  // (the layers imported say bias: 0 when there is none)
}

}  // namespace tandem::onnx_io
