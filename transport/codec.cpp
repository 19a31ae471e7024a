#include "transport/codec.h"

#include "core/simd.h"

#if TANDEM_X86
#include <cpuid.h>
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace tandem::transport {

namespace {

// Branch-free bfloat16 rounding (round-to-nearest-even; NaN stays a quiet NaN) so the
// loops below vectorise.
inline uint16_t toBf16(uint32_t x) {
  const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? ((x >> 16) | 0x40u) : rounded);
}

void encodeBf16Portable(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = toBf16(std::bit_cast<uint32_t>(in[i]));
}

#if TANDEM_X86
// toBf16 on 8 values, as 32-bit lanes.
__attribute__((target("avx2"))) inline __m256i bf16Round8(const float* p) {
  const __m256i x = _mm256_castps_si256(_mm256_loadu_ps(p));
  const __m256i hi = _mm256_srli_epi32(x, 16);
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)),
                                         _mm256_and_si256(hi, _mm256_set1_epi32(1))),
                        16);
  const __m256 xf = _mm256_castsi256_ps(x);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(xf, xf, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
}

__attribute__((target("avx2"))) void encodeBf16Avx2(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // packus interleaves 128-bit lanes; the permute restores element order.
    const __m256i packed = _mm256_packus_epi32(bf16Round8(in + i), bf16Round8(in + i + 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_permute4x64_epi64(packed, 0xd8));
  }
  encodeBf16Portable(in + i, out + i, n - i);
}

#endif

void encodeBf16(const float* in, uint16_t* out, size_t n) {
#if TANDEM_X86
  if (hasAvx2()) return encodeBf16Avx2(in, out, n);
#endif
  encodeBf16Portable(in, out, n);
}

// int8: per block, scale = absmax / 127 and q = round-to-nearest-even(x * 127 / absmax).
// Both paths round the same way, so they agree bit for bit. Returns false if a value is
// not finite (the caller names it).
bool encodeInt8Portable(const float* in, int8_t* q, float* scales, size_t n, size_t block) {
  for (size_t b = 0, k = 0; b < n; b += block, ++k) {
    const size_t len = std::min(block, n - b);
    // |x| as an integer, as the AVX2 path takes it: inf and NaN order above every finite
    // value. (A float max would skip a NaN: std::max(m, NaN) is m, and ARM's fmaxnm too.)
    uint32_t bits = 0;
    for (size_t i = 0; i < len; ++i)
      bits = std::max(bits, std::bit_cast<uint32_t>(in[b + i]) & 0x7fffffffu);
    if (bits >= 0x7f800000u) return false;
    const float m = std::bit_cast<float>(bits);
    scales[k] = m / 127.0f;
    const float inv = m > 0.0f ? 127.0f / m : 0.0f;
    for (size_t i = 0; i < len; ++i)
      q[b + i] = static_cast<int8_t>(static_cast<int32_t>(std::nearbyint(in[b + i] * inv)));
  }
  return true;
}

#if TANDEM_X86
__attribute__((target("avx2"))) bool encodeInt8Avx2(const float* in, int8_t* q, float* scales,
                                                    size_t n, size_t block) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (size_t b = 0, k = 0; b < n; b += block, ++k) {
    const size_t len = std::min(block, n - b);
    const float* x = in + b;
    // |x| as integers orders like the floats, and inf and NaN above every finite value:
    // one integer max finds the absmax and flags a non-finite value at once.
    __m256i vm = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 8 <= len; i += 8)
      vm = _mm256_max_epi32(
          vm,
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs_mask));
    alignas(32) uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vm);
    uint32_t bits = 0;
    for (uint32_t l : lanes) bits = std::max(bits, l);
    for (; i < len; ++i) bits = std::max(bits, std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu);
    if (bits >= 0x7f800000u) return false;
    const float m = std::bit_cast<float>(bits);
    scales[k] = m / 127.0f;
    const float inv = m > 0.0f ? 127.0f / m : 0.0f;
    const __m256 vinv = _mm256_set1_ps(inv);
    int8_t* out = q + b;
    i = 0;
    for (; i + 32 <= len; i += 32) {
      // cvtps_epi32 rounds in the current mode (nearest-even by default), as nearbyint does.
      __m256i r[4];
      for (int j = 0; j < 4; ++j)
        r[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), vinv));
      const __m256i w =
          _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm256_permutevar8x32_epi32(w, order));
    }
    for (; i < len; ++i)
      out[i] = static_cast<int8_t>(static_cast<int32_t>(std::nearbyint(x[i] * inv)));
  }
  return true;
}
#endif

