// Writes a seed corpus of valid wire headers (one per codec, dtype and message kind) for
// wire_header_fuzz into the directory given as the only argument.
#include <cstdio>
#include <fstream>
#include <string>

#include "transport/wire.h"

int main(int argc, char** argv) {
  using namespace tandem::transport;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  int n = 0;
  for (Codec codec : {Codec::kRaw, Codec::kF16, Codec::kBF16, Codec::kI8}) {
    for (tandem::MessageKind kind :
         {tandem::MessageKind::kActivation, tandem::MessageKind::kLabel}) {
      WireHeader h;
      h.kind = kind;
      h.microbatch = n;
      h.codec = codec;
      h.dtype = codec == Codec::kRaw && kind == tandem::MessageKind::kLabel ? tandem::DType::kI32
                                                                            : tandem::DType::kF32;
      h.shape = tandem::Shape{3, 5};
      if (codec == Codec::kI8) {
        h.block = 4;
        h.scales = {0.5f, 1.0f, 0.25f, 0.0f};
      }
      h.payload_bytes = encodedBytes(codec, h.dtype, 15);
      if (n % 2) h.checksum = 0x1234abcd;
      const auto bytes = encodeHeader(h);
      std::ofstream(std::string(argv[1]) + "/seed-" + std::to_string(n++), std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()),
                 static_cast<std::streamsize>(bytes.size()));
    }
  }
  std::printf("wrote %d seeds to %s\n", n, argv[1]);
  return 0;
}
