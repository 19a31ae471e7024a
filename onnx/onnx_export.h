// ONNX out: a tandem model (its layers and weights, as a model file holds them) as an
// ONNX graph (opset 17) that ONNX's checker and shape inference accept, so a model
// trained across devices runs on any ONNX runtime. Each layer becomes the operators an
// exporter writes for it (PyTorch's, where it has them):
//   linear      Gemm (transB) on [N, in]; MatMul + Add on [N, ..., in]
//   conv2d      Conv;  maxpool2d / avgpool2d  MaxPool / AveragePool (counting padding)
//   globalavgpool  GlobalAveragePool + Flatten;  flatten  Flatten (axis 1)
//   relu, tanh, sigmoid  the same;  gelu  x * (1 + Erf(x / sqrt(2))) * 0.5
//   dropout     Dropout (ratio as an input: the identity when run for inference)
//   layernorm   LayerNormalization (axis -1);  embedding  Gather of int64 ids
//   residual    the body, Add of it to the input or to its 1x1 Conv / Gemm projection
//   positional  Slice of the table's rows [0, T), Add
//   attention   qkv MatMul + Add, Reshape to heads, Transpose, Gather q/k/v, q k^T / sqrt(hs),
//               Where (the causal mask, -inf), Softmax, times v, back to [N, T, D], out
//               MatMul + Add — as PyTorch exports a GPT's attention written out
//   transformer its two residual blocks
// importOnnx() reads every one of these back: import of an export is bitwise the model.
#pragma once

#include <string>

#include "core/model_file.h"

namespace onnx {
class ModelProto;
}

namespace tandem::onnx_io {

// The graph of `file`'s layers with its parameters as initializers, named as tandem names
// them ("3.weight"); InvalidArgument if the file's parameters do not fit its layers.
onnx::ModelProto exportOnnx(const ModelFile& file);

// exportOnnx(), checked and written to `path` (a temporary file renamed over it).
void writeOnnx(const ModelFile& file, const std::string& path);

}  // namespace tandem::onnx_io
