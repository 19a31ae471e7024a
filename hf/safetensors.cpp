#include "hf/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file.h"

namespace tandem::hf {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies it as it is");

namespace {

using Json = nlohmann::json;

// The reference implementation's bound on a header, which keeps a hostile length from
// asking for gigabytes of JSON.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

[[noreturn]] void bad(const std::string& label, const std::string& what) {
  throw FormatError(label + ": " + what);
}

[[noreturn]] void badTensor(const std::string& label, const std::string& name,
                            const std::string& what) {
  bad(label, "tensor '" + name + "': " + what);
}

uint64_t unsignedOf(const Json& v, const std::string& label, const std::string& name,
                    const char* field) {
  if (!v.is_number_unsigned())
    badTensor(label, name,
              std::string("'") + field + "' holds " + v.dump() + ", not a non-negative integer");
  return v.get<uint64_t>();
}

TensorEntry parseEntry(const std::string& name, const Json& info, const std::string& label) {
  if (name.empty()) bad(label, "a tensor has an empty name");
  if (!info.is_object()) badTensor(label, name, "its entry is " + info.dump() + ", not an object");
  for (const auto& [key, value] : info.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      badTensor(label, name, "unexpected field '" + key + "'");
  TensorEntry e;
  e.name = name;
  if (!info.contains("dtype") || !info["dtype"].is_string())
    badTensor(label, name, "'dtype' is missing or not a string");
  e.dtype = info["dtype"].get<std::string>();
  const size_t size = safetensorsDTypeSize(e.dtype);
  if (size == 0) badTensor(label, name, "unknown dtype '" + e.dtype + "'");
  if (!info.contains("shape") || !info["shape"].is_array())
    badTensor(label, name, "'shape' is missing or not a list");
  uint64_t bytes = size;
  for (const Json& d : info["shape"]) {
    const uint64_t dim = unsignedOf(d, label, name, "shape");
    if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(bytes, dim, &bytes))
      badTensor(label, name, "shape " + info["shape"].dump() + " overflows");
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  const Json* offsets = info.contains("data_offsets") ? &info["data_offsets"] : nullptr;
  if (offsets == nullptr || !offsets->is_array() || offsets->size() != 2)
    badTensor(label, name, "'data_offsets' is missing or not [begin, end]");
  e.begin = unsignedOf((*offsets)[0], label, name, "data_offsets");
  e.end = unsignedOf((*offsets)[1], label, name, "data_offsets");
  if (e.end < e.begin)
    badTensor(label, name, "data_offsets " + offsets->dump() + " end before they begin");
  if (e.end - e.begin != bytes)
    badTensor(label, name,
              "data_offsets " + offsets->dump() + " hold " + std::to_string(e.end - e.begin) +
                  " bytes; " + e.dtype + " " + info["shape"].dump() + " needs " +
                  std::to_string(bytes));
  return e;
}

std::string describeRange(const TensorEntry& e) {
  std::string out = "[";
  out += std::to_string(e.begin);
  out += ", ";
  out += std::to_string(e.end);
  out += ")";
  return out;
}

}  // namespace

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t safetensorsDTypeSize(std::string_view dtype) {
  if (dtype == "BOOL" || dtype == "U8" || dtype == "I8" || dtype == "F8_E5M2" || dtype == "F8_E4M3")
    return 1;
  if (dtype == "I16" || dtype == "U16" || dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "I32" || dtype == "U32" || dtype == "F32") return 4;
  if (dtype == "I64" || dtype == "U64" || dtype == "F64") return 8;
  return 0;
}

Header parseHeader(std::string_view json, uint64_t data_bytes, const std::string& label) {
  if (json.empty() || json.front() != '{') bad(label, "the header does not start with '{'");
  const Json root = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) bad(label, "the header is not valid JSON");
  if (!root.is_object()) bad(label, "the header is not a JSON object");
  Header h;
  for (const auto& [name, info] : root.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) bad(label, "'__metadata__' is not an object");
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string()) bad(label, "metadata '" + key + "' is not a string");
        h.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parseEntry(name, info, label));
  }
  // The tensors tile the data: sorted by offset, each begins where the one before ended.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const TensorEntry& e : h.tensors) {
    if (e.begin < at)
      badTensor(label, e.name, "bytes " + describeRange(e) + " overlap another tensor's");
    if (e.begin > at)
      badTensor(label, e.name,
                "bytes " + describeRange(e) + " leave a gap after " + std::to_string(at));
    if (e.end > data_bytes)
      badTensor(label, e.name,
                "bytes " + describeRange(e) + " run past the data's " + std::to_string(data_bytes));
    at = e.end;
  }
  if (at != data_bytes)
    bad(label, "the tensors hold " + std::to_string(at) + " of the data's " +
                   std::to_string(data_bytes) + " bytes");
  return h;
}

