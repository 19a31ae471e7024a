// GELU as exporters write it out in elementwise nodes.
#include "onnx/import/importer.h"

#include <cmath>

#include "core/error.h"

namespace tandem::onnx_io {

std::optional<std::string> Importer::gelu(const std::string& v, const std::vector<int>& next) {
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

}  // namespace tandem::onnx_io
