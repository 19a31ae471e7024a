// IDX reading (plain and gzip), Fashion-MNIST loading errors, shuffling and batching, and
// the rules of what a node reads.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/data/dataset.h"
#include "core/data/idx.h"
#include "core/data/text.h"
#include "core/error.h"
#include "core/random.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::expectThrowWith;

std::vector<uint8_t> idxBytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data,
                              uint8_t type = 0x08) {
  std::vector<uint8_t> b = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

std::string writeFile(const std::string& name, const std::vector<uint8_t>& bytes, bool gzip) {
  const std::string path = ::testing::TempDir() + "/" + name;
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
  return path;
}

TEST(IdxTest, ReadsPlainAndGzipFiles) {
  const std::vector<uint8_t> data = {1, 2, 3, 4, 5, 6};
  for (bool gz : {false, true}) {
    const IdxArray a = readIdx(writeFile(gz ? "a.idx.gz" : "a.idx", idxBytes({2, 3}, data), gz));
    EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(a.data, data);
  }
}

TEST(IdxTest, DefectsAreNamed) {
  expectThrowWith<FormatError>(
      [] {
        readIdx(writeFile("t.gz", idxBytes({2, 3}, {1, 2, 3}), true));
      },
      {"t.gz", "truncated data", "expected 6 bytes, got 3"});
  expectThrowWith<FormatError>(
      [] {
        readIdx(writeFile("m", {1, 0, 8, 1, 0, 0, 0, 0}, false));
      },
      {"bad magic"});
  expectThrowWith<FormatError>(
      [] {
        readIdx(writeFile("f", idxBytes({1}, {0, 0, 0, 0}, 0x0d), false));
      },
      {"not unsigned byte"});
  expectThrowWith<FormatError>(
      [] {
        readIdx(writeFile("h", {0, 0, 8}, false));
      },
      {"truncated header"});
  expectThrowWith<FormatError>(
      [] {
        readIdx(writeFile("big", idxBytes({65536, 65536, 2}, {}), false));
      },
      {"more than 2^32"});
  EXPECT_THROW(readIdx("/nonexistent.idx"), IoError);
}

TEST(DatasetTest, MissingFashionMnistNamesThePathAndThePackage) {
  expectThrowWith<IoError>(
      [] { loadFashionMnist("/nonexistent-dir", true); },
      {"/nonexistent-dir/train-images-idx3-ubyte.gz", "dataset-fashion-mnist"});
  expectThrowWith<InvalidArgument>([] { loadDataset("cifar", "", true); },
                                   {"unknown dataset 'cifar'"});
}

TEST(DatasetTest, SmallFashionMnistLayoutLoadsWithLabelChecks) {
  const std::string dir = ::testing::TempDir() + "/fm";
  std::filesystem::create_directories(dir);
  std::vector<uint8_t> pixels(3 * 4, 255);
  writeFile("fm/train-images-idx3-ubyte.gz", idxBytes({3, 2, 2}, pixels), true);
  writeFile("fm/train-labels-idx1-ubyte.gz", idxBytes({3}, {0, 9, 4}), true);
  const Dataset d = loadFashionMnist(dir, true, 2);
  EXPECT_EQ(d.size(), 2);
  EXPECT_EQ(d.sample_shape, (Shape{1, 2, 2}));
  std::vector<float> x;
  std::vector<int32_t> y;
  gatherBatch(d, {1, 0}, 0, 2, x, y);
  EXPECT_EQ(y, (std::vector<int32_t>{9, 0}));
  EXPECT_NEAR(x[0], (1.0f - d.mean) / d.stddev, 1e-6);
  expectThrowWith<InvalidArgument>(
      [&] {
        gatherBatch(d, {1, 2}, 0, 2, x, y);
      },
      {"batch position 1 names sample 2 of 2"});
  expectThrowWith<InvalidArgument>(
      [&] {
        gatherBatch(d, {1, 0}, 1, 2, x, y);
      },
      {"batch [1, 3) of an order of 2 samples"});
  writeFile("fm/train-labels-idx1-ubyte.gz", idxBytes({3}, {0, 10, 4}), true);
  expectThrowWith<FormatError>([&] { loadFashionMnist(dir, true); }, {"label 10 of sample 1"});
  writeFile("fm/train-labels-idx1-ubyte.gz", idxBytes({2}, {0, 1}), true);
  expectThrowWith<FormatError>([&] { loadFashionMnist(dir, true); }, {"2 labels for 3 images"});
}

TEST(DatasetTest, EpochOrderIsASeededPermutation) {
  const auto a = epochOrder(1000, true, 7, 0);
  EXPECT_EQ(a, epochOrder(1000, true, 7, 0));
  EXPECT_NE(a, epochOrder(1000, true, 7, 1));
  EXPECT_NE(a, epochOrder(1000, true, 8, 0));
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, epochOrder(1000, false, 7, 0));
  // Fixed expectation: the order is platform-independent (no std:: distributions).
  const auto small = epochOrder(5, true, 1, 0);
  EXPECT_EQ(small, epochOrder(5, true, 1, 0));
  EXPECT_EQ(std::count(small.begin(), small.end(), 4), 1);
}

