// Model files (.tdm, FlatBuffers, core/schema/model.fbs): the layer list with its
// hyper-parameters, the weights, optionally the optimizer state, and metadata.
//
// Reading is two steps: readModelFile() verifies the buffer and copies it into host
// structures (no backend needed, so `tandem inspect` can read a file); loadModel() then
// makes the Model on a backend and checks every weight's name and shape.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/file.h"
#include "core/model.h"
#include "core/optimizer.h"

namespace tandem {

constexpr uint32_t kModelFormatVersion = 1;

// A tensor read from a file: f32 values in `data`, or (dtype i8: int8 weights,
// core/layers/weight_matrix.h) its bytes in `i8`.
struct HostTensor {
  HostTensor() = default;
  HostTensor(std::string name_, Shape shape_, std::vector<float> data_)
      : name(std::move(name_)), shape(std::move(shape_)), data(std::move(data_)) {}

  std::string name;
  Shape shape;
  std::vector<float> data;
  DType dtype = DType::kF32;
  std::vector<int8_t> i8;
};

struct OptimizerSnapshot {
  OptimizerOptions options;
  int64_t steps = 0;
  std::vector<HostTensor> tensors;
};

struct ModelFile {
  ModelSpec spec;
  std::vector<HostTensor> params;
  std::optional<OptimizerSnapshot> optimizer;
  std::map<std::string, AttrValue> metadata;
};

// Serialises a built model (and the optimizer's state, if given).
std::vector<uint8_t> serializeModel(const Model& model, const Optimizer* optimizer,
                                    const std::map<std::string, AttrValue>& metadata);
// Writes atomically: a temporary file renamed over `path`, so a crash never leaves a
// half-written model behind.
void saveModel(const std::string& path, const Model& model, const Optimizer* optimizer,
               const std::map<std::string, AttrValue>& metadata = {});

// A parameter whose f32 values a writer asks for once, straight into the file's buffer:
// `fill` writes the shape's numel values into the span it is given. An importer writes a
// model file this way without building the model or holding its weights twice.
// `extents`, where given, hold those values already as a model file stores them (f32 in
// the host's byte order, one after another, the extents in order; `fill` still gives
// them): writeModelFile copies them file to file instead of asking `fill`.
struct ParamFill {
  std::string name;
  Shape shape;
  std::function<void(std::span<float>)> fill;
  std::vector<FileExtent> extents;
};

// A model file of `spec` with these parameters (in the order the built model lists them)
// and metadata: the bytes serializeModel() writes for that model built and loaded with
// them. The spec must make a model (InvalidArgument naming what is wrong) and the
// parameters hold the number of values its layers do (InvalidArgument otherwise: a name or
// shape the layers disagree with is caught where the file is loaded).
std::vector<uint8_t> serializeModelFile(const ModelSpec& spec, const std::vector<ParamFill>& params,
                                        const std::map<std::string, AttrValue>& metadata);
// ... written atomically to `path` from the buffer it is built in (no copy of it), the
// parameters with extents copied from their files into place (InvalidArgument naming one
// whose extents hold other than its values' bytes; IoError naming it when they cannot be
// read).
void writeModelFile(const std::string& path, const ModelSpec& spec,
                    const std::vector<ParamFill>& params,
                    const std::map<std::string, AttrValue>& metadata);

// The model file `bytes` with only the parameters of the layers in `ranges`, and their
// optimizer state: what a pipeline stage over those layers loads (loadWeights(model, file,
// false)), with the file's spec, metadata and optimizer settings. Layer i's parameters are
// named "i.<...>" (Model::build); a tensor named otherwise is kept. The other layers'
// values are never copied. FormatError naming `source` as parseModelFile raises it.
std::vector<uint8_t> sliceModelFile(std::span<const uint8_t> bytes,
                                    const std::vector<LayerRange>& ranges,
                                    const std::string& source);

// Verifies and decodes; every defect raises FormatError naming `source` and the defect.
ModelFile parseModelFile(std::span<const uint8_t> bytes, const std::string& source);
ModelFile readModelFile(const std::string& path);

// Makes the model on `backend` with the file's weights.
std::unique_ptr<Model> loadModel(const ModelFile& file, Backend& backend);
// Uploads the file's weights into the model's built parameters (a pipeline stage's slice
// takes its own from a whole model's file). FormatError if one is missing or has another
// shape, or, when `exact`, if the file has parameters the built layers do not.
void loadWeights(Model& model, const ModelFile& file, bool exact);
// The optimizer as saved; InvalidArgument if the file holds no optimizer state.
std::unique_ptr<Optimizer> loadOptimizer(const ModelFile& file, Backend& backend);
// Restores into `optimizer` the file's state for `model`'s built parameters, on the model's
// backend (a pipeline stage's from a whole model's checkpoint). FormatError naming `who`
// when the file holds no optimizer state.
void restoreOptimizerState(Optimizer& optimizer, const Model& model, const ModelFile& file,
                           const std::string& who);

}  // namespace tandem
