#include "core/layers/rope.h"

#include <cmath>

#include "core/error.h"

namespace tandem {

RopeSpec readRope(SpecReader& r) {
  RopeSpec rope;
  rope.theta = r.number("rope_theta", 0);
  rope.scaling = r.choice("rope_scaling", "none", {"none", "linear", "llama3"});
  rope.factor = r.number("rope_factor", 1);
  rope.low_freq_factor = r.number("rope_low_freq_factor", 1);
  rope.high_freq_factor = r.number("rope_high_freq_factor", 4);
  rope.original_context = r.integer("rope_original_context", 8192);
  TANDEM_CHECK_MSG(
      rope.theta >= 0 && std::isfinite(rope.theta), InvalidArgument,
      "attention: 'rope_theta' must be positive (0: no rotary embedding), got " << rope.theta);
  TANDEM_CHECK_MSG(rope.enabled() || rope.scaling == "none", InvalidArgument,
                   "attention: 'rope_scaling' without 'rope_theta'");
  TANDEM_CHECK_MSG(rope.factor > 0 && std::isfinite(rope.factor), InvalidArgument,
                   "attention: 'rope_factor' must be positive, got " << rope.factor);
  if (rope.scaling == "llama3")
    TANDEM_CHECK_MSG(rope.low_freq_factor > 0 && rope.high_freq_factor > rope.low_freq_factor &&
                         rope.original_context > 0,
                     InvalidArgument,
                     "attention: llama3 rope scaling needs 0 < rope_low_freq_factor < "
                     "rope_high_freq_factor and a positive rope_original_context");
  return rope;
}

void writeRope(const RopeSpec& rope, LayerSpec& spec) {
  if (!rope.enabled()) return;
  spec.attrs["rope_theta"] = rope.theta;
  if (rope.scaling == "none") return;
  spec.attrs["rope_scaling"] = rope.scaling;
  spec.attrs["rope_factor"] = rope.factor;
  if (rope.scaling != "llama3") return;
  spec.attrs["rope_low_freq_factor"] = rope.low_freq_factor;
  spec.attrs["rope_high_freq_factor"] = rope.high_freq_factor;
  spec.attrs["rope_original_context"] = rope.original_context;
}

std::vector<float> ropeInverseFrequencies(const RopeSpec& rope, int64_t head_size) {
  TANDEM_CHECK_MSG(head_size > 0 && head_size % 2 == 0, InvalidArgument,
                   "attention: rotary embedding needs an even head size, got " << head_size);
  const auto half = static_cast<size_t>(head_size / 2);
  const auto theta = static_cast<float>(rope.theta);
  const auto factor = static_cast<float>(rope.factor);
  std::vector<float> inv(half);
  for (size_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_size);
    inv[i] = 1.0f / std::pow(theta, exponent);
  }
  if (rope.scaling == "linear") {
    for (float& f : inv) f /= factor;
  } else if (rope.scaling == "llama3") {
    // As transformers' _compute_llama3_parameters runs it in f32 (a scalar divided by a
    // tensor is the tensor's reciprocal times the scalar there).
    const auto old_context = static_cast<float>(rope.original_context);
    const auto low = static_cast<float>(rope.low_freq_factor);
    const auto low_wavelen =
        static_cast<float>(static_cast<double>(rope.original_context) / rope.low_freq_factor);
    const auto high_wavelen =
        static_cast<float>(static_cast<double>(rope.original_context) / rope.high_freq_factor);
    const auto spread = static_cast<float>(rope.high_freq_factor - rope.low_freq_factor);
    constexpr auto kTwoPi = static_cast<float>(2 * 3.14159265358979323846);
    for (float& f : inv) {
      const float wavelen = (1.0f / f) * kTwoPi;
      if (wavelen > low_wavelen) {
        f /= factor;
      } else if (!(wavelen < high_wavelen)) {  // between: blend the scaled and the kept
        const float smooth = ((1.0f / wavelen) * old_context - low) / spread;
        f = (1.0f - smooth) * f / factor + smooth * f;
      }
    }
  }
  return inv;
}

}  // namespace tandem
