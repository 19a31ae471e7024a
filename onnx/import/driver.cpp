// The walk from the graph's input to its output, node by node or pattern by pattern,
// and the library's entry points.
#include <onnx/checker.h>

#include <fstream>

#include "backends/cpu/cpu_backend.h"
#include "onnx/import/importer.h"

#include "core/error.h"

namespace tandem::onnx_io {

ImportedModel Importer::run() {
  const onnx::GraphProto& g = m_.graph();
  for (const onnx::TensorProto& t : g.initializer()) constants_[t.name()] = &t;
  taken_.assign(static_cast<size_t>(g.node_size()), false);
  // (ONNX's checker has made sure each value is made before it is used.)
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& node = g.node(i);
    for (const std::string& out : node.output()) producer_[out] = i;
    if (node.op_type() == "Constant") {
      constant(node);
      taken_[static_cast<size_t>(i)] = true;
      continue;
    }
    // An Identity of a constant is that constant under another name (PyTorch's exporter
    // makes one for each parameter whose values another's repeat, e.g. LayerNorms').
    if (node.op_type() == "Identity" && node.input_size() == 1 && constants_.count(node.input(0)) &&
        node.output_size() == 1) {
      constants_[node.output(0)] = constants_.at(node.input(0));
      taken_[static_cast<size_t>(i)] = true;
      continue;
    }
    // Shape arithmetic is folded where a Reshape or a Slice reads it, never walked.
    if (shapeArithmetic(node)) {
      shape_values_.insert(node.output(0));
      taken_[static_cast<size_t>(i)] = true;
      continue;
    }
    for (const std::string& in : node.input())
      if (!in.empty() && !constants_.count(in) && !shape_values_.count(in)) {
        std::vector<int>& c = consumers_[in];
        if (c.empty() || c.back() != i) c.push_back(i);
      }
  }
  findInput(g);
  out_.spec.name = g.name().empty() ? "onnx" : g.name();
  layers_ = &out_.spec.layers;
  const std::string end = walk(value_);
  if (g.output_size() != 1 || g.output(0).name() != end)
    throw InvalidArgument(source_ + ": the graph's output is not the end of its chain of nodes ('" +
                          end + "')");
  for (int i = 0; i < g.node_size(); ++i)
    if (!taken_[static_cast<size_t>(i)])
      refuse(g.node(i), "it is not on the way from the input to the output");
  if (padded_) refuse(*padded_, "a Pad at the output is not supported");
  if (out_.spec.layers.empty())
    throw InvalidArgument(source_ + ": no layer is left once dropped nodes are removed");
  mergeTransformers(out_.spec.layers);
  return std::move(out_);
}

std::string Importer::walk(std::string v) {
  for (;;) {
    seen_shapes_[v] = shape_;
    const std::vector<int> next = live(v);
    if (next.empty()) return v;
    if (ids_ && node(next[0]).op_type() != "Gather")
      refuse(node(next[0]), "the input '" + v +
                                "' holds integer ids: only an embedding (a Gather from an "
                                "initializer) can take them");
    if (next.size() == 1) {
      if (auto end = attention(v, next[0])) {
        v = *end;
      } else if (auto end2 = positional(v, next[0])) {
        v = *end2;
      } else {
        v = single(next[0], v);
      }
    } else if (auto end = gelu(v, next)) {
      v = *end;
    } else if (auto silu_end = silu(v, next)) {
      v = *silu_end;
    } else if (auto end2 = layerNormPattern(v, next)) {
      v = *end2;
    } else if (auto gated = gate(v, next)) {
      v = *gated;
    } else if (auto joined = concat(v, next)) {
      v = *joined;
    } else if (next.size() == 2 || sums(v, next) == 1) {
      v = residual(v, next);
    } else {
      refuse(node(next[2]), "'" + v + "' is read by " + std::to_string(next.size()) +
                                " nodes: a graph tandem's layer list cannot express");
    }
  }
}

