// The ONNX importer (onnx_import.h's importOnnx) inside: one class whose state is the
// graph being read and the layers made so far, its parts in files by what they
// recognise, as pnnx splits its passes: the graph and attribute helpers (graph.cpp), the
// plain operators (ops.cpp), one file per pattern of several nodes (gelu.cpp,
// layer_norm.cpp, attention.cpp, positional.cpp, gate.cpp, residual.cpp: residual blocks
// and the transformer merge), and the walk that drives them (driver.cpp). Not part of the
// library's interface.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <deque>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "onnx/onnx_import.h"

namespace tandem::onnx_io {

// The largest tensor an initializer may declare (dims multiplied, checked for overflow
// before anything is allocated): 4 Gi values.
inline constexpr int64_t kMaxValues = int64_t{1} << 32;
// The largest size, stride or pad along one dimension.
inline constexpr int64_t kMaxDim = int64_t{1} << 30;

// Reads one model's graph once (run()): every node imported into a layer, or the model
// refused naming the node. What each member recognises is said at it.
class Importer {
 public:
  Importer(const onnx::ModelProto& m, std::string source) : m_(m), source_(std::move(source)) {}

  ImportedModel run();

 private:
  const onnx::NodeProto& node(int i) const { return m_.graph().node(i); }

  // The default domain's opset the model declares.
  int64_t opset() const;

  // The nodes not imported yet that read `value`, in graph order.
  std::vector<int> live(const std::string& value) const;

  bool isOutput(const std::string& value) const;

  // The one node of type `op` that reads `value`, when it is the value's only reader and
  // the value is not a graph output; else -1.
  int only(const std::string& value, const std::string& op) const;

  void take(std::initializer_list<int> nodes);

  // Imports the chain that starts at `v`, up to where no node reads on: the value there.
  std::string walk(std::string v);

  // One node of the chain (with the bias Add after a MatMul): the value it makes.
  std::string single(int i, const std::string& v);

  // A scalar constant's value (float, double or integer), if `name` is one.
  std::optional<double> constScalar(const std::string& name) const;

  // A two-input node `op` of `v` and a scalar constant near `want` (either order when
  // `commutes`).
  bool withScalar(const onnx::NodeProto& n, const std::string& op, const std::string& v,
                  double want, bool commutes) const;

  // The node that reads both a and b, when it is `op` and the only reader of each.
  static bool reads(const onnx::NodeProto& n, const std::string& a, const std::string& b);

  // GELU as PyTorch exports it: x * (1 + erf(x / sqrt(2))) * 0.5 — Div (or Mul by
  // 1/sqrt(2)), Erf, Add 1, then Mul by x and by 0.5 in either order.
  std::optional<std::string> gelu(const std::string& v, const std::vector<int>& next);

  // SiLU as PyTorch exports it: x * Sigmoid(x), the Mul reading both.
  std::optional<std::string> silu(const std::string& v, const std::vector<int>& next);

  // Branches from `v` (one per reader) joined by a Concat along channels (axis 1): a
  // `concat` layer, a branch of several layers a `chain`. The join is the first Concat
  // not imported yet whose inputs, as many as `v` has readers, all descend from `v` — or
  // are `v` itself, read by the join: an `identity` branch; none such, or readers that are
  // a residual block's (an Add of `v`, or a projection whose only reader is an Add):
  // nullopt. Each branch is walked with the other readers set aside; one that does not
  // end at an input of the join, or shapes that do not meet, are refused naming it.
  std::optional<std::string> concat(const std::string& v, const std::vector<int>& next);

  // A DenseNet block as torchvision writes it: `v` read by Concats only, along channels,
  // each with `v` first, one with 1 input, one with 2, ... n + 1. Layer k (k = 1..n) reads
  // the Concat of k inputs (v and the features f1..f(k-1) of the layers before) and makes
  // f_k; the Concat of k + 1 inputs is that input with f_k appended. Each becomes a
  // `concat` of [identity, the layer's chain]. nullopt when `v`'s readers are not such
  // Concats; a layer that does not end in the next Concat's last input is refused.
  std::optional<std::string> dense(const std::string& v, const std::vector<int>& next);
  // Whether `value` is computed from `from` (through any nodes).
  bool descends(const std::string& value, const std::string& from) const;

