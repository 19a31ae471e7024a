// A job's or a command's `model`: a YAML model spec, a model file (`.tdm`) with its
// weights, an ONNX model (`.onnx`) imported as one (onnx/) with its initializers as the
// starting weights, or a Hugging Face Llama-architecture folder (hf/llama.h) with its
// weights. The spec travels as YAML text
// in every case, so nodes never see ONNX or safetensors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/model_file.h"
#include "hf/text_codec.h"

namespace tandem::runtime {

struct ModelSource {
  std::string spec_yaml;  // the spec's text, as placed, shipped to nodes and hashed
  ModelSpec spec;
  // The weights a model file, ONNX model or folder brings, as a model file's bytes; null
  // for a YAML spec.
  std::shared_ptr<const std::vector<uint8_t>> weights;
  // What serving applies to the outputs ("softmax", "log_softmax"; "" for nothing): an
  // ONNX model's dropped output node.
  std::string output;
};

// True when `path` names an ONNX model (ends in ".onnx").
bool isOnnxModel(const std::string& path);
// True when `path` names a model file (ends in ".tdm").
bool isModelFile(const std::string& path);
// True when `path` is a folder holding config.json (a Hugging Face model).
bool isHuggingFaceFolder(const std::string& path);
// True when the model at `path` brings its own weights (a model file, an ONNX model, a
// Hugging Face folder): a job of it may generate or serve without `weights:`.
bool bringsWeights(const std::string& path);

// Reads `path`: a spec (loadModelSpec's errors), a model file (readModelFile's), an ONNX model
// (importOnnx's; with a note per dropped node logged) or a Hugging Face folder (importLlama's). A
// build without ONNX (TANDEM_ONNX=OFF, the ARM builds) refuses an ONNX model with InvalidArgument
// saying so.
ModelSource readModelSource(const std::string& path);

// A model with its weights: a model file (.tdm, readModelFile's errors), an ONNX model
// imported as one (its metadata "output" when it ended in a softmax), or a Hugging Face
// folder.
ModelFile readModelOrOnnx(const std::string& path);

// What a job's model reads and writes as text (hf/text_codec.h): a Hugging Face folder's
// tokenizer.json, the tokenizer a `weights` model file carries, or bytes. `vocab` is the
// model's head width, which the tokenizer's ids must fit.
hf::TextCodec textCodecOf(const std::string& model, const std::string& weights, int64_t vocab);

// How `data` becomes tokens for `model` (hf::textTokensFor, from the tokenizer the model
// file `file` keeps), the tokenizer's use logged.
TextTokens textTokensOf(const ModelFile& file, const Model& model, const std::string& data,
                        const std::string& name);

}  // namespace tandem::runtime