std::string Importer::single(int i, const std::string& v) {
  const onnx::NodeProto& node = this->node(i);
  take({i});
  const std::string& op = node.op_type();
  if (op == "Gather") return gather(node, v);
  if (node.input_size() == 0 || node.input(0) != v)
    refuse(node, "it does not continue the chain: its first input is '" +
                     (node.input_size() ? node.input(0) : std::string()) +
                     "', not the previous node's output '" + v + "'");
  for (int k = 1; k < node.input_size(); ++k)
    if (!node.input(k).empty() && !constants_.count(node.input(k)) &&
        !shape_values_.count(node.input(k)))
      refuse(node, "its input '" + node.input(k) +
                       "' is computed, not an initializer: a branch tandem's layer list "
                       "cannot express");
  for (int k = 1; k < node.output_size(); ++k)
    if (!node.output(k).empty() && (!live(node.output(k)).empty() || isOutput(node.output(k))))
      refuse(node, "its output '" + node.output(k) + "' is used: only one output may be");
  if (padded_ && op != "Conv" && op != "AveragePool")
    refuse(*padded_,
           "a Pad only before a Conv or an AveragePool (whose padding its zeros "
           "are) is supported; its reader is " +
               op);
  if (op == "Gemm") {
    gemm(node);
  } else if (op == "MatMul") {
    return matmul(node);
  } else if (op == "Conv") {
    conv(node);
  } else if (op == "MaxPool" || op == "AveragePool") {
    pool(node);
  } else if (op == "GlobalAveragePool") {
    requireRank(node, 3);
    add({"globalavgpool", {}, {}, where(node)});
    shape_ = Shape{shape_[0]};
  } else if (op == "Relu" || op == "Tanh" || op == "Sigmoid") {
    add({op == "Relu" ? "relu" : op == "Tanh" ? "tanh" : "sigmoid", {}, {}, where(node)});
  } else if (op == "Clip" || op == "HardSigmoid" || op == "HardSwish") {
    add({hardActivation(node), {}, {}, where(node)});
  } else if (op == "Flatten") {
    if (attrInt(node, "axis", 1) != 1)
      refuse(node, "axis " + std::to_string(attrInt(node, "axis", 1)) +
                       ": tandem flattens each sample (axis 1) only");
    flatten(node);
  } else if (op == "Reshape") {
    return reshape(node);
  } else if (op == "Slice") {
    channels(node);
  } else if (op == "ReduceMean") {
    spatialMean(node);
  } else if (op == "Dropout") {
    double p = attrFloat(node, "ratio", 0.5);
    if (node.input_size() > 1 && !node.input(1).empty()) p = scalar(node, node.input(1));
    add({"dropout", {{"p", p}}, {}, where(node)});
  } else if (op == "LayerNormalization") {
    layerNorm(node);
  } else if (op == "BatchNormalization") {
    batchNorm(node);
  } else if (op == "Pad") {
    pad(node);
  } else if (op == "Identity" || (op == "Concat" && node.input_size() == 1)) {
  } else if (op == "Softmax" || op == "LogSoftmax") {
    if (!isOutput(node.output(0)) || !live(node.output(0)).empty())
      refuse(node, "a softmax only at the output is dropped; this one is not");
    // Over the last axis only: before opset 13 the axis (default 1) splits the tensor in
    // two and normalises all that follows, which is the last axis for [N, C] alone.
    const int64_t rank = shape_.rank() + 1;
    int64_t axis = attrInt(node, "axis", opset() >= 13 ? -1 : 1);
    if (axis < 0) axis += rank;
    if (axis != rank - 1) refuse(node, "a softmax over other than the last axis is not supported");
    out_.output = op == "Softmax" ? "softmax" : "log_softmax";
    out_.notes.push_back("dropped " + op + " node '" + node.name() +
                         "' at the output: tandem's loss applies it in training, serving "
                         "applies it to the answers");
  } else {
    refuse(node, "tandem has no layer for this operator");
  }
  return node.output(0);
}

namespace {

// What `device` lacks for each imported layer: refused where it cannot run the forward, a
// note where it cannot train it.
void checkRunsOn(ImportedModel& imported, const Backend& device) {
  const Model model(imported.spec);
  const std::string name = device.info().name;
  for (size_t i = 0; i < model.size(); ++i) {
    const Layer& layer = model.layer(i);
    const std::string at = imported.spec.layers[i].where;
    const std::vector<OpUse> serve = device.lacking(layer.ops(false));
    if (!serve.empty())
      throw InvalidArgument(at + ": " + name + " cannot run it (a " + layer.type() +
                            " layer): its backend lacks " + opUseNames(serve));
    std::vector<OpUse> train = device.lacking(layer.ops(true));
    if (i + 1 == model.size() && !device.supports(Op::kSoftmaxCrossEntropy, DType::kF32))
      train.push_back({Op::kSoftmaxCrossEntropy, DType::kF32});
    if (!train.empty())
      imported.notes.push_back(at + ": " + name + " can serve this " + layer.type() +
                               " layer but not train it: its backend lacks " + opUseNames(train));
  }
}

}  // namespace

ImportedModel importOnnx(const onnx::ModelProto& model, const std::string& source,
                         const Backend* device) {
  try {
    onnx::checker::check_model(model);
  } catch (const std::exception& e) {
    throw FormatError(source + ": ONNX's checker refuses it: " + e.what());
  }
  Importer importer(model, source);
  ImportedModel imported = importer.run();
  if (device) checkRunsOn(imported, *device);
  return imported;
}

ImportedModel importOnnx(const std::string& path, const Backend* device) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw IoError("cannot open the ONNX model '" + path + "'");
  std::string data(static_cast<size_t>(in.tellg()), '\0');  // read once, straight in
  in.seekg(0);
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  if (!in) throw IoError("cannot read the ONNX model '" + path + "'");
  onnx::ModelProto model;
  if (data.empty() || !model.ParseFromString(data))
    throw FormatError(path + ": not an ONNX model (the protobuf does not parse)");
  return importOnnx(model, path, device);
}

ModelFile toModelFile(const ImportedModel& imported) {
  // (The backend first: the built parameters must go before it.)
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model model(imported.spec);
  model.build(be, 0);
  const std::vector<Param*>& params = model.params();
  TANDEM_CHECK_MSG(params.size() == imported.params.size(), InvalidArgument,
                   "the imported model has " << imported.params.size()
                                             << " parameter tensors, its layers " << params.size());
  ModelFile f;
  f.spec = imported.spec;
  for (size_t i = 0; i < params.size(); ++i) {
    HostTensor h = imported.params[i];
    h.name = params[i]->name;
    f.params.push_back(std::move(h));
  }
  f.metadata["imported_from"] = std::string("onnx");
  if (!imported.output.empty()) f.metadata["output"] = imported.output;
  return f;
}

}  // namespace tandem::onnx_io