  // y = v * branch(v): a Mul that reads `v` and the end of the branch its other reader
  // begins (through an Unsqueeze to [N, C, 1, 1], as tandem exports per-channel values):
  // a `gate` layer whose body is the branch. Not one: nullopt. The branch keeps v's shape
  // or gives [C] for a [C, H, W] v (squeeze-and-excitation); else refused naming the Mul.
  std::optional<std::string> gate(const std::string& v, const std::vector<int>& next);

  // The layer of a Clip (to [0, 6]: relu6; to [0, inf): relu), a HardSigmoid (PyTorch's:
  // alpha 1/6, beta 1/2) or a HardSwish; any other range or slope is refused, named.
  std::string hardActivation(const onnx::NodeProto& node) const;

  // The axes of a ReduceMean (attribute, or input from opset 18) are the last one alone.
  bool lastAxis(const onnx::NodeProto& n) const;

  // A per-feature constant [dim] (or a scalar, broadcast) read by `n` beside `v`.
  std::optional<HostTensor> feature(const onnx::NodeProto& n, const std::string& v, int64_t dim);

  // LayerNorm over the last dimension as exporters before opset 17 write it:
  // d = x - ReduceMean(x); d / Sqrt(ReduceMean(Pow(d, 2)) + eps), then Mul by the scale
  // and Add of the bias when the model has them.
  std::optional<std::string> layerNormPattern(const std::string& v, const std::vector<int>& next);

  // LayerNormalization (opset 17) over the last dimension.
  void layerNorm(const onnx::NodeProto& node);

  // BatchNormalization over the channels (dimension 1): scale, bias, running mean and
  // variance as initializers -> batchnorm (training with batch statistics, inference with
  // the running ones). A Conv's BatchNormalization folded by the exporter never reaches it.
  void batchNorm(const onnx::NodeProto& node);

  // Gather of the input's integer ids from an initializer table: an embedding.
  std::string gather(const onnx::NodeProto& node, const std::string& v);

  // --- transformer layers ----------------------------------------------------------

  // A bool constant's values (raw bytes or int32_data), if `name` is one of `count`.
  std::optional<std::vector<bool>> constBools(const std::string& name, int64_t count) const;

  // The node of `op` that is the only reader of `value`, or a refusal naming what the
  // attention pattern expected there.
  int expect(const std::string& value, const std::string& op, const onnx::NodeProto& from);

  void expectPerm(const onnx::NodeProto& n, const std::vector<int64_t>& perm) const;

  // The out-projection or qkv MatMul with a weight initializer [in, out] and the Add of a
  // bias [out] after it: (weight [out, in], bias, the value made); nullopt if it is not.
  std::optional<std::tuple<HostTensor, HostTensor, std::string, int>> projected(int mm, int64_t in);

  // Multi-head self-attention as PyTorch exports a module written out (and as tandem
  // exports it): x Wqkv + b, Reshape [N, T, 3, H, hs], Transpose (2, 0, 3, 1, 4), Gather
  // 0, 1, 2 on axis 0 (q, k, v), MatMul q by k Transposed (0, 1, 3, 2), Div by sqrt(hs)
  // (or Mul by its inverse), for a causal one Where(mask above the diagonal, -inf,
  // scores), Softmax on the last axis, MatMul by v, Transpose (0, 2, 1, 3), Reshape
  // [N, T, D], then x Wo + b. Not one: nullopt (a MatMul goes on as linear). Once the
  // Reshape to heads is seen, anything else is refused naming the node.
  std::optional<std::string> attention(const std::string& v, int mm);

  // A learned positional embedding, y = x + P[:T]: an Add of x [T, D] and either an
  // initializer [T, D] (PyTorch folds the slice of a table) or a Slice of rows [0, T) of
  // an initializer table [C, D]. Else nullopt.
  std::optional<std::string> positional(const std::string& v, int i);

  // Two residual blocks that are a transformer block's — [layernorm, attention (causal)]
  // then [layernorm, linear D->M, gelu, linear M->D], with default eps and biases — become
  // one `transformer` layer (one cut point, as written in a spec); the parameters keep
  // their order.
  static void mergeTransformers(std::vector<LayerSpec>& layers);

