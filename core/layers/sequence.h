// Sequence: an ordered list of layers run one after another. It is the body of a
// Model and of block layers (residual); a stage of a pipeline is a range of it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/layers/layer.h"

namespace tandem {

// Called with a layer's index once its parameter gradients are final in a backward.
using LayerDone = std::function<void(size_t)>;

class Sequence {
 public:
  Sequence() = default;
  // Builds each layer from its spec through the layer registry.
  explicit Sequence(const std::vector<LayerSpec>& specs);

  size_t size() const { return layers_.size(); }
  Layer& layer(size_t i) { return *layers_.at(i); }
  const Layer& layer(size_t i) const { return *layers_.at(i); }

  // Infers shapes through every layer; errors name the layer index, its type, where it
  // was declared and both shapes, e.g. "layer 3 (linear at cnn.yaml:9:5): ...".
  Shape setup(const Shape& input);
  // Builds every layer, then names each parameter "<prefix><index>.<local name>".
  void build(Backend& backend, Rng& rng, const std::string& prefix = "");
  // Builds layers [begin, end) only, layer i from its own stream Rng(seed, i); names as
  // above with no prefix.
  void build(Backend& backend, uint64_t seed, size_t begin, size_t end);
  std::vector<Param*> params(size_t begin = 0, size_t end = SIZE_MAX);
  // Whether every layer of [begin, end) trains (Layer::trains); else the first that does
  // not, as "layer I (TYPE)", in `which`.
  bool trains(size_t begin = 0, size_t end = SIZE_MAX, std::string* which = nullptr) const;

  // Runs layers [begin, end); stash.children holds one Stash per layer of the range.
  Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx, size_t begin,
                 size_t end);
  // Layer::decode through layers [begin, end); state.children holds one state per layer
  // of the range.
  Tensor decode(const Tensor& x, DecodeState& state, size_t begin, size_t end);
  // Layer::decodeEach through layers [begin, end): one token of each of the sequences
  // whose states are given (each state's children as in decode).
  Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>& states, size_t begin,
                    size_t end);
  // Accumulates parameter gradients of layers [begin, end); returns the gradient of the
  // range's input when need_dx, else an undefined tensor. Layers below the first one with
  // parameters are skipped unless need_dx. `done(i)`, if given, is called as soon as
  // layer i's parameter gradients are final (every layer of the range, from the last).
  Tensor backward(const Tensor& dy, Stash& stash, bool need_dx, size_t begin, size_t end,
                  const LayerDone& done = {});
  // backward(dy, stash, true, begin, end) in the two halves of Layer::backwardInput and
  // backwardWeights, layer by layer; backwardWeights frees the stash (and calls `done`).
  // need_dx false (the model's first layers, where nothing wants the input's gradient):
  // the layers through the first with parameters run here as backward() runs them (that
  // one whole without its input gradient, those below it not at all; an empty tensor is
  // returned), and backwardWeights(..., first_done = true) leaves them out.
  Tensor backwardInput(const Tensor& dy, Stash& stash, size_t begin, size_t end,
                       bool need_dx = true);
  void backwardWeights(Stash& stash, size_t begin, size_t end, const LayerDone& done = {},
                       bool first_done = false);

  // Every op layers [begin, end) run (Layer::ops), each once, in Op order.
  std::vector<OpUse> ops(bool training, size_t begin = 0, size_t end = SIZE_MAX) const;

  std::vector<LayerSpec> specs() const;

  // Its layers' cost facts (Layer's) summed — a block's, or its branches' — and the
  // largest scratch of any one (they run one at a time).
  int64_t paramCount() const { return total(&Layer::paramCount); }
  int64_t paramBytes() const { return total(&Layer::paramBytes); }
  int64_t flops() const { return total(&Layer::flops); }
  int64_t stashBytes() const { return total(&Layer::stashBytes); }
  int64_t workspaceBytes(int64_t batch) const;
  // The first of layers [begin, end) with parameters; end if none has any. Without the
  // input gradient, backward() runs no layer below it and it without its own.
  size_t firstWithParams(size_t begin, size_t end) const;

 private:
  // One cost fact of every layer, summed.
  int64_t total(int64_t (Layer::*fact)() const) const;

  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::string> where_;
};

}  // namespace tandem