// Random letters: every 8-byte window occurs once, so a window tells where it was taken.
std::string textOf(int64_t n) {
  std::string t;
  Rng rng(5);
  for (int64_t i = 0; i < n; ++i) t += static_cast<char>('a' + rng.below(26));
  return t;
}

std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }

// Windows of the context from the first 90% (training, seeded starts) or the last 10%
// (held out, consecutive), every token labelled with the byte after it.
TEST(TextDataTest, WindowsAreLabelledWithTheNextByte) {
  const std::string text = textOf(1000);
  const std::string path = writeFile("corpus.txt", bytesOf(text), false);
  const Dataset train = loadText(path, 8, true, 3);
  const Dataset held = loadText(path, 8, false, 3);
  EXPECT_TRUE(train.tokens);
  EXPECT_EQ(train.sample_shape, Shape{8});
  EXPECT_EQ(train.outputShape(), (Shape{8, 256}));
  EXPECT_EQ(train.size(), (900 - 1) / 8);
  EXPECT_EQ(held.size(), (100 - 1) / 8);
  for (const Dataset* d : {&train, &held}) {
    for (int64_t i = 0; i < d->size(); ++i) {
      const std::string window(d->ids.begin() + i * 8, d->ids.begin() + i * 8 + 8);
      const size_t at = d == &train ? text.find(window) : 900 + static_cast<size_t>(i) * 8;
      ASSERT_EQ(text.substr(at, 8), window) << "sample " << i;
      ASSERT_LT(at + 8, d == &train ? 900u : 1000u) << "a window's label crosses its split";
      for (int64_t j = 0; j < 8; ++j)
        ASSERT_EQ(d->labels[i * 8 + j], static_cast<unsigned char>(text[at + j + 1]));
    }
  }
  // The windows' starts come from the seed; held-out data is the same for every seed.
  EXPECT_EQ(loadText(path, 8, true, 3).ids, train.ids);
  EXPECT_NE(loadText(path, 8, true, 4).ids, train.ids);
  EXPECT_EQ(loadText(path, 8, false, 4).ids, held.ids);
  EXPECT_EQ(loadText(path, 8, true, 3, 5).size(), 5);
  // The batch a model sees: the ids as numbers, unnormalised, and a label per token.
  std::vector<float> x;
  std::vector<int32_t> y;
  gatherBatch(held, {1, 0}, 0, 2, x, y);
  ASSERT_EQ(x.size(), 16u);
  ASSERT_EQ(y.size(), 16u);
  EXPECT_EQ(x[0], static_cast<float>(held.ids[8]));
  EXPECT_EQ(y[8], held.labels[0]);
}

