// IDX files (the MNIST family's format), plain or gzip-compressed: magic 0x0000 TT NN
// (TT = element type, NN = rank), NN big-endian u32 sizes, then the data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // unsigned bytes (type 0x08), row-major
};

// Reads an unsigned-byte IDX file; throws IoError if it cannot be opened and FormatError
// naming the path and the defect if it is not a valid, complete IDX file, or if it declares
// more than `max_elements` elements (at most 2^32 in any case).
IdxArray readIdx(const std::string& path, uint64_t max_elements = uint64_t{1} << 32);

}  // namespace tandem
