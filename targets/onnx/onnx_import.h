// ONNX in: a graph of ONNX operators with its initializers, read with Debian's ONNX
// protobuf classes and checker (libonnx-dev), as tandem's layer list with weights. Kept out
// of core/ (which knows no protobuf): the CLI's `tandem import` and tests use it.
//
// A graph imports when its nodes form a chain tandem's layers express, in order from the
// graph's one data input to its one output:
//   Gemm (alpha = beta = 1, transA = 0), MatMul with an initializer (+ Add of one) -> linear
//   Conv (no dilation, one group, symmetric pads)                              -> conv2d
//   MaxPool / AveragePool (symmetric pads, no ceil mode; AveragePool counting
//   padding when padded), GlobalAveragePool                                    -> pooling
//   Relu, Tanh, Sigmoid                                                        -> same
//   Flatten (axis 1), Reshape to [N, rest]                                     -> flatten
//   Dropout -> dropout; Identity -> nothing; Softmax / LogSoftmax as the last node -> dropped
// Constant nodes feed other nodes' constant inputs. Anything else — an operator tandem has
// no layer for, an attribute it does not support, a branch, a second data input — is
// refused naming the node, its operator and why: never a silently different model.
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
};

// FormatError for a file that is not a valid ONNX model (unreadable, not protobuf, or
// refused by ONNX's checker); InvalidArgument naming the node for a graph tandem cannot
// express.
ImportedModel importOnnx(const std::string& path);
ImportedModel importOnnx(const onnx::ModelProto& model, const std::string& source);

// The imported model as a model file's contents: the spec with the parameters named as
// the built model names them.
ModelFile toModelFile(const ImportedModel& imported);

}  // namespace tandem::onnx_io