// With a tokenizer: each part (the first 90%, the last 10%, cut at a character's start)
// becomes the tokenizer's ids, windows of them labelled with the next id, in the model's
// vocab; an id outside it is refused, named.
TEST(TextDataTest, ATokenizersIdsMakeTheWindowsAndTheirLabels) {
  // 899 ASCII bytes, then 'é' (2 bytes) across the 90% mark, then ASCII: 1000 bytes.
  const std::string text = textOf(899) + "\xc3\xa9" + textOf(99);
  const std::string path = writeFile("accented.txt", bytesOf(text), false);
  std::vector<std::string> parts;
  TextTokens tokens;
  tokens.vocab = 1000;
  tokens.name = "the test's tokenizer";
  // Two bytes a token (the last alone), ids 300 and up: not bytes.
  tokens.encode = [&](std::string_view part) {
    parts.emplace_back(part);
    std::vector<int32_t> ids;
    for (size_t i = 0; i < part.size(); i += 2)
      ids.push_back(300 + static_cast<unsigned char>(part[i]) % 7 * 10 +
                    (i + 1 < part.size() ? static_cast<unsigned char>(part[i + 1]) % 10 : 0));
    return ids;
  };
  const Dataset train = loadText(path, 8, true, 3, 0, {}, tokens);
  const Dataset held = loadText(path, 8, false, 3, 0, {}, tokens);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], text.substr(0, 899)) << "the cut moves back to the character's start";
  EXPECT_EQ(parts[1], text.substr(899));
  EXPECT_EQ(train.outputShape(), (Shape{8, 1000}));
  const std::vector<int32_t> ids0 = tokens.encode(parts[0]), ids1 = tokens.encode(parts[1]);
  EXPECT_EQ(train.size(), (static_cast<int64_t>(ids0.size()) - 1) / 8);
  EXPECT_EQ(held.size(), (static_cast<int64_t>(ids1.size()) - 1) / 8);
  for (int64_t i = 0; i < held.size(); ++i)
    for (int64_t j = 0; j < 8; ++j) {
      ASSERT_EQ(held.ids[static_cast<size_t>(i * 8 + j)], ids1[static_cast<size_t>(i * 8 + j)]);
      ASSERT_EQ(held.labels[static_cast<size_t>(i * 8 + j)],
                ids1[static_cast<size_t>(i * 8 + j + 1)]);
    }
  // Every training window is a run of the first part's ids, labelled with the next.
  for (int64_t i = 0; i < train.size(); ++i) {
    const auto first = train.ids.begin() + i * 8;
    const auto at = std::search(ids0.begin(), ids0.end(), first, first + 8);
    ASSERT_NE(at, ids0.end()) << "window " << i;
    EXPECT_EQ(train.labels[static_cast<size_t>(i * 8 + 7)], *(at + 8)) << "window " << i;
  }
  std::vector<float> x;
  std::vector<int32_t> y;
  gatherBatch(held, {0}, 0, 1, x, y);
  EXPECT_EQ(x[3], static_cast<float>(ids1[3]));  // an id past a byte's range, as it is
  tokens.vocab = 350;
  expectThrowWith<InvalidArgument>(
      [&] { loadText(path, 8, false, 3, 0, {}, tokens); },
      {"the test's tokenizer gave id", "outside the model's vocab of 350"});
  tokens.vocab = 1000;
  expectThrowWith<FormatError>(
      [&] { loadText(path, 60, false, 3, 0, {}, tokens); },
      {"too little for a context of 60", "51 tokens of the test's tokenizer"});
}

TEST(TextDataTest, WhatIsNotTextIsRefusedWithWhereAndWhy) {
  EXPECT_EQ(firstNonTextByte("plain ascii\n"), -1);
  EXPECT_EQ(firstNonTextByte("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x99\x82"), -1);
  EXPECT_EQ(firstNonTextByte(std::string("ab\0c", 4)), 2);
  EXPECT_EQ(firstNonTextByte("ab\xff"), 2);
  EXPECT_EQ(firstNonTextByte("ab\xc3"), 2);         // cut short
  EXPECT_EQ(firstNonTextByte("\xc0\xaf"), 0);       // overlong
  EXPECT_EQ(firstNonTextByte("x\xed\xa0\x80"), 1);  // a surrogate
  const std::string binary = writeFile("binary.bin", {'a', 'b', 0, 'c'}, false);
  expectThrowWith<FormatError>([&] { loadText(binary, 4, true, 1); },
                               {binary, "is not text", "byte 0 at offset 2"});
  const std::string tiny = writeFile("tiny.txt", bytesOf(textOf(50)), false);
  expectThrowWith<FormatError>([&] { loadText(tiny, 8, true, 1); },
                               {"50 bytes", "context of 8", "at least 9"});
  expectThrowWith<IoError>([&] { loadText(::testing::TempDir() + "/absent", 8, true, 1); },
                           {"not found", "absent"});
  expectThrowWith<InvalidArgument>([&] { loadDataset("text:" + tiny, "", true, 0, 0); },
                                   {"input is [T] token ids"});
  expectThrowWith<InvalidArgument>([&] { loadDataset("text", "", true); },
                                   {"unknown dataset 'text'", "text:PATH"});
}

// A folder: its text files in name order; binary files beside them (an index) are skipped.
TEST(TextDataTest, AFolderReadsItsTextFilesInNameOrder) {
  const std::string dir = testing::freshDir("text");
  const std::string a = textOf(400), b = textOf(700).substr(300);
  std::ofstream(dir + "/b") << b;
  std::ofstream(dir + "/a") << a;
  std::ofstream(dir + "/a.dat", std::ios::binary).write("\0\1\2\3", 4);
  const Dataset held = loadText(dir, 10, false, 1);
  const std::string all = a + b;
  const size_t cut = all.size() - all.size() / 10;
  EXPECT_EQ(std::string(held.ids.begin(), held.ids.begin() + 10), all.substr(cut, 10));
  const std::string empty = testing::freshDir("binaries");
  std::ofstream(empty + "/x.dat", std::ios::binary).write("\0\1", 2);
  expectThrowWith<FormatError>([&] { loadText(empty, 4, true, 1); }, {"holds no text file"});
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// What a refusal says, with the path it names replaced by "P".
std::string refusalOf(const std::function<void()>& f, const std::string& path) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    std::string out;
    size_t from = 0;
    for (size_t at = m.find(path); at != std::string::npos; at = m.find(path, from)) {
      out.append(m, from, at - from).push_back('P');
      from = at + path.size();
    }
    return out.append(m, from, std::string::npos);
  }
  return "(no refusal)";
}

