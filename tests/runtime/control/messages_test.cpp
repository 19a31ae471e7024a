#include "runtime/control/messages.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <cstring>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "runtime/control/schema/control_generated.h"
#include "tests/runtime/control/raw_message.h"
#include "tests/test_util.h"

namespace tandem::runtime {
namespace {

namespace fb = tandem::control;
using test::raw;
using testing::expectThrowWith;

NodeInfo sampleNode() {
  NodeInfo n;
  n.name = "edge";
  n.build = "tandem 0.1.0";
  n.arch = "aarch64";
  n.cpus = 4;
  n.memory_bytes = int64_t{4} << 30;
  n.free_memory_bytes = int64_t{3} << 30;
  n.load = 0.25f;
  n.devices = {{"cpu", "Cortex-A72", int64_t{4} << 30, 4, false},
               {"opencl:0", "VideoCore", int64_t{1} << 30, 12, true}};
  n.cached_weights = {"ab12", "cd34"};
  n.datasets = {"fashion-mnist"};
  n.cpu_cores = 0.25f;
  n.cpu_quota = 0.25f;
  return n;
}

TEST(MessagesTest, EveryMessageSurvivesARoundTrip) {
  Hello h{{1, 2, 3}, "tandem 0.1.0", {}};
  for (size_t i = 0; i < h.nonce.size(); ++i) h.nonce[i] = static_cast<uint8_t>(i * 7);
  Proof p;
  p.mac.fill(0xab);
  const std::vector<Message> all = {h,
                                    p,
                                    Refused{Refusal::kVersion, "speaks 2.0.0"},
                                    sampleNode(),
                                    NodeInfo{},
                                    Ping{7, -5},
                                    Pong{7, 1, 2, 3},
                                    Leave{"done"},
                                    ErrorReply{"unexpected"}};
  for (const Message& m : all) {
    const Message back = decodeMessage(encodeMessage(m));
    EXPECT_EQ(back.index(), m.index()) << messageName(m);
    EXPECT_TRUE(back == m) << messageName(m);
  }
}

TEST(MessagesTest, BytesThatAreNoMessageAreRefusedByName) {
  expectThrowWith<FormatError>([] { decodeMessage(std::vector<uint8_t>(4, 0)); }, {"too short"});
  expectThrowWith<FormatError>([] { decodeMessage(std::vector<uint8_t>((64 << 20) + 1, 0)); },
                               {"exceeds the cap"});
  expectThrowWith<FormatError>([] { decodeMessage(std::vector<uint8_t>(64, 0x5a)); },
                               {"'TDC1' identifier"});
  // The right identifier on garbage: the verifier refuses it.
  std::vector<uint8_t> bytes = encodeMessage(Leave{"bye"});
  for (size_t i = 0; i < 4; ++i) bytes[i] = 0xff;
  expectThrowWith<FormatError>([&] { decodeMessage(bytes); }, {"verification"});
  // A message without a body.
  flatbuffers::FlatBufferBuilder b;
  fb::FinishMessageBuffer(b, fb::CreateMessage(b));
  expectThrowWith<FormatError>(
      [&] {
        decodeMessage({b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()});
      },
      {"unknown body type 0"});
  // A body type without its body (the verifier lets it through; the fuzzer found it).
  flatbuffers::FlatBufferBuilder typed;
  fb::MessageBuilder mb(typed);
  mb.add_body_type(fb::Body_Refused);
  fb::FinishMessageBuffer(typed, mb.Finish());
  expectThrowWith<FormatError>(
      [&] {
        decodeMessage({typed.GetBufferPointer(), typed.GetBufferPointer() + typed.GetSize()});
      },
      {"a 'Refused' without its body"});
  // The fuzzer's own finding, byte for byte.
  const std::vector<uint8_t> found = {
      0x08, 0x00, 0x00, 0x00, 0x54, 0x44, 0x43, 0x31, 0xf4, 0xff, 0xff, 0xff, 0x00, 0x00,
      0x00, 0x03, 0x0c, 0x00, 0x00, 0x00, 0x08, 0x00, 0x0c, 0x00, 0x07, 0x00, 0x00, 0x00,
      0x00, 0x08, 0x00, 0x0c, 0x00, 0x07, 0x00, 0x08, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x08, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x04, 0x00,
      0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x6e, 0x6f, 0x00, 0x00};
  expectThrowWith<FormatError>([&] { decodeMessage(found); }, {"without its body"});
}

TEST(MessagesTest, FieldsBeyondTheirLimitsAreRefusedNamingTheField) {
  using B = flatbuffers::FlatBufferBuilder;
  const auto short_nonce = raw([](B& b) {
    std::vector<uint8_t> nonce(31, 1);
    return std::pair{
        fb::Body_Hello,
        fb::CreateHello(b, 1, 0, 0, b.CreateString("x"), b.CreateVector(nonce)).Union()};
  });
  expectThrowWith<FormatError>([&] { decodeMessage(short_nonce); },
                               {"'hello'", "nonce must be 32 bytes, not 31"});
  const auto no_mac = raw([](B& b) {
    return std::pair{fb::Body_Proof, fb::CreateProof(b).Union()};
  });
  expectThrowWith<FormatError>([&] { decodeMessage(no_mac); }, {"'proof'", "mac", "not 0"});
  const auto long_build = raw([](B& b) {
    std::vector<uint8_t> nonce(32, 1);
    return std::pair{
        fb::Body_Hello,
        fb::CreateHello(b, 1, 0, 0, b.CreateString(std::string(129, 'x')), b.CreateVector(nonce))
            .Union()};
  });
  expectThrowWith<FormatError>([&] { decodeMessage(long_build); },
                               {"build of 129 bytes exceeds the limit of 128"});
  const auto bad_reason = raw([](B& b) {
    return std::pair{
        fb::Body_Refused,
        fb::CreateRefused(b, static_cast<fb::Refusal>(9), b.CreateString("?")).Union()};
  });
  expectThrowWith<FormatError>([&] { decodeMessage(bad_reason); }, {"unknown reason 9"});
  const auto negative_memory = raw([](B& b) {
    return std::pair{fb::Body_NodeInfo, fb::CreateNodeInfo(b, 0, 0, 0, 2, 100, -1).Union()};
  });
  expectThrowWith<FormatError>([&] { decodeMessage(negative_memory); },
                               {"'node info'", "free_memory_bytes is negative"});
  // A link result's host CPU and bytes (3.2) are checked like its measurements.
  const auto nan_cpu = raw([](B& b) {
    return std::pair{fb::Body_LinkResult,
                     fb::CreateLinkResult(b, 1, 0, 1e6, 0, 0, 0, 0, 1, std::nan("")).Union()};
  });
  expectThrowWith<FormatError>([&] { decodeMessage(nan_cpu); },
                               {"'link result'", "not a finite, non-negative number"});
  const auto negative_bytes = raw([](B& b) {
    return std::pair{fb::Body_LinkResult,
                     fb::CreateLinkResult(b, 1, 0, 1e6, 0, 0, 0, 0, 1, 0.5, -8).Union()};
  });
  expectThrowWith<FormatError>([&] { decodeMessage(negative_bytes); },
                               {"'link result'", "data_bytes is negative"});
  // Its process CPU (3.6) too.
  const auto negative_process_cpu = raw([](B& b) {
    return std::pair{fb::Body_LinkResult,
                     fb::CreateLinkResult(b, 1, 0, 1e6, 0, 0, 0, 0, 1, 0.5, 8, 0, -0.25).Union()};
  });
  expectThrowWith<FormatError>([&] { decodeMessage(negative_process_cpu); },
                               {"'link result'", "not a finite, non-negative number"});
  const auto nan_loaded = raw([](B& b) {
    return std::pair{
        fb::Body_LinkResult,
        fb::CreateLinkResult(b, 1, 0, 1e6, 0, 0, 0, 0, 1, 0.5, 8, 0, 0.25, std::nan("")).Union()};
  });
  expectThrowWith<FormatError>([&] { decodeMessage(nan_loaded); },
                               {"'link result'", "not a finite, non-negative number"});
  const auto negative_loaded_bytes = raw([](B& b) {
    return std::pair{fb::Body_LinkResult,
                     fb::CreateLinkResult(b, 1, 0, 1e6, 0, 0, 0, 0, 1, 0.5, 8, 0, 0.25, 0.5, -4)
                         .Union()};
  });
  expectThrowWith<FormatError>([&] { decodeMessage(negative_loaded_bytes); },
                               {"'link result'", "loaded_bytes is negative"});
  const auto nan_load = raw([](B& b) {
    return std::pair{fb::Body_NodeInfo,
                     fb::CreateNodeInfo(b, 0, 0, 0, 2, 100, 50, std::nanf("")).Union()};
  });
  expectThrowWith<FormatError>([&] { decodeMessage(nan_load); }, {"load", "finite"});
  for (const float cores : {-0.5f, std::nanf(""), 1e9f}) {
    const auto bad_quota = raw([&](B& b) {
      return std::pair{fb::Body_NodeInfo,
                       fb::CreateNodeInfo(b, 0, 0, 0, 2, 100, 50, 0, 0, 0, 0, 1.0f, cores).Union()};
    });
    expectThrowWith<FormatError>([&] { decodeMessage(bad_quota); },
                                 {"'node info'", "cpu_quota", "is not a core count"});
  }
  const auto many_devices = raw([](B& b) {
    std::vector<flatbuffers::Offset<fb::Device>> devices;
    for (int i = 0; i < 65; ++i) devices.push_back(fb::CreateDevice(b));
    return std::pair{fb::Body_NodeInfo,
                     fb::CreateNodeInfo(b, 0, 0, 0, 1, 1, 1, 0, b.CreateVector(devices)).Union()};
  });
  expectThrowWith<FormatError>([&] { decodeMessage(many_devices); },
                               {"65 devices exceed the limit of 64"});
}

TEST(MessagesTest, WeNeverEncodeWhatAPeerWouldRefuse) {
  NodeInfo n = sampleNode();
  n.name = std::string(129, 'n');
  expectThrowWith<InvalidArgument>([&] { encodeMessage(n); }, {"name of 129 bytes"});
  n = sampleNode();
  n.devices.resize(65);
  expectThrowWith<InvalidArgument>([&] { encodeMessage(n); }, {"65 devices"});
  expectThrowWith<InvalidArgument>([] { encodeMessage(ErrorReply{std::string(1025, 'e')}); },
                                   {"message of 1025 bytes"});
}

}  // namespace
}  // namespace tandem::runtime
