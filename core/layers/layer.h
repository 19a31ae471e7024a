// Layer: forward and backward written once against Backend, plus the cost facts
// (parameters, FLOPs, stashed activation bytes) that inspection and the partitioner read.
//
// Life cycle: construct from a LayerSpec -> setup(per-sample input shape) infers and
// checks shapes -> build(backend, rng) allocates and initialises parameters -> forward /
// backward any number of times. What forward keeps for backward lives in a Stash owned
// by the caller, so several microbatches can be in flight at once.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/layers/spec.h"
#include "core/random.h"

namespace tandem {

// Where a tensor part's parameter lies in the whole layer's (core/layers/tensor_split.h):
// the whole viewed as [rows, cols] (its first dimension by the rest), the part holding the
// listed ranges of its rows, in order, each row's columns [col_begin, col_end).
struct ParamSlice {
  int64_t rows = 0, cols = 0;
  std::vector<std::pair<int64_t, int64_t>> row_ranges;
  int64_t col_begin = 0, col_end = 0;
};

struct Param {
  std::string name;  // unique within its model, e.g. "3.weight"
  Tensor value;
  Tensor grad;  // same shape; accumulated by backward, cleared by the optimizer's caller
  std::optional<ParamSlice> slice;  // a tensor part's split parameter: its place in the whole
};

struct ForwardContext {
  bool training = true;
  uint64_t seed = 0;  // per-microbatch seed; containers mix in the layer's position
  // A forward run again to rebuild a dropped stash (activation recomputation): it must
  // compute what the first one did and change no state (batch norm's running statistics).
  bool recompute = false;
};

// What one layer's forward saved for its backward. Blocks nest their children's.
struct Stash {
  std::vector<Tensor> saved;
  std::vector<Stash> children;
  void clear() {
    saved.clear();
    children.clear();
  }
};

// What a layer keeps between the steps of incremental decoding (generation, one token at a
// time): attention's keys and values of the tokens seen so far, the position of the next
// one. Owned by the caller, one per sequence batch, so several batches can be in flight.
struct DecodeState {
  int64_t position = 0;  // tokens this layer has seen
  std::vector<Tensor> cache;
  std::vector<DecodeState> children;
};

class Layer {
 public:
  virtual ~Layer() = default;

  virtual std::string type() const = 0;
  // Infers the per-sample output shape from the per-sample input shape; throws
  // InvalidArgument describing the expected and the received shape.
  Shape setup(const Shape& input) {
    input_ = input;
    output_ = infer(input);
    return output_;
  }
  const Shape& inputShape() const { return input_; }
  const Shape& outputShape() const { return output_; }
  virtual DType inputDType() const { return DType::kF32; }

  // Allocates parameters on `backend` and initialises them from `rng` (after setup).
  virtual void build(Backend& backend, Rng& rng) {
    (void)backend;
    (void)rng;
  }
  // Parameters with names relative to this layer ("weight", "body.0.bias").
  virtual std::vector<Param*> params() { return {}; }
  // Whether backward runs (valid after setup): false for a layer holding int8 weights,
  // which are for inference only (weight_matrix.h); such a parameter has no gradient.
  virtual bool trains() const { return true; }

  virtual Tensor forward(const Tensor& x, Stash& stash, const ForwardContext& ctx) = 0;
  // Accumulates parameter gradients; returns dx when need_dx, else an undefined tensor.
  virtual Tensor backward(const Tensor& dy, Stash& stash, bool need_dx) = 0;
  // The same backward in two halves, so a pipeline stage can send dx upstream before it
  // spends time on weight gradients: backwardInput returns dx and leaves in the stash
  // what backwardWeights needs; backwardWeights then accumulates the parameter gradients.
  // Together they compute bitwise what backward(dy, stash, true) does. By default the
  // whole backward runs in the first half; layers whose weight gradients cost as much as
  // their dx (linear) split.
  virtual Tensor backwardInput(const Tensor& dy, Stash& stash) { return backward(dy, stash, true); }
  virtual void backwardWeights(Stash& stash) { (void)stash; }

  // Inference on the next tokens of sequences whose earlier tokens this state has seen:
  // x is [B, Tnew, ...] (Tnew tokens from position state.position on), the result the
  // rows forward would give those tokens with the whole sequence as input. Layers that
  // work token by token run forward; attention reads and extends its key/value cache;
  // the others (convolution, pooling, flatten) throw Unsupported.
  virtual Tensor decode(const Tensor& x, DecodeState& state);
  // decode() of one new token for each of B sequences at once: x is [B, 1, ...] and
  // states[b] the b-th sequence's state (its own position and cache). Layers that work
  // token by token run one forward over the B rows (one pass over their weights for all
  // of them); attention projects the B rows together and attends each sequence to its
  // own cache. By default each sequence's decode in turn.
  virtual Tensor decodeEach(const Tensor& x, const std::vector<DecodeState*>& states);

  // The backend ops (and their dtypes) this layer runs, valid after setup: its forward, and
  // with `training` its backward too (with the input's gradient). A device whose backend
  // lacks one cannot hold the layer (Backend::supports).
  virtual std::vector<OpUse> ops(bool training) const = 0;

  // Cost facts, per sample, valid after setup.
  virtual int64_t paramCount() const { return 0; }
  // Bytes its parameters hold on the device (int8 weights hold a quarter of f32's, plus
  // their scales; core/layers/weight_matrix.h).
  virtual int64_t paramBytes() const { return paramCount() * 4; }
  virtual int64_t flops() const = 0;                // forward; a multiply-add is 2
  virtual int64_t stashBytes() const { return 0; }  // kept from forward for backward
  int64_t outputBytes() const { return output_.numel() * 4; }
  // Scratch its forward or backward holds beside its input and output for a batch of
  // `batch` samples, freed as it returns (a convolution's column buffers; not per sample).
  virtual int64_t workspaceBytes(int64_t batch) const {
    (void)batch;
    return 0;
  }

  // The spec this layer was made from, for model files.
  virtual LayerSpec spec() const = 0;

 protected:
  virtual Shape infer(const Shape& input) = 0;
  // decode() of a layer whose output row for a token depends on that token's input row
  // only: an inference forward of the new rows.
  Tensor forwardPerToken(const Tensor& x);
  // Backend that params live on; set by build().
  Backend* backend_ = nullptr;

 private:
  Shape input_, output_;
};

// `forward`'s ops on f32, and `backward`'s too when training (Layer::ops).
std::vector<OpUse> f32Ops(bool training, std::initializer_list<Op> forward,
                          std::initializer_list<Op> backward);
// The union of op lists, each op once, in Op order.
std::vector<OpUse> unionOps(const std::vector<std::vector<OpUse>>& lists);

// Allocates a parameter and its zeroed gradient.
Param makeParam(Backend& backend, std::string name, const Shape& shape,
                const std::vector<float>& init);
// n values uniform in [-bound, bound].
std::vector<float> uniformInit(Rng& rng, int64_t n, float bound);

}  // namespace tandem
