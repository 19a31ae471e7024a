// A layer's weight matrix [out, in] (PyTorch's layout) and the products layers take with
// it: f32 and trainable, or int8 with f32 scales per group of inputs (weight-only
// quantization, core/quantize.h: inference only — fine-tune the f32 model, then quantize).
// Linear, attention and the SwiGLU MLP hold theirs here, so the format is a spec
// attribute of those layers (and of the blocks made of them), one place deciding it:
//   weights: int8    (default f32)
//   group: 64        (inputs per scale; default all of them: one scale per output row)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layers/layer.h"

namespace tandem {

struct WeightFormat {
  bool int8 = false;
  int64_t group = 0;  // 0: one group of every input

  // Reads `weights` and `group` (InvalidArgument naming a bad value).
  static WeightFormat read(SpecReader& r);
  // Writes them back (nothing for f32).
  void write(LayerSpec& spec) const;
  // The group for `in` inputs: InvalidArgument, naming `layer`, if it does not divide them.
  int64_t groupFor(int64_t in, const std::string& layer) const;
};

class WeightMatrix {
 public:
  // Allocates [out, in] on `backend`, uniform in [-bound, bound] (quantized when int8):
  // parameter `name`, and for int8 `name.scales` [out, in / group].
  void build(Backend& backend, Rng& rng, const std::string& name, int64_t out, int64_t in,
             float bound, const WeightFormat& format, const std::string& layer);
  // A tensor part's f32 matrix: its `slice` (rows and columns) of the whole one's draws
  // (Param::slice records it).
  void buildPart(Backend& backend, const std::string& name, const std::vector<float>& whole,
                 const ParamSlice& slice);
  // f32: the weight; int8: the weight (i8, no gradient) and its scales.
  std::vector<Param*> params();
  bool int8() const { return scales_.value.defined(); }

  // y [rows, out] = x [rows, in] times the matrix, transposed (a layer's forward).
  void forward(Backend& backend, const Tensor& x, const Tensor& y) const;
  // The trainable f32 parameter, for backward: Unsupported for int8 weights.
  Param& trainable();

 private:
  Param weight_, scales_;
  std::string layer_;
};

// Bytes an [out, in] matrix in `format` holds on its device: its weights and, for int8,
// its scales (gradients not counted). For the cost facts, valid from setup on.
int64_t weightBytes(const WeightFormat& format, int64_t out, int64_t in);
// The op its forward runs: gemm on f32, or gemmQ8 on i8.
OpUse weightOp(const WeightFormat& format);

}  // namespace tandem