Layout parseLayout(std::span<const uint8_t> file, const std::string& label) {
  if (file.size() < 8)
    bad(label, "only " + std::to_string(file.size()) + " bytes: no header length");
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  if (n > kMaxHeaderBytes)
    bad(label, "a header of " + std::to_string(n) + " bytes is over the limit of " +
                   std::to_string(kMaxHeaderBytes));
  if (n > file.size() - 8)
    bad(label, "a header of " + std::to_string(n) + " bytes runs past the file's " +
                   std::to_string(file.size()));
  Layout layout;
  layout.data_start = 8 + n;
  layout.header = parseHeader(
      std::string_view(reinterpret_cast<const char*>(file.data()) + 8, static_cast<size_t>(n)),
      file.size() - layout.data_start, label);
  return layout;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError("cannot map '" + path + "': not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw IoError("cannot map '" + path + "': " + std::strerror(err));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  fd_ = fd;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  ::close(fd_);
}

SafetensorsFile::SafetensorsFile(const std::string& path)
    : file_(path), layout_(parseLayout(file_.bytes(), path)) {}

const TensorEntry* SafetensorsFile::find(std::string_view name) const {
  for (const TensorEntry& e : tensors())
    if (e.name == name) return &e;
  return nullptr;
}

std::span<const uint8_t> SafetensorsFile::bytes(const TensorEntry& entry) const {
  return file_.bytes().subspan(layout_.data_start + entry.begin, entry.end - entry.begin);
}

std::vector<float> SafetensorsFile::floats(const TensorEntry& entry) const {
  return widenToFloat(bytes(entry), entry.dtype, path() + ": tensor '" + entry.name + "'");
}

FileExtent SafetensorsFile::extent(const TensorEntry& entry) const {
  return {file_.fd(), layout_.data_start + entry.begin, entry.end - entry.begin};
}

void SafetensorsFile::readFloats(const TensorEntry& entry, std::span<float> out) const {
  widenInto(bytes(entry), entry.dtype, path() + ": tensor '" + entry.name + "'", out);
}

std::vector<float> widenToFloat(std::span<const uint8_t> bytes, std::string_view dtype,
                                const std::string& what) {
  const size_t size = safetensorsDTypeSize(dtype);
  std::vector<float> out(size == 0 ? 0 : bytes.size() / size);
  widenInto(bytes, dtype, what, out);
  return out;
}

void widenInto(std::span<const uint8_t> bytes, std::string_view dtype, const std::string& what,
               std::span<float> out) {
  if (dtype != "F32" && dtype != "F16" && dtype != "BF16")
    throw InvalidArgument(what + " is " + std::string(dtype) +
                          "; weights are read from F32, F16 or BF16");
  const size_t size = safetensorsDTypeSize(dtype);
  TANDEM_CHECK_MSG(
      bytes.size() == out.size() * size, InvalidArgument,
      what << ": " << bytes.size() << " bytes of " << dtype << " into " << out.size() << " values");
  if (dtype == "F32") {
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * 4);
    return;
  }
  const bool half = dtype == "F16";
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t v = 0;
    std::memcpy(&v, bytes.data() + 2 * i, 2);
    out[i] = half ? halfToFloat(v) : bfloat16ToFloat(v);
  }
}

