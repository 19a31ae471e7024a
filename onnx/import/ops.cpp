// The operators that map one to one (or with a neighbour folded in) onto tandem's
// layers: Gemm/MatMul, Conv, pooling, Pad, Flatten, Reshape, Gather, LayerNormalization,
// BatchNormalization, ReduceMean over H and W.
#include "onnx/import/importer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tandem::onnx_io {

void Importer::layerNorm(const onnx::NodeProto& node) {
  const int64_t rank = shape_.rank() + 1;
  int64_t axis = attrInt(node, "axis", -1);
  if (axis < 0) axis += rank;
  if (axis != rank - 1)
    refuse(node, "axis " + std::to_string(attrInt(node, "axis", -1)) +
                     " normalizes more than the last dimension: tandem's layernorm "
                     "normalizes the last one");
  const int64_t dim = shape_[shape_.rank() - 1];
  if (node.input_size() < 2) refuse(node, "it has no scale input");
  HostTensor gamma = tensor(node, node.input(1));
  HostTensor beta{"", Shape{dim}, std::vector<float>(static_cast<size_t>(dim), 0.0f)};
  if (node.input_size() > 2 && !node.input(2).empty()) beta = tensor(node, node.input(2));
  if (gamma.data.size() != static_cast<size_t>(dim) || beta.data.size() != static_cast<size_t>(dim))
    refuse(node, "its scale and bias must have " + std::to_string(dim) + " values");
  gamma.shape = beta.shape = Shape{dim};
  add({"layernorm", {{"eps", attrFloat(node, "epsilon", 1e-5)}}, {}, where(node)},
      {std::move(gamma), std::move(beta)});
}

namespace {

// tandem's momentum (the new batch's weight) from ONNX's (the old running value's, a
// float): the shortest decimal whose complement is that float, so that 0.9 gives back 0.1
// exactly and an export followed by an import changes no bit.
double batchMomentum(float onnx_momentum) {
  const double m = 1.0 - static_cast<double>(onnx_momentum);
  for (int digits = 1; digits < 17; ++digits) {
    const double scale = std::pow(10.0, digits - 1 - static_cast<int>(std::floor(std::log10(m))));
    const double candidate = std::round(m * scale) / scale;
    if (static_cast<float>(1.0 - candidate) == onnx_momentum) return candidate;
  }
  return m;
}

}  // namespace

void Importer::batchNorm(const onnx::NodeProto& node) {
  if (shape_.rank() < 1 || shape_.numel() < 1)
    refuse(node, "its input " + shape_.str() + " has no channels to normalise");
  if (node.input_size() != 5) refuse(node, "it needs scale, bias, mean and variance inputs");
  if (attrInt(node, "spatial", 1) != 1)
    refuse(node, "'spatial' 0 (statistics per value, not per channel) is not supported");
  const int64_t c = shape_[0];
  const char* what[] = {"scale", "bias", "mean", "variance"};
  std::vector<HostTensor> params;
  for (int k = 1; k <= 4; ++k) {
    HostTensor t = tensor(node, node.input(k));
    if (t.data.size() != static_cast<size_t>(c))
      refuse(node, std::string("its ") + what[k - 1] + " has " + std::to_string(t.data.size()) +
                       " values for " + std::to_string(c) + " channels");
    t.shape = Shape{c};
    params.push_back(std::move(t));
  }
  for (float v : params[3].data)
    if (!(v >= 0.0f)) refuse(node, "its variance holds " + std::to_string(v) + ", not >= 0");
  const double eps = attrFloat(node, "epsilon", 1e-5);
  const auto onnx_momentum = static_cast<float>(attrFloat(node, "momentum", 0.9));
  if (!(eps > 0.0)) refuse(node, "its epsilon must be positive");
  if (!(onnx_momentum >= 0.0f && onnx_momentum <= 1.0f))
    refuse(node, "its momentum must be in [0, 1]");
  add({"batchnorm",
       {{"eps", eps}, {"momentum", onnx_momentum == 1.0f ? 0.0 : batchMomentum(onnx_momentum)}},
       {},
       where(node)},
      std::move(params));
}

