// Hugging Face's safetensors files: an 8-byte little-endian header length N, N bytes of
// JSON — {"<tensor>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"<key>": "<text>"}} — then the tensors' bytes, offsets counted from the
// end of the header. A file is memory-mapped and checked whole before any tensor is read:
// every entry well-formed, its bytes the size its dtype and shape say, and the entries
// tiling the data exactly (no overlap, no gap, nothing past the end), as the reference
// implementation requires. A sharded model is a folder with `model.safetensors.index.json`
// ({"weight_map": {"<tensor>": "<shard file>"}}) naming each tensor's shard.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/file.h"

namespace tandem::hf {

// One tensor's entry. dtype is the file's name for it ("F32", "BF16", "I64", ...).
struct TensorEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // within the data, after the header
  int64_t numel() const;
};

// Bytes per element of a safetensors dtype name; 0 for a name the format does not have.
size_t safetensorsDTypeSize(std::string_view dtype);

// The entries and metadata of a header (the JSON text), checked against a data region of
// `data_bytes`: FormatError "<label>: tensor '<name>': <what is wrong>" otherwise.
struct Header {
  std::vector<TensorEntry> tensors;  // in the order of their offsets
  std::map<std::string, std::string> metadata;
};
Header parseHeader(std::string_view json, uint64_t data_bytes, const std::string& label);

// A whole file's bytes (a mapped file or a buffer): the header's length, its JSON and the
// data after it, checked as parseHeader does.
struct Layout {
  Header header;
  uint64_t data_start = 0;  // 8 + N
};
Layout parseLayout(std::span<const uint8_t> file, const std::string& label);

// A read-only mapping of a file; IoError naming the path when it cannot be mapped.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }
  // The file, open for reading while the mapping lives (its bytes copied file to file).
  int fd() const { return fd_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
};

// One safetensors file, mapped and checked.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::vector<TensorEntry>& tensors() const { return layout_.header.tensors; }
  const std::map<std::string, std::string>& metadata() const { return layout_.header.metadata; }
  // nullptr when the file has no such tensor.
  const TensorEntry* find(std::string_view name) const;
  // The tensor's bytes as stored (little-endian).
  std::span<const uint8_t> bytes(const TensorEntry& entry) const;
  // The tensor as f32 values: F32, F16 and BF16 (exactly widened); InvalidArgument naming
  // the tensor and its dtype for any other.
  std::vector<float> floats(const TensorEntry& entry) const;
  // ... written into `out`, which holds exactly its numel values (InvalidArgument else).
  void readFloats(const TensorEntry& entry, std::span<float> out) const;
  // Where the tensor's bytes are in the file (valid while this file lives).
  FileExtent extent(const TensorEntry& entry) const;
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  Layout layout_;
};

// The f32 values of the elements of dtype F32, F16 or BF16 at `bytes`; InvalidArgument
// naming `what` for another dtype.
std::vector<float> widenToFloat(std::span<const uint8_t> bytes, std::string_view dtype,
                                const std::string& what);
// ... written into `out`, which holds as many values as `bytes` does elements
// (InvalidArgument naming `what` else).
void widenInto(std::span<const uint8_t> bytes, std::string_view dtype, const std::string& what,
               std::span<float> out);

// A tensor to write: its bytes in `dtype` (little-endian), numel * size of them.
struct TensorData {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// The file's bytes for these tensors (data in the order given), the header padded with
// spaces to a multiple of 8 bytes as the reference writer does. InvalidArgument for a
// duplicate or empty name, an unknown dtype or bytes of the wrong size.
std::vector<uint8_t> encodeSafetensors(const std::vector<TensorData>& tensors,
                                       const std::map<std::string, std::string>& metadata = {});
// Writes them to `path` (through a temporary file renamed into place).
void writeSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The weights of a Hugging Face model folder: `model.safetensors`, or the shards that
// `model.safetensors.index.json` names; a shard is mapped when one of its tensors is first
// asked for, so a node that loads only its stages' tensors maps only their shards.
class SafetensorsFolder {
 public:
  explicit SafetensorsFolder(const std::string& dir);
  ~SafetensorsFolder();
  // Every tensor's name, sorted.
  std::vector<std::string> names() const;
  bool contains(std::string_view name) const;
  // The tensor's entry and values; InvalidArgument naming the tensor and the folder when
  // it is missing.
  const TensorEntry& entry(const std::string& name);
  std::vector<float> floats(const std::string& name);
  void readFloats(const std::string& name, std::span<float> out);
  // Where the tensor's bytes are in its shard (valid while this folder lives).
  FileExtent extent(const std::string& name);
  // Shards mapped so far.
  size_t mappedShards() const;

 private:
  SafetensorsFile& shardOf(const std::string& name);

  std::string dir_;
  std::map<std::string, std::string> shard_of_;  // tensor -> file name in dir_
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
};

}  // namespace tandem::hf
