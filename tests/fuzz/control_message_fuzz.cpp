// libFuzzer target for the control-message decoder (what a daemon reads from any peer
// before and after authentication): any input must either decode into a message whose
// encoding decodes and encodes to the same bytes, or raise FormatError. Anything else (a crash,
// a sanitizer report, another exception) is a bug.
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "core/error.h"
#include "runtime/control/messages.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::runtime;
  Message m;
  try {
    m = decodeMessage(std::span<const uint8_t>(data, size));
  } catch (const tandem::FormatError&) {
    return 0;
  }
  // What decoded is within every limit, so it encodes, and decoding that gives the same
  // message: compared as encodings, which FlatBuffers builds deterministically (a value
  // compare would fail on a NaN loss, which a diverged run may report).
  const std::vector<uint8_t> once = encodeMessage(m);
  if (encodeMessage(decodeMessage(once)) != once) std::abort();
  return 0;
}
