// ONNX in: a graph of ONNX operators with its initializers, read with Debian's ONNX
// protobuf classes and checker (libonnx-dev), as tandem's layer list with weights. Kept out
// of core/ (which knows no protobuf): the CLI's `tandem import` and tests use it.
//
// The graph is followed from its one data input to its one output. A value read by one
// node continues the chain (or begins an attention or positional pattern); one read by
// two is a GELU or LayerNorm pattern, or a residual block (a branch and an Add of it to
// the value or to a 1x1 Conv / Gemm projection of it); by three, a residual block whose
// branch begins with the decomposed LayerNorm:
//   Gemm (alpha = beta = 1, transA = 0), MatMul with an initializer (+ Add of one) -> linear
//   Conv (no dilation, one group, symmetric pads)                              -> conv2d
//   MaxPool / AveragePool (symmetric pads, no ceil mode; AveragePool counting
//   padding when padded), GlobalAveragePool                                    -> pooling
//   Relu, Tanh, Sigmoid                                                        -> same
//   Flatten (axis 1), Reshape to [N, rest]                                     -> flatten
//   Dropout -> dropout; Identity -> nothing; Softmax / LogSoftmax as the last node -> dropped
//   BatchNormalization (per channel; its statistics initializers)          -> batchnorm
//   LayerNormalization (last axis), or ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div
//   (+ Mul, Add)                                                               -> layernorm
//   Div by sqrt(2), Erf, Add 1, Mul by x and by 0.5                            -> gelu
//   Gather of the integer input ids from an initializer                        -> embedding
//   Add of a [T, D] initializer, or of a Slice of its rows [0, T)              -> positional
//   qkv MatMul+Add, Reshape [N, T, 3, H, hs], Transpose, Gather q/k/v, q k^T / sqrt(hs),
//   (Where: causal mask, -inf), Softmax, MatMul v, Transpose, Reshape, out MatMul+Add
//                                                                              -> attention
//   residual [layernorm, attention] then residual [layernorm, linear, gelu, linear]
//                                                                              -> transformer
// Constant nodes (and Identity nodes of constants) feed other nodes' constant inputs. Anything else
// — an operator tandem has no layer for, an attribute it does not support, a branch that is no
// residual block, a second data input — is refused naming the node, its operator and why: never a
// silently different model.
#pragma once

#include <string>
#include <vector>

#include "core/model.h"
#include "core/model_file.h"

namespace onnx {
class ModelProto;
}

namespace tandem::onnx_io {

struct ImportedModel {
  ModelSpec spec;
  // Every layer's parameters in the model's order (weight, then bias), named as the
  // ONNX initializers were; Model::params() of the built spec has the same order.
  std::vector<HostTensor> params;
  std::vector<std::string> notes;  // what was dropped or folded, for the user
  // What the dropped output node applied ("softmax", "log_softmax"; "" if none): training
  // leaves it to the loss, serving applies it (the model file's metadata "output").
  std::string output;
};

// FormatError for a file that is not a valid ONNX model (unreadable, not protobuf, or
// refused by ONNX's checker); InvalidArgument naming the node for a graph tandem cannot
// express.
//
// With a `device`, the graph is imported for it: a layer whose forward uses an op the
// device's backend lacks (Backend::supports) is refused naming its ONNX node and the ops;
// one it can serve but not train (an op of its backward, or the loss) is imported with a
// note saying so.
ImportedModel importOnnx(const std::string& path, const Backend* device = nullptr);
ImportedModel importOnnx(const onnx::ModelProto& model, const std::string& source,
                         const Backend* device = nullptr);

// The imported model as a model file's contents: the spec with the parameters named as
// the built model names them, and metadata "output" when the graph ended in a softmax.
ModelFile toModelFile(const ImportedModel& imported);

}  // namespace tandem::onnx_io
