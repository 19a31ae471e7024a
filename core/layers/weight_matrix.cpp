#include "core/layers/weight_matrix.h"

#include "core/error.h"
#include "core/layers/tensor_split.h"
#include "core/quantize.h"

namespace tandem {

WeightFormat WeightFormat::read(SpecReader& r) {
  WeightFormat f;
  f.int8 = r.choice("weights", "f32", {"f32", "int8"}) == "int8";
  f.group = r.integer("group", 0);
  TANDEM_CHECK_MSG(f.group >= 0, InvalidArgument,
                   "'group' must be positive (inputs per int8 scale), got " << f.group);
  TANDEM_CHECK_MSG(f.int8 || f.group == 0, InvalidArgument,
                   "'group' applies to int8 weights only (weights: int8)");
  return f;
}

void WeightFormat::write(LayerSpec& spec) const {
  if (!int8) return;
  spec.attrs["weights"] = std::string("int8");
  if (group) spec.attrs["group"] = group;
}

int64_t WeightFormat::groupFor(int64_t in, const std::string& layer) const {
  const int64_t g = group ? group : in;
  TANDEM_CHECK_MSG(
      in % g == 0, InvalidArgument,
      layer << ": an int8 group of " << g << " does not divide its " << in << " inputs");
  return g;
}

int64_t weightBytes(const WeightFormat& format, int64_t out, int64_t in) {
  if (!format.int8) return out * in * 4;
  const int64_t g = format.group && in % format.group == 0 ? format.group : in;
  return out * in + out * (in / g) * 4;
}

void WeightMatrix::build(Backend& backend, Rng& rng, const std::string& name, int64_t out,
                         int64_t in, float bound, const WeightFormat& format,
                         const std::string& layer) {
  layer_ = layer;
  std::vector<float> init = uniformInit(rng, out * in, bound);
  if (!format.int8) {
    weight_ = makeParam(backend, name, {out, in}, init);
    scales_ = {};
    return;
  }
  const int64_t group = format.groupFor(in, layer);
  const QuantizedRows q = quantizeRows(init, out, in, group, layer + " " + name);
  weight_.name = name;
  weight_.value = backend.empty({out, in}, DType::kI8);
  backend.upload(weight_.value, q.values.data());
  scales_.name = name + ".scales";
  scales_.value = toDevice(backend, {out, in / group}, q.scales);
}

void WeightMatrix::buildPart(Backend& backend, const std::string& name,
                             const std::vector<float>& whole, const ParamSlice& slice) {
  int64_t rows = 0;
  for (const auto& [b, e] : slice.row_ranges) rows += e - b;
  weight_ = makePartParam(backend, name, {rows, slice.col_end - slice.col_begin}, whole, slice);
  scales_ = {};
}

std::vector<Param*> WeightMatrix::params() {
  if (int8()) return {&weight_, &scales_};
  return {&weight_};
}

void WeightMatrix::forward(Backend& backend, const Tensor& x, const Tensor& y) const {
  if (int8()) {
    backend.gemmQ8(x, weight_.value, scales_.value, y);
  } else {
    backend.gemm(false, true, 1.0f, x, weight_.value, 0.0f, y);
  }
}

Param& WeightMatrix::trainable() {
  if (int8())
    throw Unsupported(layer_ + " holds int8 weights, which are for inference only: train or " +
                      "fine-tune the f32 model, then quantize it (tandem quantize)");
  return weight_;
}

OpUse weightOp(const WeightFormat& format) {
  return format.int8 ? OpUse{Op::kGemmQ8, DType::kI8} : OpUse{Op::kGemm, DType::kF32};
}

}  // namespace tandem
