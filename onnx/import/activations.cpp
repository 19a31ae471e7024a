// Activations that exporters write as more than a plain operator: SiLU as x * Sigmoid(x),
// ReLU6 as a Clip, and the hard sigmoid and swish of the mobile networks.
#include <cmath>
#include <limits>

#include "core/error.h"
#include "onnx/import/importer.h"

namespace tandem::onnx_io {

std::optional<std::string> Importer::silu(const std::string& v, const std::vector<int>& next) {
  if (next.size() != 2) return std::nullopt;
  for (int a = 0; a < 2; ++a) {
    const onnx::NodeProto& sig = node(next[a]);
    const onnx::NodeProto& mul = node(next[1 - a]);
    if (sig.op_type() != "Sigmoid" || sig.input_size() != 1 || mul.op_type() != "Mul" ||
        only(sig.output(0), "Mul") != next[1 - a] || !reads(mul, v, sig.output(0)))
      continue;
    take({next[a], next[1 - a]});
    add({"silu", {}, {}, where(mul)});
    return mul.output(0);
  }
  return std::nullopt;
}

std::string Importer::hardActivation(const onnx::NodeProto& node) const {
  const std::string& op = node.op_type();
  if (op == "HardSwish") return "hardswish";
  if (op == "HardSigmoid") {
    const double alpha = attrFloat(node, "alpha", 0.2), beta = attrFloat(node, "beta", 0.5);
    if (!(std::abs(alpha - 1.0 / 6) <= 1e-6 && std::abs(beta - 0.5) <= 1e-6))  // (NaN too)
      refuse(node, "HardSigmoid with alpha " + std::to_string(alpha) + " and beta " +
                       std::to_string(beta) +
                       ": tandem's hard sigmoid is PyTorch's (alpha 1/6, beta 0.5)");
    return "hardsigmoid";
  }
  // Clip: its bounds are inputs from opset 11 (empty: none), attributes before.
  const double inf = std::numeric_limits<double>::infinity();
  double lo = -inf, hi = inf;
  if (opset() >= 11) {
    if (node.input_size() > 1 && !node.input(1).empty()) lo = scalar(node, node.input(1));
    if (node.input_size() > 2 && !node.input(2).empty()) hi = scalar(node, node.input(2));
  } else {
    lo = attrFloat(node, "min", -inf);
    hi = attrFloat(node, "max", inf);
  }
  if (lo == 0 && hi == 6) return "relu6";
  if (lo == 0 && hi == inf) return "relu";
  refuse(node, "Clip to [" + std::to_string(lo) + ", " + std::to_string(hi) +
                   "]: tandem clips to [0, 6] (ReLU6) or [0, inf) (ReLU) only");
}

}  // namespace tandem::onnx_io
