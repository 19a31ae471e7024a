// Writes a seed corpus for socket_link_fuzz into the directory given as the only
// argument: a raw hello without the key (and one cut short), and sealed sessions of
// valid messages (activations and gradients of a few shapes and dtypes) and of a junk
// header.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "transport/link_seal.h"
#include "transport/wire.h"

namespace {

void write(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

// A sealed message as the fuzz target takes it: lengths, header, payload.
std::vector<uint8_t> message(const std::vector<uint8_t>& header, size_t payload_bytes) {
  std::vector<uint8_t> out = {
      static_cast<uint8_t>(header.size()), static_cast<uint8_t>(header.size() >> 8),
      static_cast<uint8_t>(payload_bytes), static_cast<uint8_t>(payload_bytes >> 8)};
  out.insert(out.end(), header.begin(), header.end());
  for (size_t i = 0; i < payload_bytes; ++i) out.push_back(static_cast<uint8_t>(i * 13));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  using namespace tandem::transport;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const HelloBytes hello = writeHello({false, 0, 1, 0, "tcp://127.0.0.1:1"}, std::nullopt);
  std::vector<uint8_t> raw = {0};
  raw.insert(raw.end(), hello.begin(), hello.end());
  write(dir + "/raw-hello", raw);
  write(dir + "/raw-hello-cut", std::vector<uint8_t>(raw.begin(), raw.begin() + 40));
  std::vector<uint8_t> session = {1};
  int n = 2;
  int64_t mb = 0;
  for (const Shape& shape : {Shape{1}, Shape{4, 3}, Shape{2, 2, 2}}) {
    for (MessageKind kind : {MessageKind::kActivation, MessageKind::kGradient}) {
      WireHeader h;
      h.src_stage = 0;
      h.dst_stage = 1;
      h.kind = kind;
      h.microbatch = mb % 4;
      h.shape = shape;
      h.dtype = mb % 3 == 2 ? DType::kI32 : DType::kF32;
      h.payload_bytes = static_cast<uint64_t>(shape.numel()) * 4;
      const std::vector<uint8_t> one = message(encodeHeader(h), h.payload_bytes);
      std::vector<uint8_t> alone = {1};
      alone.insert(alone.end(), one.begin(), one.end());
      write(dir + "/sealed-" + std::to_string(n++), alone);
      session.insert(session.end(), one.begin(), one.end());
      ++mb;
    }
  }
  write(dir + "/sealed-session", session);
  std::vector<uint8_t> junk = {1};
  const std::vector<uint8_t> bad = message(std::vector<uint8_t>(24, 0xee), 8);
  junk.insert(junk.end(), bad.begin(), bad.end());
  write(dir + "/sealed-junk-header", junk);
  std::printf("wrote %d seeds to %s\n", n + 2, dir.c_str());
  return 0;
}
