// Rotary position embedding's frequencies (RoFormer; Llama's form), as Hugging Face's
// `rope_theta` and `rope_scaling` define them: inv_freq[i] = 1 / theta^(2i / S) for a head
// of size S, then scaled — "linear" divides every frequency by `factor`; "llama3" divides
// the low frequencies (wavelengths beyond original_context / low_freq_factor) by `factor`,
// keeps the high ones (below original_context / high_freq_factor) and blends between. All
// in f32, as transformers computes them. The attention layer applies them (Backend::rope)
// to its queries and keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layers/spec.h"

namespace tandem {

struct RopeSpec {
  double theta = 0;              // 0: no rotary embedding
  std::string scaling = "none";  // none, linear, llama3
  double factor = 1;
  double low_freq_factor = 1, high_freq_factor = 4;  // llama3
  int64_t original_context = 8192;                   // llama3
  bool enabled() const { return theta > 0; }
};

// The `rope_*` fields of an attention spec (absent: no rotary embedding), checked.
RopeSpec readRope(SpecReader& r);
// Writes them back (nothing when disabled).
void writeRope(const RopeSpec& rope, LayerSpec& spec);
// inv_freq [S / 2] for heads of size S (even).
std::vector<float> ropeInverseFrequencies(const RopeSpec& rope, int64_t head_size);

}  // namespace tandem
