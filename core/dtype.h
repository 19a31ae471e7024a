// Element types. Compute is f32; f16, bf16 and i8 are storage and wire types;
// i32 carries integer data such as labels, token ids and pooling indices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kI8 = 3, kI32 = 4 };

size_t dtypeSize(DType t);
std::string_view dtypeName(DType t);
// Parses "f32", "f16", "bf16", "i8", "i32"; throws InvalidArgument naming the text.
DType parseDType(std::string_view name);

// Scalar conversions, round-to-nearest-even; inf and NaN are preserved.
uint16_t floatToHalf(float f);
float halfToFloat(uint16_t h);
uint16_t floatToBFloat16(float f);
float bfloat16ToFloat(uint16_t b);

}  // namespace tandem
