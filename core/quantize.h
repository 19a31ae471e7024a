// Weight-only int8 quantization of matrices laid out [rows, cols] (a layer's weight
// [out, in]): each row's columns in groups of `group`, each group scaled by its largest
// magnitude over 127 and rounded to the nearest integer in [-127, 127]. The value w[r, c]
// then stands for q[r, c] * scales[r, c / group]. Symmetric (no zero point), as the
// weights of trained layers are centred near zero; a group of zeros has scale 0.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tandem {

struct QuantizedRows {
  int64_t rows = 0, cols = 0, group = 0;
  std::vector<int8_t> values;  // [rows, cols]
  std::vector<float> scales;   // [rows, cols / group]
};

// `what` names the matrix in errors: InvalidArgument if group does not divide cols or
// a weight is not finite.
QuantizedRows quantizeRows(std::span<const float> w, int64_t rows, int64_t cols, int64_t group,
                           const std::string& what);
// The f32 values the int8 ones stand for.
std::vector<float> dequantizeRows(const QuantizedRows& q);

}  // namespace tandem
