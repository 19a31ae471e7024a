// libFuzzer target for the wire-header decoder: any input must either decode into a
// self-consistent header that re-encodes to an equal header, or raise FormatError.
// Anything else (a crash, a sanitizer report, another exception) is a bug.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/error.h"
#include "transport/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::transport;
  WireLimits limits;
  limits.max_payload_bytes = uint64_t{1} << 30;
  WireHeader h;
  try {
    h = decodeHeader(std::span<const uint8_t>(data, size), limits);
  } catch (const tandem::FormatError&) {
    return 0;
  }
  // What decoded must satisfy the invariants receivers rely on.
  const uint64_t numel = static_cast<uint64_t>(h.shape.numel());
  if (h.payload_bytes != encodedBytes(h.codec, h.dtype, numel)) std::abort();
  if (h.codec == Codec::kI8 && h.scales.size() != (numel + h.block - 1) / h.block) std::abort();
  const WireHeader again = decodeHeader(encodeHeader(h), limits);
  if (again.shape != h.shape || again.payload_bytes != h.payload_bytes ||
      again.scales != h.scales || again.checksum != h.checksum || again.microbatch != h.microbatch)
    std::abort();
  return 0;
}