std::vector<uint8_t> encodeSafetensors(const std::vector<TensorData>& tensors,
                                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t at = 0;
  for (const TensorData& t : tensors) {
    TANDEM_CHECK_MSG(!t.name.empty() && t.name != "__metadata__", InvalidArgument,
                     "safetensors: a tensor cannot be named '" << t.name << "'");
    TANDEM_CHECK_MSG(!header.contains(t.name), InvalidArgument,
                     "safetensors: tensor '" << t.name << "' given twice");
    const size_t size = safetensorsDTypeSize(t.dtype);
    TANDEM_CHECK_MSG(size != 0, InvalidArgument,
                     "safetensors: tensor '" << t.name << "': unknown dtype '" << t.dtype << "'");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      TANDEM_CHECK_MSG(d >= 0, InvalidArgument,
                       "safetensors: tensor '" << t.name << "' has a negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    TANDEM_CHECK_MSG(t.bytes.size() == numel * size, InvalidArgument,
                     "safetensors: tensor '" << t.name << "' has " << t.bytes.size()
                                             << " bytes; its shape needs " << numel * size);
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes.size()}}};
    at += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  std::vector<uint8_t> out(8 + text.size() + at);
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  uint8_t* data = out.data() + 8 + text.size();
  for (const TensorData& t : tensors) {
    if (!t.bytes.empty()) std::memcpy(data, t.bytes.data(), t.bytes.size());
    data += t.bytes.size();
  }
  return out;
}

void writeSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::vector<uint8_t> bytes = encodeSafetensors(tensors, metadata);
  checkWritable(path, "safetensors file");
  writeFileAtomically(path, bytes, "safetensors file");
}

SafetensorsFolder::SafetensorsFolder(const std::string& dir) : dir_(dir) {
  const std::string index = dir + "/model.safetensors.index.json";
  const std::string single = dir + "/model.safetensors";
  struct stat st {};
  if (::stat(index.c_str(), &st) == 0) {
    const Json root = Json::parse(readFile(index, "safetensors index"), nullptr, false);
    if (root.is_discarded() || !root.is_object() || !root.contains("weight_map") ||
        !root["weight_map"].is_object())
      bad(index, "not a JSON object with a 'weight_map' object");
    for (const auto& [name, file] : root["weight_map"].items()) {
      if (!file.is_string()) bad(index, "tensor '" + name + "': its shard is not a file name");
      const auto shard = file.get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
        bad(index, "tensor '" + name + "': shard '" + shard + "' is not a file in the folder");
      shard_of_[name] = shard;
    }
  } else if (::stat(single.c_str(), &st) == 0) {
    auto file = std::make_unique<SafetensorsFile>(single);
    for (const TensorEntry& e : file->tensors()) shard_of_[e.name] = "model.safetensors";
    shards_["model.safetensors"] = std::move(file);
  } else {
    throw IoError("'" + dir + "' has neither model.safetensors nor model.safetensors.index.json");
  }
}

SafetensorsFolder::~SafetensorsFolder() = default;

std::vector<std::string> SafetensorsFolder::names() const {
  std::vector<std::string> out;
  for (const auto& [name, shard] : shard_of_) out.push_back(name);
  return out;
}

bool SafetensorsFolder::contains(std::string_view name) const {
  return shard_of_.find(std::string(name)) != shard_of_.end();
}

SafetensorsFile& SafetensorsFolder::shardOf(const std::string& name) {
  const auto it = shard_of_.find(name);
  TANDEM_CHECK_MSG(it != shard_of_.end(), InvalidArgument,
                   "'" << dir_ << "' has no tensor '" << name << "'");
  auto& shard = shards_[it->second];
  if (!shard) shard = std::make_unique<SafetensorsFile>(dir_ + "/" + it->second);
  return *shard;
}

const TensorEntry& SafetensorsFolder::entry(const std::string& name) {
  SafetensorsFile& shard = shardOf(name);
  const TensorEntry* e = shard.find(name);
  if (e == nullptr) bad(shard.path(), "the index puts tensor '" + name + "' here; it is not");
  return *e;
}

std::vector<float> SafetensorsFolder::floats(const std::string& name) {
  const TensorEntry& e = entry(name);
  return shardOf(name).floats(e);
}

void SafetensorsFolder::readFloats(const std::string& name, std::span<float> out) {
  const TensorEntry& e = entry(name);
  shardOf(name).readFloats(e, out);
}

FileExtent SafetensorsFolder::extent(const std::string& name) {
  const TensorEntry& e = entry(name);
  return shardOf(name).extent(e);
}

size_t SafetensorsFolder::mappedShards() const {
  size_t n = 0;
  for (const auto& [file, shard] : shards_) n += shard ? 1 : 0;
  return n;
}

}  // namespace tandem::hf
