#include "core/data/idx.h"

#include <zlib.h>

#include <memory>

#include "core/error.h"

namespace tandem {

namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

// Reads exactly n bytes or reports how many were there.
void readExact(gzFile f, void* dst, size_t n, const std::string& path, const char* what) {
  size_t got = 0;
  auto* out = static_cast<uint8_t*>(dst);
  while (got < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30));
    const int r = gzread(f, out + got, chunk);
    if (r < 0) {
      int err = 0;
      throw FormatError("IDX file '" + path + "': decompression failed while reading " + what +
                        ": " + gzerror(f, &err));
    }
    if (r == 0) {
      throw FormatError("IDX file '" + path + "': truncated " + what + " (expected " +
                        std::to_string(n) + " bytes, got " + std::to_string(got) + ")");
    }
    got += static_cast<size_t>(r);
  }
}

}  // namespace

IdxArray readIdx(const std::string& path, uint64_t max_elements) {
  // gzopen reads plain files transparently, so both forms take this path.
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) throw IoError("cannot open IDX file '" + path + "'");
  uint8_t magic[4];
  readExact(f.get(), magic, 4, path, "header");
  if (magic[0] != 0 || magic[1] != 0)
    throw FormatError("IDX file '" + path + "': bad magic (first two bytes must be zero)");
  if (magic[2] != 0x08)
    throw FormatError("IDX file '" + path + "': element type 0x" + std::to_string(magic[2]) +
                      " is not unsigned byte (0x08)");
  const int rank = magic[3];
  if (rank < 1 || rank > 4)
    throw FormatError("IDX file '" + path + "': rank " + std::to_string(rank) + " not in [1, 4]");
  IdxArray a;
  uint64_t total = 1;
  for (int i = 0; i < rank; ++i) {
    uint8_t b[4];
    readExact(f.get(), b, 4, path, "dimension sizes");
    const uint32_t d =
        (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
    a.dims.push_back(d);
    total *= d;
    if (total > (uint64_t{1} << 32))
      throw FormatError("IDX file '" + path + "': more than 2^32 elements declared");
    if (total > max_elements)
      throw FormatError("IDX file '" + path + "': more than " + std::to_string(max_elements) +
                        " elements declared (the limit)");
  }
  a.data.resize(total);
  readExact(f.get(), a.data.data(), total, path, "data");
  return a;
}

}  // namespace tandem
