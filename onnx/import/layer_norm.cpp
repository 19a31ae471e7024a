// LayerNorm as exporters before opset 17 write it out in elementwise nodes.
#include "onnx/import/importer.h"

#include "core/error.h"

namespace tandem::onnx_io {

bool Importer::lastAxis(const onnx::NodeProto& n) const {
  std::vector<int64_t> axes = attrInts(n, "axes");
  if (axes.empty() && n.input_size() > 1) {
    const auto c = constScalar(n.input(1));
    if (c) axes = {static_cast<int64_t>(*c)};
  }
  const int64_t rank = shape_.rank() + 1;
  return axes.size() == 1 && (axes[0] == -1 || axes[0] == rank - 1) &&
         attrInt(n, "keepdims", 1) == 1;
}

std::optional<HostTensor> Importer::feature(const onnx::NodeProto& n, const std::string& v,
                                            int64_t dim) {
  if (n.input_size() != 2) return std::nullopt;
  const std::string& c = n.input(0) == v ? n.input(1) : n.input(0);
  if (!constants_.count(c) || (n.input(0) != v && n.input(1) != v)) return std::nullopt;
  HostTensor t = tensor(n, c);
  if (t.data.size() == 1) t.data.assign(static_cast<size_t>(dim), t.data[0]);
  if (t.data.size() != static_cast<size_t>(dim)) return std::nullopt;
  t.shape = Shape{dim};
  return t;
}

std::optional<std::string> Importer::layerNormPattern(const std::string& v,
                                                      const std::vector<int>& next) {
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

}  // namespace tandem::onnx_io
