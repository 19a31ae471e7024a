// Reading untrusted FlatBuffers safely beyond what their verifier checks.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace tandem {

// A vector of 64-bit integers, copied out byte-wise. The verifier of the FlatBuffers
// Debian ships (2.0) checks the alignment of a vector's length, not of its elements: a
// crafted buffer can place an int64 vector at 4 mod 8, and reading it in place is a
// misaligned load (undefined behaviour; a fault on some ARM cores). Found by the fuzzer.
inline std::vector<int64_t> copyInt64s(const flatbuffers::Vector<int64_t>* v) {
  std::vector<int64_t> out;
  if (!v || v->size() == 0) return out;  // (memcpy takes no null pointer, even for 0 bytes)
  out.resize(v->size());
  std::memcpy(out.data(), v->Data(), out.size() * sizeof(int64_t));
  for (int64_t& x : out) x = flatbuffers::EndianScalar(x);
  return out;
}

}  // namespace tandem