  // An Add of two computed values, one of them `v`: a residual block's join.
  bool sum(int i) const;
  // How many of `next` (the readers of `v`) are such Adds.
  int sums(const std::string& v, const std::vector<int>& next) const;

  // y = body(v) + shortcut: the node pair that reads `v` is the body's first node and
  // either the Add (identity shortcut) or a projection whose only reader is the Add; or,
  // when the body begins with a pattern of several nodes reading `v` (a LayerNorm as
  // exporters before opset 17 write it, in a pre-norm block), those and the one Add.
  std::string residual(const std::string& v, const std::vector<int>& next);

  // A 1x1 Conv with no bias, or a Gemm / MatMul with none: what tandem's projection is.
  bool projectionLike(const onnx::NodeProto& n) const;

  // A residual block's shortcut projection: tandem makes a 1x1 convolution whose stride
  // maps the input's H and W to the body's, or a linear layer, with or without a bias
  // (returned: whether it has one); anything else is refused. Its weight (and bias)
  // follow the body's parameters.
  bool projection(const onnx::NodeProto& p, const Shape& in);
  // The BatchNormalization after a shortcut projection (ResNet's downsample as it trains):
  // the block's proj_norm, proj_eps and proj_momentum; its parameters follow the
  // projection's.
  void projectionNorm(const onnx::NodeProto& n, LayerSpec& block);

  // "node 'conv1'", or for an unnamed node (PyTorch's exporter leaves them unnamed) "the
  // node making 'y'".
  static std::string named(const onnx::NodeProto& node);

  [[noreturn]] void refuse(const onnx::NodeProto& node, const std::string& why) const;

  std::string where(const onnx::NodeProto& node) const { return source_ + ": " + named(node); }

  void findInput(const onnx::GraphProto& g);

  void constant(const onnx::NodeProto& node);

  const onnx::AttributeProto* attr(const onnx::NodeProto& node, const std::string& name) const;
  int64_t attrInt(const onnx::NodeProto& node, const std::string& name, int64_t fallback) const;
  double attrFloat(const onnx::NodeProto& node, const std::string& name, double fallback) const;
  std::vector<int64_t> attrInts(const onnx::NodeProto& node, const std::string& name) const;

  // An initializer's values as float32, its dims checked against its data.
  HostTensor tensor(const onnx::NodeProto& node, const std::string& name) const;

  double scalar(const onnx::NodeProto& node, const std::string& name) const;

  void add(LayerSpec spec, std::vector<HostTensor> params = {});

  void requireRank(const onnx::NodeProto& node, int rank) const;

  // linear (over the last dimension) from a weight [out, in] and an optional bias [out].
  void linear(const onnx::NodeProto& node, HostTensor w, std::optional<HostTensor> b);

  static HostTensor transposed(const HostTensor& t);

  void gemm(const onnx::NodeProto& node);

  // MatMul with an initializer [in, out], and the Add of an initializer after it, if any:
  // the value made.
  std::string matmul(const onnx::NodeProto& node);

  // Symmetric pads [top, left, bottom, right] as (h, w).
  std::pair<int64_t, int64_t> pads(const onnx::NodeProto& node) const;

  std::pair<int64_t, int64_t> twoInts(const onnx::NodeProto& node, const std::string& name,
                                      int64_t fallback) const;

  void noDilation(const onnx::NodeProto& node) const;

  static std::vector<int64_t> list(std::pair<int64_t, int64_t> p) { return {p.first, p.second}; }

  void conv(const onnx::NodeProto& node);
  // A 1x1 Conv of a GlobalAveragePool's [C] (ONNX's [C, 1, 1]), as squeeze-and-excitation
  // writes its bottleneck: a linear layer.
  void pooledConv(const onnx::NodeProto& node);

  // The [C, H', W'] a 2-d window makes of [_, H, W], its sizes checked first: a hostile
  // file's zero stride or vast pad is refused, not divided by or overflowed.
  Shape windowed(const onnx::NodeProto& node, int64_t channels, std::pair<int64_t, int64_t> kernel,
                 std::pair<int64_t, int64_t> stride, std::pair<int64_t, int64_t> pad,
                 bool ceil = false);

  // A sample of at most kMaxValues values (the product checked for overflow).
  void checkSize(const onnx::NodeProto& node, const Shape& shape) const;