std::string Importer::gather(const onnx::NodeProto& node, const std::string& v) {
  if (!ids_ || node.input_size() != 2 || node.input(1) != v)
    refuse(node,
           "only a Gather of the model's integer input ids from an initializer (an "
           "embedding) is supported");
  if (attrInt(node, "axis", 0) != 0) refuse(node, "only a Gather along axis 0 is supported");
  if (shape_.rank() != 1)
    refuse(node, "its ids are " + shape_.str() + " per sample; an embedding takes [T]");
  HostTensor table = tensor(node, node.input(0));
  if (table.shape.rank() != 2) refuse(node, "its table is " + table.shape.str() + ", not 2-d");
  const int64_t vocab = table.shape[0], dim = table.shape[1];
  add({"embedding", {{"vocab", vocab}, {"dim", dim}}, {}, where(node)}, {std::move(table)});
  shape_ = Shape{shape_[0], dim};
  checkSize(node, shape_);
  ids_ = false;
  return node.output(0);
}

void Importer::add(LayerSpec spec, std::vector<HostTensor> params) {
  layers_->push_back(std::move(spec));
  for (HostTensor& p : params) out_.params.push_back(std::move(p));
}

void Importer::linear(const onnx::NodeProto& node, HostTensor w, std::optional<HostTensor> b) {
  const int64_t out = w.shape[0], in = w.shape[1];
  if (in != shape_[shape_.rank() - 1])
    refuse(node,
           "its weight takes " + std::to_string(in) + " inputs, the chain gives " + shape_.str());
  std::map<std::string, AttrValue> attrs{{"out", out}, {"in", in}};
  std::vector<HostTensor> params{std::move(w)};
  if (b) {
    if (b->data.size() != static_cast<size_t>(out))
      refuse(node, "its bias has " + std::to_string(b->data.size()) + " values for " +
                       std::to_string(out) + " outputs");
    b->shape = Shape{out};
    params.push_back(std::move(*b));
  } else {
    attrs["bias"] = int64_t{0};
  }
  add({"linear", attrs, {}, where(node)}, std::move(params));
  shape_[shape_.rank() - 1] = out;
  checkSize(node, shape_);
}

HostTensor Importer::transposed(const HostTensor& t) {
  HostTensor r = t;
  const int64_t rows = t.shape[0], cols = t.shape[1];
  r.shape = Shape{cols, rows};
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      r.data[static_cast<size_t>(j * rows + i)] = t.data[static_cast<size_t>(i * cols + j)];
  return r;
}

void Importer::gemm(const onnx::NodeProto& node) {
  requireRank(node, 1);
  if (attrFloat(node, "alpha", 1.0) != 1.0 || attrFloat(node, "beta", 1.0) != 1.0)
    refuse(node, "alpha and beta other than 1 are not supported");
  if (attrInt(node, "transA", 0) != 0) refuse(node, "transA is not supported");
  if (node.input_size() < 2) refuse(node, "it has no B input");
  HostTensor b = tensor(node, node.input(1));
  if (b.shape.rank() != 2) refuse(node, "B is " + b.shape.str() + ", not a matrix");
  HostTensor w = attrInt(node, "transB", 0) ? std::move(b) : transposed(b);
  std::optional<HostTensor> bias;
  if (node.input_size() > 2 && !node.input(2).empty()) bias = tensor(node, node.input(2));
  if (bias && bias->data.size() != static_cast<size_t>(w.shape[0]) && bias->data.size() == 1)
    bias->data.assign(static_cast<size_t>(w.shape[0]), bias->data[0]);  // broadcast scalar C
  linear(node, std::move(w), std::move(bias));
}

std::string Importer::matmul(const onnx::NodeProto& node) {
  if (node.input_size() != 2) refuse(node, "expected two inputs");
  HostTensor b = tensor(node, node.input(1));
  if (b.shape.rank() != 2) refuse(node, "B is " + b.shape.str() + ", not a matrix");
  const std::string& y = node.output(0);
  if (const int next = only(y, "Add"); next >= 0) {
    const onnx::NodeProto& plus = this->node(next);
    const std::string& c = plus.input(0) == y ? plus.input(1) : plus.input(0);
    if (constants_.count(c)) {
      take({next});
      linear(node, transposed(b), tensor(plus, c));
      return plus.output(0);
    }
  }
  linear(node, transposed(b), std::nullopt);
  return y;
}

