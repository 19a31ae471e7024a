// Reading untrusted FlatBuffers safely beyond what their verifier checks.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace tandem {

// A vector of 8-byte scalars (int64, double), copied out byte-wise. The verifier of the
// FlatBuffers Debian ships (2.0) checks the alignment of a vector's length, not of its
// elements: a crafted buffer can place such a vector at 4 mod 8, and reading it in place is
// a misaligned load (undefined behaviour; a fault on some ARM cores). Found by the fuzzer,
// for int64 and then for double vectors: every 8-byte vector a peer sends is read here.
template <typename T>
std::vector<T> copyScalars(const flatbuffers::Vector<T>* v) {
  static_assert(sizeof(T) == 8, "4-byte and smaller elements are aligned by the verifier");
  std::vector<T> out;
  if (!v || v->size() == 0) return out;  // (memcpy takes no null pointer, even for 0 bytes)
  out.resize(v->size());
  std::memcpy(out.data(), v->Data(), out.size() * sizeof(T));
  for (T& x : out) x = flatbuffers::EndianScalar(x);
  return out;
}

inline std::vector<int64_t> copyInt64s(const flatbuffers::Vector<int64_t>* v) {
  return copyScalars(v);
}

}  // namespace tandem
