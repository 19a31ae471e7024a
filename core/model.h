// Model: a named, ordered list of layers with inferred per-sample shapes. A pipeline
// stage is a contiguous range [begin, end) of its layers.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/layers/sequence.h"
#include "core/layers/tensor_split.h"

namespace tandem {

// Layers [begin, end) of a model.
struct LayerRange {
  size_t begin = 0, end = 0;
  bool operator==(const LayerRange&) const = default;
};
// "[0, 3)", or "[0, 3), [6, 9)" for several.
std::string describe(const std::vector<LayerRange>& ranges);

struct ModelSpec {
  std::string name;
  Shape input;  // per sample, e.g. [1, 28, 28]
  std::vector<LayerSpec> layers;
};

class Model {
 public:
  static constexpr size_t kEnd = std::numeric_limits<size_t>::max();

  // Makes the layers and infers every shape; errors name the layer index, type,
  // source location and both shapes.
  explicit Model(const ModelSpec& spec);

  const std::string& name() const { return name_; }
  const Shape& inputShape() const { return input_; }
  const Shape& outputShape() const { return output_; }
  DType inputDType() const;
  size_t size() const { return layers_.size(); }
  Layer& layer(size_t i) { return layers_.layer(i); }
  const Layer& layer(size_t i) const { return layers_.layer(i); }

  // Allocates and initialises the parameters of layers [begin, end) (a pipeline stage
  // builds only its own). Layer i draws from its own stream (seed, i), so a layer's
  // initial weights do not depend on which other layers are built.
  void build(Backend& backend, uint64_t seed, size_t begin = 0, size_t end = kEnd);
  // The same for several ranges (an interleaved stage's model chunks): ascending,
  // disjoint, non-empty; params() lists them in order.
  void build(Backend& backend, uint64_t seed, const std::vector<LayerRange>& ranges);
  // Makes this model rank group.rank() of a tensor group over layers [begin, end), before
  // build (core/layers/tensor_split.h): its linear pairs split by `shares` (one per rank),
  // the rest whole; the shapes inferred again. Returns each layer's role.
  std::vector<TensorRole> splitForTensor(size_t begin, size_t end, Group& group,
                                         const std::vector<double>& shares);
  // What a tensor split of layers [begin, end) would make of each (findTensorSplit: all
  // whole when nothing splits), and the all-reduces one forward over such roles runs once
  // split (tensorAllreduces): what the partitioner prices a split stage by.
  std::vector<TensorRole> tensorRoles(size_t begin, size_t end) const;
  int tensorAllreduces(const std::vector<TensorRole>& roles) const;
  bool built() const { return backend_ != nullptr; }
  Backend& backend() const;
  // The built layers' parameters.
  const std::vector<Param*>& params() const { return params_; }
  Param& param(const std::string& name) const;
  void zeroGrad();

  // x is a batch [N, ...inputShape]; runs layers [begin, end).
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx, size_t begin = 0,
                 size_t end = kEnd);
  // `done(i)`, if given, is called as soon as layer i's parameter gradients are final
  // (Sequence::backward): a gradient bucket can leave while backward goes on.
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx = false, size_t begin = 0,
                  size_t end = kEnd, const LayerDone& done = {});
  // backward(dy, stash, true, begin, end) in two halves (Layer::backwardInput): the
  // input's gradient first, the parameter gradients after; bitwise the same result.
  // need_dx false (a pipeline's first stage): layer `begin` runs whole here, without the
  // input's gradient, and backwardWeights(..., first_done = true) leaves it out.
  Tensor backwardInput(const Tensor& dy, Stash& stash, size_t begin = 0, size_t end = kEnd,
                       bool need_dx = true);
  void backwardWeights(Stash& stash, size_t begin = 0, size_t end = kEnd,
                       const LayerDone& done = {}, bool first_done = false);

  // Layer::decode through layers [begin, end): the next tokens [B, Tnew] (ids, or the
  // activations entering `begin`) of sequences whose earlier tokens `state` has seen.
  Tensor decode(const Tensor& x, DecodeState& state, size_t begin = 0, size_t end = kEnd);
  // Layer::decodeEach through layers [begin, end): one new token for each of the
  // sequences whose states are given, x [B, 1] (ids, or a stage's [B, 1, width]); each
  // state as decode() keeps it for its sequence alone, so a sequence may be prefilled
  // with decode() and go on here.
  Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>& states, size_t begin = 0,
                    size_t end = kEnd);

  int64_t paramCount(size_t begin = 0, size_t end = kEnd) const;
  // The first layer of [begin, end) with parameters (Sequence::firstWithParams): the
  // first stage's backward runs none below it and it without its input gradient.
  size_t firstWithParams(size_t begin = 0, size_t end = kEnd) const;
  // Unsupported, naming the model and the layer, if a layer of [begin, end) does not train
  // (int8 weights: Layer::trains).
  void requireTrainable(size_t begin = 0, size_t end = kEnd) const;
  // Bytes the parameters hold on the device (int8 weights: a quarter, plus scales).
  int64_t paramBytes(size_t begin = 0, size_t end = kEnd) const;
  ModelSpec spec() const;

 private:
  // Throws InvalidArgument naming the model unless layers [begin, end) are built.
  void requireBuilt(size_t begin, size_t end) const;

  std::string name_;
  Shape input_, output_;
  Sequence layers_;
  Backend* backend_ = nullptr;
  std::vector<LayerRange> built_;  // ascending
  std::vector<Param*> params_;
};

}  // namespace tandem