std::pair<int64_t, int64_t> Importer::pads(const onnx::NodeProto& node) const {
  const auto* autopad = attr(node, "auto_pad");
  if (autopad && autopad->s() != "NOTSET" && autopad->s() != "VALID")
    refuse(node, "auto_pad " + autopad->s() + " is not supported (give pads)");
  const std::vector<int64_t> p = attrInts(node, "pads");
  if (p.empty()) return {0, 0};
  if (p.size() != 4 || p[0] != p[2] || p[1] != p[3])
    refuse(node, "asymmetric pads are not supported");
  return {p[0], p[1]};
}

void Importer::pooledConv(const onnx::NodeProto& node) {
  noDilation(node);
  if (padded_) refuse(*padded_, "a Pad of pooled values [N, C, 1, 1] is not supported");
  HostTensor w = tensor(node, node.input(1));
  const auto pad = pads(node);
  if (attrInt(node, "group", 1) != 1 || w.shape.rank() != 4 || w.shape[2] != 1 || w.shape[3] != 1 ||
      pad.first != 0 || pad.second != 0)
    refuse(node, "a Conv of pooled values " + shape_.str() +
                     " ([N, C, 1, 1] in ONNX) must be 1x1, ungrouped and unpadded (a linear "
                     "layer); its weight is " +
                     w.shape.str());
  w.shape = Shape{w.shape[0], w.shape[1]};
  std::optional<HostTensor> b;
  if (node.input_size() > 2 && !node.input(2).empty()) b = tensor(node, node.input(2));
  linear(node, std::move(w), std::move(b));
}

void Importer::conv(const onnx::NodeProto& node) {
  if (shape_.rank() == 1) return pooledConv(node);
  requireRank(node, 3);
  noDilation(node);
  const int64_t group = attrInt(node, "group", 1);
  HostTensor w = tensor(node, node.input(1));
  if (w.shape.rank() != 4) refuse(node, "its weight is " + w.shape.str() + ", not 4-d");
  if (group < 1 || group > shape_[0] || w.shape[1] * group != shape_[0] || w.shape[0] % group != 0)
    refuse(node, "its weight takes " + std::to_string(w.shape[1]) + " channels in each of " +
                     std::to_string(group) + " group(s) to " + std::to_string(w.shape[0]) +
                     " outputs, the chain gives " + shape_.str());
  const auto kernel = std::make_pair(w.shape[2], w.shape[3]);
  const auto stride = twoInts(node, "strides", 1);
  const auto pad = withPadded(node, pads(node));
  std::map<std::string, AttrValue> attrs{{"out", w.shape[0]},
                                         {"in", shape_[0]},
                                         {"kernel", list(kernel)},
                                         {"stride", list(stride)},
                                         {"padding", list(pad)}};
  if (group != 1) attrs["groups"] = group;
  std::vector<HostTensor> params{w};
  if (node.input_size() > 2 && !node.input(2).empty()) {
    HostTensor b = tensor(node, node.input(2));
    if (b.data.size() != static_cast<size_t>(w.shape[0]))
      refuse(node, "its bias has " + std::to_string(b.data.size()) + " values for " +
                       std::to_string(w.shape[0]) + " channels");
    b.shape = Shape{w.shape[0]};
    params.push_back(std::move(b));
  } else {
    attrs["bias"] = int64_t{0};
  }
  add({"conv2d", attrs, {}, where(node)}, std::move(params));
  shape_ = windowed(node, w.shape[0], kernel, stride, pad);
}

Shape Importer::windowed(const onnx::NodeProto& node, int64_t channels,
                         std::pair<int64_t, int64_t> kernel, std::pair<int64_t, int64_t> stride,
                         std::pair<int64_t, int64_t> pad, bool ceil) {
  for (int64_t v : {kernel.first, kernel.second, stride.first, stride.second})
    if (v <= 0 || v > kMaxDim) refuse(node, "kernel sizes and strides must be in [1, 2^30]");
  for (int64_t v : {pad.first, pad.second})
    if (v < 0 || v > kMaxDim) refuse(node, "pads must be in [0, 2^30]");
  const int64_t h = shape_[1] + 2 * pad.first - kernel.first;
  const int64_t w = shape_[2] + 2 * pad.second - kernel.second;
  if (h < 0 || w < 0)
    refuse(node, "its window " + std::to_string(kernel.first) + "x" +
                     std::to_string(kernel.second) + " is larger than its padded input " +
                     shape_.str());
  Window2d g{channels,     shape_[1],     shape_[2], kernel.first, kernel.second,
             stride.first, stride.second, pad.first, pad.second};
  g.ceil = ceil;
  Shape out{channels, g.outHeight(), g.outWidth()};
  checkSize(node, out);
  return out;
}