// A node's data rules: only regular files under its roots, of at most the size limit, and
// the same words for every refusal whatever the file is (missing, a device, a secret, too
// large, a link out of the root) — a peer learns nothing of the node's files from them.
TEST(DataAccessTest, ANodeReadsOnlyRegularFilesUnderItsRoots) {
  const std::string root = testing::freshDir("data-root");
  std::ofstream(root + "/corpus.txt") << textOf(400);
  std::ofstream(root + "/big.txt") << textOf(5000);
  std::filesystem::create_symlink("/etc/hostname", root + "/escape");
  DataAccess access;
  access.roots = {root, "/nonexistent-root"};
  access.max_file_bytes = 4096;
  EXPECT_EQ(loadText(root + "/corpus.txt", 8, true, 1, 0, access).size(), 44);
  EXPECT_EQ(loadDataset("text:" + root + "/corpus.txt", "", false, 0, 8, 1, access).size(), 4);
  const std::vector<std::string> refused = {
      "/etc/shadow",    "/proc/self/environ", "/dev/zero",          root + "/../../etc/passwd",
      root + "/escape", root + "/big.txt",    root + "/absent.txt", "/etc"};
  std::string first;
  for (const std::string& path : refused) {
    const std::string m = refusalOf([&] { loadText(path, 8, true, 1, 0, access); }, path);
    // (Appended: GCC 12 at -O3 warns falsely (-Wrestrict) on a literal plus a string.)
    const std::string said =
        std::string(
            "text data 'P' is not readable under this node's data rules (regular "
            "files of at most 4096 bytes under ")
            .append(root)
            .append(", /nonexistent-root; tandemd --data-root, --max-data-bytes)");
    EXPECT_NE(m.find(said), std::string::npos) << path << ": " << m;
    if (first.empty()) first = m;
    EXPECT_EQ(m, first) << path;
  }
  // Fashion-MNIST from a folder outside the roots (a job's `data_dir: /etc`).
  const std::string m =
      refusalOf([&] { loadDataset("fashion-mnist", "/etc", true, 0, 0, 0, access); },
                "/etc/train-images-idx3-ubyte.gz");
  EXPECT_NE(m.find("Fashion-MNIST file 'P' is not readable under this node's data rules"),
            std::string::npos)
      << m;
  // A folder under a root is read file by file, each within the rules; one outside is not.
  const std::string folder = root + "/texts";
  std::filesystem::create_directories(folder);
  std::ofstream(folder + "/a") << textOf(300);
  EXPECT_GT(loadText(folder, 8, true, 1, 0, access).size(), 0);
  expectThrowWith<InvalidArgument>([&] { loadText("/usr/share", 8, true, 1, 0, access); },
                                   {"'/usr/share' is not readable under this node's data rules"});
  std::ofstream(folder + "/b") << textOf(4000);  // the folder now holds over 4096 bytes
  expectThrowWith<InvalidArgument>([&] { loadText(folder, 8, true, 1, 0, access); },
                                   {"holds more than 4096 bytes of text, this node's limit"});
}

// Without roots (this user's own run) the rules still hold, and say what is wrong.
TEST(DataAccessTest, WithoutRootsDevicesAndOversizedFilesAreStillRefused) {
  DataAccess anywhere;
  anywhere.max_file_bytes = 1000;
  expectThrowWith<InvalidArgument>([&] { loadText("/dev/zero", 8, true, 1, 0, anywhere); },
                                   {"text data '/dev/zero' is not a regular file"});
  const std::string big = writeFile("big-text.txt", bytesOf(textOf(2000)), false);
  expectThrowWith<InvalidArgument>([&] { loadText(big, 8, true, 1, 0, anywhere); },
                                   {"holds 2000 bytes, over the limit of 1000"});
  expectThrowWith<IoError>([&] { loadText("/nonexistent.txt", 8, true, 1, 0, anywhere); },
                           {"not found", "/nonexistent.txt"});
  // A gzip file that declares more elements than the limit is refused before it unpacks.
  std::filesystem::create_directories(::testing::TempDir() + "/fm-bomb");
  writeFile("fm-bomb/train-images-idx3-ubyte.gz", idxBytes({100, 28, 28}, {}), true);
  writeFile("fm-bomb/train-labels-idx1-ubyte.gz", idxBytes({100}, {}), true);
  expectThrowWith<FormatError>(
      [&] { loadFashionMnist(::testing::TempDir() + "/fm-bomb", true, 0, anywhere); },
      {"train-images-idx3-ubyte.gz", "more than 1000 elements declared"});
}

}  // namespace
}  // namespace tandem
