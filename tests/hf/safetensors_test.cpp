// The safetensors reader and writer (hf/safetensors.h): bitwise round trips, dtypes
// widened exactly, sharded folders mapped shard by shard, and hostile files refused
// naming the tensor and what is wrong, without reading outside the file.
#include "hf/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "core/dtype.h"
#include "core/error.h"
#include "tests/test_util.h"

namespace tandem::hf {
namespace {

std::vector<uint8_t> floatBytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

template <typename Convert>
std::vector<uint8_t> halfBytes(const std::vector<float>& v, Convert convert) {
  std::vector<uint8_t> out(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = convert(v[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

void writeBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A file of `header` JSON (not padded) followed by `data_bytes` zero bytes.
std::vector<uint8_t> rawFile(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes);
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::vector<TensorData> sampleTensors() {
  const auto w = testing::randomVector(1, 6);
  return {{"model.w", "F32", {2, 3}, floatBytes(w)},
          {"model.h", "F16", {4}, halfBytes({0.5f, -2.0f, 1e-6f, 65504.0f}, floatToHalf)},
          {"model.b", "BF16", {1, 2}, halfBytes({3.140625f, -0.0078125f}, floatToBFloat16)},
          {"ids", "I64", {2}, std::vector<uint8_t>(16, 7)},
          {"empty", "F32", {0, 5}, {}}};
}

TEST(SafetensorsTest, WrittenFilesReadBackBitwise) {
  const std::string dir = testing::freshDir("safetensors");
  const std::string path = dir + "/model.safetensors";
  const auto tensors = sampleTensors();
  writeSafetensors(path, tensors, {{"format", "pt"}});
  const std::vector<uint8_t> written = readBytes(path);
  uint64_t n = 0;
  std::memcpy(&n, written.data(), 8);
  EXPECT_EQ(n % 8, 0u);  // the header padded as the reference writer pads it

  SafetensorsFile file(path);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  ASSERT_EQ(file.tensors().size(), tensors.size());
  std::vector<TensorData> again;
  for (const TensorData& t : tensors) {
    const TensorEntry* e = file.find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(e->dtype, t.dtype);
    EXPECT_EQ(e->shape, t.shape);
    const auto bytes = file.bytes(*e);
    EXPECT_EQ(std::vector<uint8_t>(bytes.begin(), bytes.end()), t.bytes) << t.name;
    again.push_back({e->name, e->dtype, e->shape, {bytes.begin(), bytes.end()}});
  }
  EXPECT_EQ(encodeSafetensors(again, file.metadata()), written);
  EXPECT_EQ(file.find("absent"), nullptr);

  // F16 and BF16 widen exactly (every value above is representable).
  EXPECT_EQ(file.floats(*file.find("model.h")),
            (std::vector<float>{0.5f, -2.0f, halfToFloat(floatToHalf(1e-6f)), 65504.0f}));
  EXPECT_EQ(file.floats(*file.find("model.b")), (std::vector<float>{3.140625f, -0.0078125f}));
  EXPECT_EQ(file.floats(*file.find("model.w")), testing::randomVector(1, 6));
  EXPECT_TRUE(file.floats(*file.find("empty")).empty());
  testing::expectThrowWith<InvalidArgument>([&] { file.floats(*file.find("ids")); },
                                            {"tensor 'ids'", "I64", "F32, F16 or BF16"});
}

TEST(SafetensorsTest, TheWriterRefusesWhatTheFormatCannotHold) {
  auto twice = sampleTensors();
  twice.push_back(twice.front());
  testing::expectThrowWith<InvalidArgument>([&] { encodeSafetensors(twice); },
                                            {"'model.w' given twice"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        encodeSafetensors({{"x", "F32", {3}, std::vector<uint8_t>(8)}});
      },
      {"'x' has 8 bytes", "needs 12"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        encodeSafetensors({{"x", "F24", {1}, std::vector<uint8_t>(3)}});
      },
      {"unknown dtype 'F24'"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        encodeSafetensors({{"__metadata__", "F32", {}, std::vector<uint8_t>(4)}});
      },
      {"cannot be named '__metadata__'"});
}

struct Hostile {
  const char* why;
  std::vector<uint8_t> file;
  std::vector<std::string> message;
};

TEST(SafetensorsTest, HostileFilesAreRefusedNamingWhatIsWrong) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<uint8_t> beyond = rawFile(ok, 8);
  const uint64_t huge = 1000;
  std::memcpy(beyond.data(), &huge, 8);
  std::vector<uint8_t> over_limit = rawFile(ok, 8);
  const uint64_t enormous = uint64_t{1} << 62;
  std::memcpy(over_limit.data(), &enormous, 8);
  const Hostile cases[] = {
      {"too short", {1, 2, 3}, {"only 3 bytes"}},
      {"header past the file", beyond, {"1000 bytes runs past the file's"}},
      {"header over the limit", over_limit, {"over the limit"}},
      {"not an object", rawFile("[1, 2]", 0), {"does not start with '{'"}},
      {"not JSON", rawFile("{\"a\": ", 0), {"not valid JSON"}},
      {"overlap",
       rawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               8),
       {"tensor 'b'", "[4, 8) overlap"}},
      {"gap",
       rawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       {"tensor 'a'", "leave a gap after 0"}},
      {"past the end", rawFile(ok, 4), {"tensor 'a'", "run past the data's 4"}},
      {"bytes left over", rawFile(ok, 12), {"hold 8 of the data's 12 bytes"}},
      {"size against shape",
       rawFile(R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", 8),
       {"tensor 'a'", "hold 8 bytes", "needs 6"}},
      {"end before begin",
       rawFile(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
       {"tensor 'a'", "end before they begin"}},
      {"unknown dtype",
       rawFile(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8),
       {"tensor 'a'", "unknown dtype 'Q4'"}},
      {"negative dimension",
       rawFile(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
       {"tensor 'a'", "'shape' holds -2"}},
      {"overflowing shape",
       rawFile(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
       {"tensor 'a'", "overflows"}},
      {"offsets missing",
       rawFile(R"({"a":{"dtype":"F32","shape":[2]}})", 8),
       {"tensor 'a'", "'data_offsets' is missing"}},
      {"fractional offset",
       rawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.5]}})", 8),
       {"tensor 'a'", "not a non-negative integer"}},
      {"unexpected field",
       rawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8),
       {"tensor 'a'", "unexpected field 'x'"}},
      {"entry not an object", rawFile(R"({"a":5})", 0), {"tensor 'a'", "not an object"}},
      {"metadata not text",
       rawFile(R"({"__metadata__":{"k":1}})", 0),
       {"metadata 'k' is not a string"}},
      {"empty name",
       rawFile(R"({"":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", 0),
       {"empty name"}},
  };
  for (const Hostile& c : cases) {
    SCOPED_TRACE(c.why);
    std::vector<std::string> parts = c.message;
    parts.push_back("label: ");
    testing::expectThrowWith<FormatError>([&] { parseLayout(c.file, "label"); }, parts);
  }
  // A file on disk names its path.
  const std::string path = testing::freshDir("safetensors") + "/bad.safetensors";
  writeBytes(path, rawFile(ok, 4));
  testing::expectThrowWith<FormatError>([&] { SafetensorsFile{path}; }, {path, "tensor 'a'"});
  testing::expectThrowWith<IoError>([&] { SafetensorsFile{path + ".absent"}; },
                                    {"cannot open", ".absent"});
}

TEST(SafetensorsTest, AShardedFolderMapsOnlyTheShardsAskedFor) {
  const std::string dir = testing::freshDir("sharded");
  const auto tensors = sampleTensors();
  writeSafetensors(dir + "/model-00001-of-00002.safetensors", {tensors[0], tensors[1]});
  writeSafetensors(dir + "/model-00002-of-00002.safetensors", {tensors[2]});
  std::ofstream(dir + "/model.safetensors.index.json") << R"({"metadata": {"total_size": 16},
    "weight_map": {"model.w": "model-00001-of-00002.safetensors",
                   "model.h": "model-00001-of-00002.safetensors",
                   "model.b": "model-00002-of-00002.safetensors",
                   "lost": "model-00002-of-00002.safetensors"}})";
  SafetensorsFolder folder(dir);
  EXPECT_EQ(folder.names(), (std::vector<std::string>{"lost", "model.b", "model.h", "model.w"}));
  EXPECT_EQ(folder.mappedShards(), 0u);
  EXPECT_EQ(folder.floats("model.b"), (std::vector<float>{3.140625f, -0.0078125f}));
  EXPECT_EQ(folder.mappedShards(), 1u);
  EXPECT_EQ(folder.entry("model.w").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(folder.mappedShards(), 2u);
  testing::expectThrowWith<InvalidArgument>([&] { folder.floats("absent"); },
                                            {"has no tensor 'absent'", dir});
  testing::expectThrowWith<FormatError>([&] { folder.entry("lost"); },
                                        {"model-00002-of-00002.safetensors", "tensor 'lost'"});

  // An index naming a file outside the folder is refused before anything is mapped.
  const std::string evil = testing::freshDir("evil");
  std::ofstream(evil + "/model.safetensors.index.json")
      << R"({"weight_map": {"w": "../sharded/model-00001-of-00002.safetensors"}})";
  testing::expectThrowWith<FormatError>([&] { SafetensorsFolder{evil}; },
                                        {"tensor 'w'", "is not a file in the folder"});
  std::ofstream(evil + "/model.safetensors.index.json") << R"({"weights": {}})";
  testing::expectThrowWith<FormatError>([&] { SafetensorsFolder{evil}; }, {"'weight_map'"});

  // One file.
  const std::string single = testing::freshDir("single");
  writeSafetensors(single + "/model.safetensors", tensors);
  SafetensorsFolder one(single);
  EXPECT_EQ(one.names().size(), tensors.size());
  EXPECT_EQ(one.mappedShards(), 1u);
  testing::expectThrowWith<IoError>([&] { SafetensorsFolder{testing::freshDir("none")}; },
                                    {"neither model.safetensors nor"});
}

}  // namespace
}  // namespace tandem::hf