void Importer::checkSize(const onnx::NodeProto& node, const Shape& shape) const {
  int64_t n = 1;
  for (int k = 0; k < shape.rank(); ++k)
    if (shape[k] <= 0 || __builtin_mul_overflow(n, shape[k], &n) || n > kMaxValues)
      refuse(node, "it makes samples of " + shape.str() + ": empty, or over 2^32 values");
}

void Importer::pool(const onnx::NodeProto& node) {
  requireRank(node, 3);
  noDilation(node);
  const bool ceil = attrInt(node, "ceil_mode", 0) != 0;
  if (ceil && node.op_type() == "AveragePool")
    refuse(node, "ceil_mode is supported for MaxPool only (an average's partial windows are not)");
  if (attrInt(node, "storage_order", 0) != 0) refuse(node, "storage_order is not supported");
  const auto kernel = twoInts(node, "kernel_shape", 0);
  if (kernel.first <= 0 || kernel.second <= 0) refuse(node, "it has no 2-d kernel_shape");
  const auto stride = twoInts(node, "strides", 1);
  auto pad = pads(node);
  const bool avg = node.op_type() == "AveragePool";
  if (avg && (pad.first || pad.second) && attrInt(node, "count_include_pad", 0) == 0)
    refuse(node, "padding left out of the average (count_include_pad 0) is not supported");
  pad = withPadded(node, pad);  // a Pad's zeros before it: averaged as tandem's padding is
  if (pad.first > kernel.first / 2 || pad.second > kernel.second / 2)
    refuse(node, "pads over half the kernel are not supported");
  std::map<std::string, AttrValue> attrs{
      {"kernel", list(kernel)}, {"stride", list(stride)}, {"padding", list(pad)}};
  if (ceil) attrs["ceil"] = int64_t{1};
  add({avg ? "avgpool2d" : "maxpool2d", attrs, {}, where(node)});
  shape_ = windowed(node, shape_[0], kernel, stride, pad, ceil);
}

void Importer::pad(const onnx::NodeProto& node) {
  const auto* mode = attr(node, "mode");
  if (mode && mode->s() != "constant") refuse(node, "only constant padding is supported");
  if (node.input_size() > 2 && !node.input(2).empty() && scalar(node, node.input(2)) != 0)
    refuse(node, "only padding with zeros is supported");
  std::vector<int64_t> p = attrInts(node, "pads");  // (before opset 11)
  if (node.input_size() > 1 && !node.input(1).empty()) p = int64s(node, node.input(1));
  const size_t rank = static_cast<size_t>(shape_.rank()) + 1;
  if (p.size() != 2 * rank) refuse(node, "expected " + std::to_string(2 * rank) + " pads");
  bool zero = true;
  for (int64_t v : p) zero = zero && v == 0;
  if (zero) return;
  if (rank != 4 || p[0] || p[1] || p[4] || p[5] || p[2] != p[6] || p[3] != p[7])
    refuse(node, "only the same padding of H and W at both ends is supported");
  padded_ = &node;
  pending_pad_ = {p[2], p[3]};
}

std::pair<int64_t, int64_t> Importer::withPadded(const onnx::NodeProto& node,
                                                 std::pair<int64_t, int64_t> pad) {
  if (!padded_) return pad;
  if (pad.first || pad.second) refuse(node, "padded twice (by a Pad before it, and its own pads)");
  padded_ = nullptr;
  return pending_pad_;
}

void Importer::flatten(const onnx::NodeProto& node) {
  if (shape_.rank() > 1) add({"flatten", {}, {}, where(node)});
  shape_ = Shape{shape_.numel()};
}

void Importer::spatialMean(const onnx::NodeProto& node) {
  requireRank(node, 3);
  std::vector<int64_t> axes = attrInts(node, "axes");
  if (node.input_size() > 1 && !node.input(1).empty()) axes = int64s(node, node.input(1));
  for (int64_t& a : axes)
    if (a < 0) a += 4;
  std::sort(axes.begin(), axes.end());
  if (axes != std::vector<int64_t>{2, 3})
    refuse(node, "only a mean over the two spatial axes (2, 3) is supported");
  add({"globalavgpool", {}, {}, where(node)});
  shape_ = Shape{shape_[0]};
}

}  // namespace tandem::onnx_io
