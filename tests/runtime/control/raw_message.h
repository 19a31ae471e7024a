// A control message built field by field with FlatBuffers' builder, for the decoder's
// tests (messages_test.cpp, stage_messages_test.cpp): what no encoder of ours would write.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <vector>

#include "runtime/control/schema/control_generated.h"

namespace tandem::runtime::test {

// `build(b)` returns the body's type and offset; the message around it, as bytes.
template <typename Build>
std::vector<uint8_t> raw(Build build) {
  flatbuffers::FlatBufferBuilder b;
  auto [type, body] = build(b);
  tandem::control::FinishMessageBuffer(b, tandem::control::CreateMessage(b, type, body));
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

}  // namespace tandem::runtime::test
