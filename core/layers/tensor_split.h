// Tensor (intra-layer) parallelism: one layer's weights split over the ranks of a tensor
// group, each rank on its own device with a share of the layer's output or input features
// in proportion to its speed (DESIGN.md, Parallel axes). Every rank runs the same stage on
// the same input and ends it with the same output; inside, pairs of linear layers split
// Megatron's way (and pairs of convolutions alike, by channels: a column part holds output
// channels, a row part input channels; the bias is added by rank 0's partial sum):
//
//   column  (the first of a pair): W's rows [begin, end) and their biases; y_r = x W_r^T + b_r
//           is this rank's slice of the output features. Forward: no communication, bitwise
//           the unsplit layer's columns. Backward: dx = sum over ranks of dy_r W_r, one
//           all-reduce; weight gradients local.
//   row     (the second): W's columns [begin, end), the bias whole; y = sum over ranks of
//           x_r W_r^T, one all-reduce, then + b. Backward: dx_r = dy W_r, local; weight and
//           bias gradients local (the bias's the same on every rank).
//
// Between the two only per-feature activations (relu, gelu, silu, tanh, sigmoid) may run,
// and between convolutions per-channel pooling (maxpool2d, avgpool2d) too: they work on the
// rank's slice as they would on the whole. The all-reduces add the ranks' partial sums in
// rank order, so a split stage's output and input gradient differ from the unsplit layer's
// by rounding (a sum regrouped), identically on every rank of alike devices and every run;
// so do the gradients of every layer that sees them. A linear pair whose incoming gradient
// is exact has parameter gradients bitwise the unsplit layer's slices (a convolution's
// weight gradients only to rounding: the CPU's kernels block by channels). Layers outside
// a pair are replicated: each rank runs them whole.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/comm/group.h"
#include "core/layers/sequence.h"

