// libFuzzer target for the safetensors reader (hf/safetensors.h): any input, taken as a
// whole file's bytes, either parses into entries that tile its data exactly and whose
// bytes stay inside the input, or raises FormatError. Anything else (a crash, a sanitizer
// report, another exception) is a bug.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/error.h"
#include "hf/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::hf;
  Layout layout;
  try {
    layout = parseLayout(std::span<const uint8_t>(data, size), "fuzz");
  } catch (const tandem::FormatError&) {
    return 0;
  }
  uint64_t at = layout.data_start;
  for (const TensorEntry& e : layout.header.tensors) {
    if (layout.data_start + e.begin != at || e.end < e.begin) std::abort();
    if (e.end - e.begin != static_cast<uint64_t>(e.numel()) * safetensorsDTypeSize(e.dtype))
      std::abort();
    at = layout.data_start + e.end;
    // Widening reads every byte of a float tensor: ASan sees any read outside the input.
    if (e.dtype == "F32" || e.dtype == "F16" || e.dtype == "BF16") {
      const auto values = widenToFloat(
          std::span<const uint8_t>(data + layout.data_start + e.begin, e.end - e.begin), e.dtype,
          e.name);
      if (values.size() != static_cast<size_t>(e.numel())) std::abort();
    }
  }
  if (at != size) std::abort();
  return 0;
}
