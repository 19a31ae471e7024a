// What messages.cpp and stage_messages.cpp share: the checks every decoded field goes
// through, and the encoders and decoder of the stage worker's messages. Internal to the
// runtime library.
#pragma once

#include <array>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "runtime/control/messages.h"
#include "runtime/control/schema/control_generated.h"

namespace tandem::runtime::detail {

namespace fb = tandem::control;

[[noreturn]] inline void bad(const char* message, const std::string& what) {
  throw FormatError(std::string("bad control message '") + message + "': " + what);
}

inline std::string text(const char* message, const char* field, const flatbuffers::String* s,
                        size_t limit) {
  if (!s) return {};
  if (s->size() > limit)
    bad(message, std::string(field) + " of " + std::to_string(s->size()) +
                     " bytes exceeds the limit of " + std::to_string(limit));
  return s->str();
}

template <size_t N>
inline std::array<uint8_t, N> exactBytes(const char* message, const char* field,
                                         const flatbuffers::Vector<uint8_t>* v) {
  const size_t size = v ? v->size() : 0;
  if (size != N)
    bad(message, std::string(field) + " must be " + std::to_string(N) + " bytes, not " +
                     std::to_string(size));
  std::array<uint8_t, N> out{};
  std::memcpy(out.data(), v->data(), N);
  return out;
}

inline void nonNegative(const char* message, const char* field, int64_t v) {
  if (v < 0) bad(message, std::string(field) + " is negative (" + std::to_string(v) + ")");
}

inline void range(const char* message, const char* field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    bad(message, std::string(field) + " " + std::to_string(v) + " is not in [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

inline void finiteNonNegative(const char* message, const char* field, double v) {
  if (!(v >= 0 && std::isfinite(v)))
    bad(message,
        std::string(field) + " " + std::to_string(v) + " is not a finite, non-negative number");
}

inline void checkText(const char* message, const char* field, const std::string& s, size_t limit) {
  if (s.size() > limit)
    throw InvalidArgument(std::string("control message '") + message + "': " + field + " of " +
                          std::to_string(s.size()) + " bytes exceeds the limit of " +
                          std::to_string(limit));
}

inline void checkCount(const char* message, const char* field, size_t n, size_t limit) {
  if (n > limit)
    throw InvalidArgument(std::string("control message '") + message + "': " + std::to_string(n) +
                          " " + field + " exceed the limit of " + std::to_string(limit));
}

// Unequal replicas' shares of each batch (`train`'s microbatch_shares, `checkpointed`'s
// shares): at most kMaxReplicaShares, each in (0, 1e9] (errors call one a `share`);
// empty when absent.
std::vector<double> readShares(const char* message, const char* share,
                               const flatbuffers::Vector<double>* v);

// The settings an assignment carries (job_settings.h), each written, and read and
// checked, in settings_codec.cpp only; `message` names the message for errors.
flatbuffers::Offset<fb::TrainSettings> buildTrain(flatbuffers::FlatBufferBuilder& b,
                                                  const TrainSettings& t);
flatbuffers::Offset<fb::DataSettings> buildData(flatbuffers::FlatBufferBuilder& b,
                                                const DataSettings& d);
flatbuffers::Offset<fb::WireSettings> buildWire(flatbuffers::FlatBufferBuilder& b,
                                                const WireSettings& w);
TrainSettings readTrain(const char* message, const fb::TrainSettings* t);
DataSettings readData(const char* message, const fb::DataSettings* d);
WireSettings readWire(const char* message, const fb::WireSettings* w);

// The stage worker's messages (stage_messages.cpp).
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const WorkerHello& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Assign& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const WeightsRequest& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const WeightsChunk& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Ready& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Start& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const GroupAddress& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const GroupAddresses& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Progress& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const EpochDone& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const InferDone& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const StageReport& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Failed& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Checkpointed& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Answer& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Prompt& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const PromptsDone& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const CancelPrompt& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Token& m);
flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const StageBusy& m);
// The message of a stage worker's body type; FormatError naming the field at fault.
Message readStageMessage(const fb::Message* msg);
// What serving and generation send: answers, prompts, tokens, cancels, stage loads
// (serving_messages.cpp).
Message readServingMessage(const fb::Message* msg);

}  // namespace tandem::runtime::detail
