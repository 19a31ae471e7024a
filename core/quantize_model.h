// Whole model files to and from int8 weights (core/quantize.h, the layers' weight_matrix.h):
// what `tandem quantize` writes, and what the exporters take (ONNX and safetensors hold
// float weights, so an int8 model exports as the f32 values its weights stand for).
#pragma once

#include <cstdint>

#include "core/backend.h"
#include "core/model_file.h"

namespace tandem {

// The layers whose products take int8 weights: linear, attention, swiglu and the
// transformer and llama blocks (everywhere, inside residual blocks too).
bool takesInt8Weights(const std::string& layer_type);

// `file` with every such layer's weights in int8, `group` inputs per scale (0: one scale
// per output row); embeddings, norms and biases stay f32. The model is built on `backend`
// (a CPU backend will do) to name its parameters. InvalidArgument if the group does not
// divide a layer's inputs (naming it), if the model has no such layer, or if it is
// int8 already; the file's metadata is kept, its optimizer state dropped.
ModelFile quantizeModel(const ModelFile& file, int64_t group, Backend& backend);

// `file` with its int8 weights as the f32 values they stand for (the spec without
// `weights` and `group`); a model without int8 weights comes back unchanged (a copy:
// callers check hasInt8Weights first where the weights are large).
ModelFile dequantizeModel(const ModelFile& file);

// Whether any layer of `spec` holds int8 weights.
bool hasInt8Weights(const ModelSpec& spec);

}  // namespace tandem
