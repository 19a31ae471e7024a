// Multi-head self-attention as PyTorch exports a module written out.
#include "onnx/import/importer.h"

#include <cmath>

#include "core/error.h"

namespace tandem::onnx_io {

std::optional<std::vector<bool>> Importer::constBools(const std::string& name,
                                                      int64_t count) const {
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

int Importer::expect(const std::string& value, const std::string& op, const onnx::NodeProto& from) {
  const int i = only(value, op);
  if (i < 0)
    refuse(from,
           "in an attention pattern its output '" + value + "' must go to one " + op + " alone");
  return i;
}

void Importer::expectPerm(const onnx::NodeProto& n, const std::vector<int64_t>& perm) const {
  if (attrInts(n, "perm") == perm) return;
  std::string list;
  for (int64_t k : perm) list += (list.empty() ? "" : ", ") + std::to_string(k);
  refuse(n, "in an attention pattern its perm must be (" + list + ")");
}

std::optional<std::tuple<HostTensor, HostTensor, std::string, int>> Importer::projected(
    int mm, int64_t in) {
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

std::optional<std::string> Importer::attention(const std::string& v, int mm) {
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
  // (d divided, not the heads multiplied: a hostile file's sizes overflow a product)
  if (to.size() != 5 || to[2] != 3 || to[3] <= 0 || d % to[3] != 0 || d / to[3] != to[4] ||
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

}  // namespace tandem::onnx_io
