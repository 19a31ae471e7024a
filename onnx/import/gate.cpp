// Gates: a Mul of a value and a branch computed from it, as squeeze-and-excitation
// exports (MobileNetV3, EfficientNet): x * HardSigmoid/Sigmoid(Conv(act(Conv(
// GlobalAveragePool(x))))), the branch's channel values broadcast over H and W.
#include "core/error.h"
#include "onnx/import/importer.h"

namespace tandem::onnx_io {

std::optional<std::string> Importer::gate(const std::string& v, const std::vector<int>& next) {
  if (next.size() != 2) return std::nullopt;
  for (int a = 0; a < 2; ++a) {
    const int join = next[1 - a];
    const onnx::NodeProto& mul = node(join);
    if (mul.op_type() != "Mul" || mul.input_size() != 2 || mul.input(0) == mul.input(1) ||
        constants_.count(mul.input(0)) || constants_.count(mul.input(1)))
      continue;
    const std::string factor = mul.input(0) == v ? mul.input(1) : mul.input(0);
    // tandem's export spreads per-channel values with an Unsqueeze to [N, C, 1, 1].
    std::string end = factor;
    int unsqueeze = -1;
    const auto made = producer_.find(factor);
    if (made != producer_.end() && node(made->second).op_type() == "Unsqueeze" &&
        only(factor, "Mul") == join) {
      unsqueeze = made->second;
      end = node(unsqueeze).input(0);
    }
    take({join});
    if (unsqueeze >= 0) take({unsqueeze});
    const Shape in = shape_;
    std::vector<LayerSpec>* outer = layers_;
    LayerSpec block{"gate", {}, {}, where(mul)};
    layers_ = &block.children;
    const std::string u = walk(v);
    layers_ = outer;
    if (u != end)
      refuse(mul, "it multiplies '" + v + "' by '" + factor +
                      "', which is not the end of the branch from '" + v + "' ('" + u + "')");
    if (block.children.empty()) refuse(mul, "its branch has no layer");
    const bool per_channel = in.rank() == 3 && shape_ == Shape{in[0]};
    if (!per_channel && shape_ != in)
      refuse(mul, "it multiplies the input's " + in.str() + " by the branch's " + shape_.str() +
                      ": a gate's branch keeps the input's shape or gives one value per channel");
    if (unsqueeze >= 0) {
      std::vector<int64_t> axes = attrInts(node(unsqueeze), "axes");
      if (node(unsqueeze).input_size() > 1)
        axes = int64s(node(unsqueeze), node(unsqueeze).input(1));
      for (int64_t& x : axes) x = x < 0 ? x + 4 : x;
      if (!per_channel || axes.size() != 2 || std::min(axes[0], axes[1]) != 2 ||
          std::max(axes[0], axes[1]) != 3)
        refuse(node(unsqueeze),
               "only an Unsqueeze of per-channel values [N, C] to [N, C, 1, 1] "
               "before a gate's Mul is supported");
    }
    shape_ = in;
    layers_->push_back(std::move(block));
    return mul.output(0);
  }
  return std::nullopt;
}

}  // namespace tandem::onnx_io