TANDEM_CLONES void decodeBf16(const uint16_t* __restrict in, float* __restrict out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(static_cast<uint32_t>(in[i]) << 16);
}

TANDEM_CLONES void dequantise(const int8_t* __restrict in, float* __restrict out, size_t n,
                              float scale) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]) * scale;
}

#if TANDEM_X86
__attribute__((target("avx,f16c"))) void toHalfF16C(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  floatsToHalfPortable(in + i, out + i, n - i);
}

__attribute__((target("avx,f16c"))) void fromHalfF16C(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  halfsToFloatPortable(in + i, out + i, n - i);
}
#endif

#if defined(__aarch64__)
// Every ARMv8-A CPU converts between float and half in one instruction (FCVTN/FCVTL),
// rounding to nearest-even and quietening NaNs as F16C does, so the portable paths agree
// with it bit for bit (CodecTest checks, under qemu-aarch64 in scripts/test-cross).
void toHalfNeon(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    vst1_u16(out + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(in + i))));
  floatsToHalfPortable(in + i, out + i, n - i);
}

void fromHalfNeon(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    vst1q_f32(out + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(in + i))));
  halfsToFloatPortable(in + i, out + i, n - i);
}
#endif

}  // namespace

std::string_view halfConversionPath() {
#if TANDEM_X86
  return hasF16C() ? "f16c" : "portable";
#elif defined(__aarch64__)
  return "neon";
#else
  return "portable";
#endif
}

bool hasF16C() {
#if TANDEM_X86
  // CPUID leaf 1: F16C (ecx bit 29), AVX (28), OSXSAVE (27); then XGETBV: the OS saves
  // the YMM registers. (clang's __builtin_cpu_supports does not know "f16c".)
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const unsigned need = (1u << 27) | (1u << 28) | (1u << 29);
    if ((c & need) != need) return false;
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6u) == 6u;
  }();
  return has;
#else
  return false;
#endif
}

void floatsToHalfPortable(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = floatToHalf(in[i]);
}

void halfsToFloatPortable(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float f = halfToFloat(in[i]);
    // F16C quietens signalling NaNs; do the same so both paths agree bit for bit.
    if ((in[i] & 0x7c00u) == 0x7c00u && (in[i] & 0x3ffu))
      f = std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 0x00400000u);
    out[i] = f;
  }
}

void floatsToHalf(const float* in, uint16_t* out, size_t n) {
#if TANDEM_X86
  if (hasF16C()) return toHalfF16C(in, out, n);
#elif defined(__aarch64__)
  return toHalfNeon(in, out, n);
#endif
  floatsToHalfPortable(in, out, n);
}

void halfsToFloat(const uint16_t* in, float* out, size_t n) {
#if TANDEM_X86
  if (hasF16C()) return fromHalfF16C(in, out, n);
#elif defined(__aarch64__)
  return fromHalfNeon(in, out, n);
#endif
  halfsToFloatPortable(in, out, n);
}

std::string_view codecName(Codec c) { return c == Codec::kRaw ? "raw" : wireCodecName(c); }

Codec parseCodec(std::string_view name) { return parseWireCodec(name); }

uint64_t encodedBytes(Codec c, DType dtype, uint64_t numel) {
  if (c == Codec::kRaw) return numel * dtypeSize(dtype);
  TANDEM_CHECK_MSG(dtype == DType::kF32, InvalidArgument,
                   "codec " << codecName(c) << " applies to f32 tensors, not " << dtypeName(dtype));
  switch (c) {
    case Codec::kF16:
    case Codec::kBF16:
      return numel * 2;
    case Codec::kI8:
      return numel;
    case Codec::kRaw:
      break;
  }
  throw InvalidArgument("unknown codec " + std::to_string(static_cast<int>(c)));
}