namespace tandem {

enum class TensorSplit { kColumn, kRow };
std::string tensorSplitName(TensorSplit split);

// One layer's part on one rank of a tensor group.
struct TensorPart {
  Group* group = nullptr;  // the tensor group; outlives the layer's forward and backward
  TensorSplit split = TensorSplit::kColumn;
  int64_t begin = 0, end = 0;  // this rank's slice of the split features
  uint64_t tag = 0;            // its all-reduces' tag (the same on every rank)
  std::chrono::milliseconds timeout{60000};
  int64_t width() const { return end - begin; }
};

// A layer that can hold a tensor part (linear: features; conv2d: channels).
class TensorSplittable {
 public:
  virtual ~TensorSplittable() = default;
  // Whether this layer splits at all (a grouped convolution does not).
  virtual bool tensorSplittable() const = 0;
  // The features a part of `split` cuts: the outputs for a column part, the inputs for a row.
  virtual int64_t splitFeatures(TensorSplit split) const = 0;
  // Makes the layer a rank's part: after setup, before build (setup runs again after it).
  virtual void setTensorPart(const TensorPart& part) = 0;
};
// Checks `part` against a layer of `features` features to split (InvalidArgument naming
// `layer`): the group set, the slice inside them.
void checkTensorPart(const TensorPart& part, int64_t features, const std::string& layer);
// A part's place in a whole [rows, cols]: its rows [begin, end) of every column, or its
// columns [begin, end) of every row.
ParamSlice rowsOf(int64_t rows, int64_t cols, int64_t begin, int64_t end);
ParamSlice columnsOf(int64_t rows, int64_t cols, int64_t begin, int64_t end);
// The values of `whole` (row-major [slice.rows, slice.cols]) that `slice` names, in order;
// and back, a part's values put in their place in `whole`. InvalidArgument on sizes that
// do not match the slice.
std::vector<float> takeSlice(const std::vector<float>& whole, const ParamSlice& slice);
void placeSlice(const ParamSlice& slice, const std::vector<float>& part, std::vector<float>& whole);
// A part's parameter `name` of `shape` from what the whole layer drew: its slice of
// `whole`, the slice recorded (Param::slice) for merging the parts back.
Param makePartParam(Backend& backend, std::string name, const Shape& shape,
                    const std::vector<float>& whole, const ParamSlice& slice);
// Sums a part's tensor over its group (allreduceTensor), with the part's tag and timeout;
// direction 0 for forward's all-reduce (a row part's output), 1 for backward's (a column
// part's input gradient).
void allreducePart(Backend& backend, const Tensor& t, const TensorPart& part, uint64_t direction);

// `units` whole features cut into shares.size() contiguous slices in proportion to
// `shares` (largest remainders, ties to the lower rank), at least one each: bounds[r] to
// bounds[r + 1] is rank r's. InvalidArgument, naming `what`, for fewer units than ranks or
// a share that is not positive.
std::vector<int64_t> shareBounds(int64_t units, const std::vector<double>& shares,
                                 const std::string& what);

// Rank group.rank()'s part of a layer of `units` whole features cut by shareBounds, tagged
// next_tag (advanced): for a TensorSplitBlock. InvalidArgument, naming `what`, when the
// shares do not match the group or the units are fewer than the ranks.
TensorPart blockPart(Group& group, const std::vector<double>& shares, int64_t units,
                     const std::string& what, uint64_t& next_tag);

// Sums `t` (f32, on `backend`) over the group's ranks, in rank order, in place: on the host
// buffer where the backend computes in host memory, else through a download and an upload.
void allreduceTensor(Backend& backend, const Tensor& t, Group& group, const AllreduceOptions& o);

// A layer that splits inside itself, its output whole on every rank and every all-reduce
// within it: attention by key/value head groups (column-parallel projections of its heads,
// the output projection row-parallel), the SwiGLU MLP by hidden features, and the blocks
// (residual, transformer, llama) over what their bodies hold.
class TensorSplitBlock {
 public:
  virtual ~TensorSplitBlock() = default;
  // Whether it holds anything to split (after setup).
  virtual bool tensorSplits() const = 0;
  // Makes the layer rank group.rank()'s part (after setup, before build; the caller re-runs
  // setup), its all-reduces tagged from next_tag on (advanced past them: the same on every
  // rank). InvalidArgument, naming the layer, if it has fewer units than ranks.
  virtual void splitTensor(Group& group, const std::vector<double>& shares, uint64_t& next_tag) = 0;
  // The all-reduces one forward runs once split (one backward runs as many), each of about
  // the layer's output: what the partitioner prices a split stage's communication by.
  virtual int tensorAllreduces() const = 0;
};

// Sets `t` (f32, on `backend`) to the root's on every rank of the group, in place.
void broadcastTensor(Backend& backend, const Tensor& t, Group& group, const RootOptions& o);

// What a tensor split makes of each layer of a range.
struct TensorRole {
  size_t layer = 0;
  // kSlice: an activation between a pair's layers; kBlock: a TensorSplitBlock, split inside.
  enum Kind { kWhole, kColumn, kRow, kSlice, kBlock } kind = kWhole;
};
// The roles of layers [begin, end) of `layers` (after setup): each splittable linear (conv2d)
// followed, past per-feature (per-channel) layers only, by another of its kind in the range
// makes a column-row pair; a block with something to split is split inside; everything else
// stays whole. InvalidArgument naming the range if nothing splits.
std::vector<TensorRole> planTensorSplit(const Sequence& layers, size_t begin, size_t end);
// The same roles, all whole when nothing splits (no error).
std::vector<TensorRole> findTensorSplit(const Sequence& layers, size_t begin, size_t end);
bool splitsAny(const std::vector<TensorRole>& roles);
// The all-reduces one forward over `roles` runs once split (a pair's row part's, and each
// block's own); one backward runs as many (a pair's column part's input gradient).
int tensorAllreduces(const Sequence& layers, const std::vector<TensorRole>& roles);
// "1 linear column, 2 relu slice, 3 linear row, 4 linear whole, 5 transformer split".
std::string describe(const Sequence& layers, const std::vector<TensorRole>& roles);

// Makes this process rank group.rank() of a tensor group of shares.size() ranks over the
// pairs and blocks of `roles` (before build): each pair's hidden features cut by
// shareBounds, the column layer taking its rank's outputs and the row layer the same
// inputs; each block split inside. InvalidArgument if a pair has fewer hidden features than
// ranks, naming the layer. Tags its all-reduces from first_tag on; returns the next free
// tag. The caller re-runs setup.
uint64_t applyTensorSplit(Sequence& layers, const std::vector<TensorRole>& roles, Group& group,
                          const std::vector<double>& shares, uint64_t first_tag = 0);

}  // namespace tandem