  void pool(const onnx::NodeProto& node);

  // Pad (constant zeros) of H and W alike at both ends, as PyTorch's exporter writes
  // before AveragePool: all zeros is nothing; else the next node takes it as its padding.
  void pad(const onnx::NodeProto& node);

  // `pad` with a Pad's before it added (once), when its reader is `node`.
  std::pair<int64_t, int64_t> withPadded(const onnx::NodeProto& node,
                                         std::pair<int64_t, int64_t> pad);

  void flatten(const onnx::NodeProto& node);

  // A ReduceMean over H and W of [N, C, H, W] (torch's x.mean([2, 3]), with or without
  // the kept dimensions): a globalavgpool.
  void spatialMean(const onnx::NodeProto& node);

  // A constant int64 vector (a shape, pads).
  std::vector<int64_t> int64s(const onnx::NodeProto& node, const std::string& name) const;

  // A Reshape: of each sample to one dimension (flatten), or of its channels into groups
  // that a Transpose and a Reshape shuffle (channelShuffle); the value made.
  std::string reshape(const onnx::NodeProto& node);

  // --- shape arithmetic (shapes.cpp) --------------------------------------------------

  // The batch dimension in a folded shape: the model leaves it open.
  static constexpr int64_t kBatch = std::numeric_limits<int64_t>::min();

  // A shape's integers as they are computed: a list, or a scalar (one value).
  struct Folded {
    std::vector<int64_t> values;
    bool scalar = false;
  };

  // Whether `n` computes from the shape of a value: a Shape, or Gather, Unsqueeze, Squeeze,
  // Concat, Add, Sub, Mul, Div, Cast or Slice of such values and integer constants (as
  // PyTorch exports `x.size()` with a dynamic batch). Such nodes are never walked; a Reshape or a
  // Slice that reads one folds it (shapeInts).
  bool shapeArithmetic(const onnx::NodeProto& n) const;

  // The integers of `name`: a constant int64 list (int64s), or shape arithmetic folded
  // with the shapes the walk has seen — kBatch for the batch; what cannot be folded is
  // refused naming its node.
  std::vector<int64_t> shapeInts(const onnx::NodeProto& reader, const std::string& name);
  Folded fold(const onnx::NodeProto& reader, const std::string& name, int depth);
  // A constant int64 or int32 scalar or list.
  Folded constFolded(const onnx::NodeProto& reader, const std::string& name) const;

  // A Slice of each sample's channels (axis 1, step 1; torch's chunk): a `slice` layer.
  void channels(const onnx::NodeProto& node);

  // A Reshape to [batch, G, K, rest...] of a [G * K, rest...] sample, the Transpose of G
  // and K, and the Reshape back, as torchvision's ShuffleNet writes its channel shuffle: a
  // `channel_shuffle` layer, the value made. nullopt when `to` is not such a split; a split
  // not followed by that Transpose and Reshape is refused naming the node.
  std::optional<std::string> channelShuffle(const onnx::NodeProto& node,
                                            const std::vector<int64_t>& to);

  const onnx::ModelProto& m_;
  std::string source_;
  std::map<std::string, const onnx::TensorProto*> constants_;
  std::deque<onnx::TensorProto> owned_;                // Constant nodes' tensors (stable addresses)
  std::map<std::string, std::vector<int>> consumers_;  // value -> the nodes reading it
  std::map<std::string, int> producer_;                // value -> the node making it
  std::set<std::string> shape_values_;                 // made by shape arithmetic
  std::map<std::string, Folded> folded_;               // shape arithmetic folded so far
  std::map<std::string, Shape> seen_shapes_;           // per sample, of values walked
  std::vector<bool> taken_;                            // per node: imported (or folded)
  ImportedModel out_;
  std::vector<LayerSpec>* layers_ = nullptr;  // where layers go: the model's or a block's
  std::string value_;                         // the graph's data input
  Shape shape_;                               // per sample, at the walk's current value
  bool ids_ = false;                          // the current value is the integer input
  const onnx::NodeProto* padded_ = nullptr;   // a Pad whose zeros the next node takes
  std::pair<int64_t, int64_t> pending_pad_;
};

}  // namespace tandem::onnx_io
