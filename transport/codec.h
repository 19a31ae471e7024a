// Codecs: how a tensor's values are written on the wire. Chosen per link and direction;
// the receiver decodes from the message header alone (codec, block size, scales).
//
//   raw   the tensor's own bytes (lossless; any dtype)
//   fp16  IEEE half, round-to-nearest-even, inf/NaN preserved; |error| <= 2^-11 |x| for
//         |x| in [2^-14, 65504], values beyond 65504 become inf
//   bf16  bfloat16, round-to-nearest-even; |error| <= 2^-8 |x|
//   int8  symmetric: per block of `block` values, scale = absmax / 127,
//         q = round-to-nearest-even(x / scale); |error| <= scale / 2 = absmax / 254,
//         plus f32 rounding of the scaling (< 1e-4 of that bound); non-finite inputs are
//         rejected
//
// fp16 uses the CPU's F16C instructions, bf16 and int8 encoding AVX2, when the CPU has
// them (chosen at run time, never at build time); the portable paths give bitwise the
// same results.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/wire_codec.h"

namespace tandem::transport {

using Codec = WireCodec;  // core/wire_codec.h

// The name a message header's codec goes by ("raw" for fp32).
std::string_view codecName(Codec c);
// "raw" (also "fp32"), "fp16", "bf16", "int8"; InvalidArgument names the text otherwise.
Codec parseCodec(std::string_view name);

inline constexpr uint32_t kDefaultInt8Block = 256;

// Payload bytes of `numel` elements of `dtype` under codec `c`. Lossy codecs apply only
// to f32 tensors (InvalidArgument otherwise).
uint64_t encodedBytes(Codec c, DType dtype, uint64_t numel);

struct Encoded {
  std::vector<uint8_t> payload;
  std::vector<float> scales;  // int8 only: one per block
  uint32_t block = 0;         // int8 only
};

// Encodes f32 values. For the raw codec use the tensor's bytes directly instead.
void encode(Codec c, std::span<const float> in, Encoded& out, uint32_t block = kDefaultInt8Block);
// Decodes into `out` (out.size() values). Sizes are checked: FormatError on mismatch.
void decode(Codec c, std::span<const uint8_t> payload, std::span<const float> scales,
            uint32_t block, std::span<float> out);
// `x` as codec `c` carries it: encoded and decoded in place (unchanged for raw).
void roundTrip(Codec c, std::span<float> x);

// Array conversions behind the fp16 codec: F16C on x86 CPUs that have it, NEON on aarch64,
// else the portable loops.
void floatsToHalf(const float* in, uint16_t* out, size_t n);
void halfsToFloat(const uint16_t* in, float* out, size_t n);
bool hasF16C();
// Which of those this build and CPU use: "f16c", "neon" or "portable".
std::string_view halfConversionPath();
// The portable paths, always available (tests compare the vector paths with them).
void floatsToHalfPortable(const float* in, uint16_t* out, size_t n);
void halfsToFloatPortable(const uint16_t* in, float* out, size_t n);

// Error feedback for gradients: keeps at the sender what quantisation lost and adds it to
// the next message, so the sum of what the receiver decodes tracks the sum of what was
// meant within one message's error, however many messages are sent.
class ErrorFeedback {
 public:
  // Encodes values + residual; the residual becomes (values + residual) - decoded.
  void encode(Codec c, std::span<const float> values, Encoded& out,
              uint32_t block = kDefaultInt8Block);
  std::span<const float> residual() const { return residual_; }

 private:
  std::vector<float> residual_;
  std::vector<float> corrected_, decoded_;
};

}  // namespace tandem::transport