void encode(Codec c, std::span<const float> in, Encoded& out, uint32_t block) {
  const size_t n = in.size();
  out.scales.clear();
  out.block = 0;
  out.payload.resize(static_cast<size_t>(encodedBytes(c, DType::kF32, n)));
  switch (c) {
    case Codec::kRaw:
      if (n) std::memcpy(out.payload.data(), in.data(), n * 4);
      return;
    case Codec::kF16:
      floatsToHalf(in.data(), reinterpret_cast<uint16_t*>(out.payload.data()), n);
      return;
    case Codec::kBF16:
      encodeBf16(in.data(), reinterpret_cast<uint16_t*>(out.payload.data()), n);
      return;
    case Codec::kI8: {
      TANDEM_CHECK_MSG(block > 0, InvalidArgument, "int8 codec: block size must be positive");
      out.block = block;
      out.scales.resize((n + block - 1) / block);
      auto* q = reinterpret_cast<int8_t*>(out.payload.data());
#if TANDEM_X86
      const bool ok = hasAvx2() ? encodeInt8Avx2(in.data(), q, out.scales.data(), n, block)
                                : encodeInt8Portable(in.data(), q, out.scales.data(), n, block);
#else
      const bool ok = encodeInt8Portable(in.data(), q, out.scales.data(), n, block);
#endif
      if (!ok) {
        for (size_t i = 0; i < n; ++i)
          TANDEM_CHECK_MSG(std::isfinite(in[i]), InvalidArgument,
                           "int8 codec: value " << in[i] << " at index " << i << " is not finite");
      }
      return;
    }
  }
  throw InvalidArgument("unknown codec " + std::to_string(static_cast<int>(c)));
}

void decode(Codec c, std::span<const uint8_t> payload, std::span<const float> scales,
            uint32_t block, std::span<float> out) {
  const size_t n = out.size();
  const uint64_t want = encodedBytes(c, DType::kF32, n);
  TANDEM_CHECK_MSG(payload.size() == want, FormatError,
                   codecName(c) << " payload of " << payload.size() << " bytes for " << n
                                << " values (expected " << want << ")");
  switch (c) {
    case Codec::kRaw:
      if (n) std::memcpy(out.data(), payload.data(), n * 4);
      return;
    case Codec::kF16:
      halfsToFloat(reinterpret_cast<const uint16_t*>(payload.data()), out.data(), n);
      return;
    case Codec::kBF16:
      decodeBf16(reinterpret_cast<const uint16_t*>(payload.data()), out.data(), n);
      return;
    case Codec::kI8: {
      const size_t blocks = block ? (n + block - 1) / block : 0;
      TANDEM_CHECK_MSG(block > 0 && scales.size() == blocks, FormatError,
                       "int8 payload of " << n << " values in blocks of " << block << " has "
                                          << scales.size() << " scales");
      const auto* q = reinterpret_cast<const int8_t*>(payload.data());
      for (size_t b = 0, k = 0; b < n; b += block, ++k)
        dequantise(q + b, out.data() + b, std::min<size_t>(block, n - b), scales[k]);
      return;
    }
  }
  throw FormatError("unknown codec " + std::to_string(static_cast<int>(c)));
}

void roundTrip(Codec c, std::span<float> x) {
  if (c == Codec::kRaw || x.empty()) return;
  Encoded e;
  encode(c, x, e);
  decode(c, e.payload, e.scales, e.block, x);
}

void ErrorFeedback::encode(Codec c, std::span<const float> values, Encoded& out, uint32_t block) {
  const size_t n = values.size();
  if (residual_.size() != n) residual_.assign(n, 0.0f);
  corrected_.resize(n);
  for (size_t i = 0; i < n; ++i) corrected_[i] = values[i] + residual_[i];
  transport::encode(c, corrected_, out, block);
  decoded_.resize(n);
  decode(c, out.payload, out.scales, out.block, decoded_);
  for (size_t i = 0; i < n; ++i) residual_[i] = corrected_[i] - decoded_[i];
}

}  // namespace tandem::transport
