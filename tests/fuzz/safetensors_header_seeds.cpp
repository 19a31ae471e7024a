// Writes a seed corpus of safetensors files for safetensors_header_fuzz into the directory
// given as the only argument: the writer's own output (f32, f16, bf16 and i64 tensors,
// empty ones, metadata) and an empty file.
#include <cstdio>
#include <fstream>
#include <string>

#include "hf/safetensors.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  using tandem::hf::TensorData;
  const std::vector<std::vector<TensorData>> files = {
      {{"w", "F32", {2, 3}, std::vector<uint8_t>(24, 1)}},
      {{"a.weight", "F16", {4}, std::vector<uint8_t>(8, 2)},
       {"a.bias", "BF16", {1, 2}, std::vector<uint8_t>(4, 3)},
       {"ids", "I64", {2}, std::vector<uint8_t>(16, 0)},
       {"empty", "F32", {0, 5}, {}}},
      {},
  };
  int n = 0;
  for (const auto& tensors : files) {
    const auto bytes = tandem::hf::encodeSafetensors(tensors, {{"format", "pt"}});
    std::ofstream(std::string(argv[1]) + "/seed-" + std::to_string(n++), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
  return 0;
}
