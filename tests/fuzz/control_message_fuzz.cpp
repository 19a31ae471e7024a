// libFuzzer target for the control-message decoder (what a daemon reads from any peer
// before and after authentication): any input must either decode into a message that
// re-encodes and decodes to an equal one, or raise FormatError. Anything else (a crash,
// a sanitizer report, another exception) is a bug.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/error.h"
#include "targets/runtime/messages.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::runtime;
  Message m;
  try {
    m = decodeMessage(std::span<const uint8_t>(data, size));
  } catch (const tandem::FormatError&) {
    return 0;
  }
  // What decoded is within every limit, so it encodes, and the same value comes back.
  if (!(decodeMessage(encodeMessage(m)) == m)) std::abort();
  return 0;
}
