#include "runtime/node/weight_cache.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "runtime/node/chunks.h"
#include "tests/test_util.h"

namespace tandem::runtime {
namespace {

std::vector<uint8_t> bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + i * 7);
  return b;
}

// A whole gathered from chunks: verified by its hash, refused when a chunk is out of order
// or of another whole, and refused up front when it is more than this node can address
// (3 GiB on a 32-bit node: armhf under qemu runs this; a 64-bit node takes it).
TEST(ChunkGathererTest, GathersInOrderAndRefusesWhatThisNodeCannotHold) {
  const auto b = bytes(2500, 3);
  const std::string h = contentHash(b);
  ChunkGatherer g("weights", h, 2500);
  EXPECT_FALSE(g.add({h, 0, 2500, std::vector<uint8_t>(b.begin(), b.begin() + 1000)}));
  EXPECT_THROW(g.add({h, 0, 2500, std::vector<uint8_t>(b.begin(), b.begin() + 1000)}),
               FormatError);  // the same offset again
  EXPECT_TRUE(g.add({h, 1000, 2500, std::vector<uint8_t>(b.begin() + 1000, b.end())}));
  EXPECT_EQ(g.take(), b);
  ChunkGatherer bad("weights", h, 2500);
  EXPECT_THROW(bad.add({h, 0, 2500, bytes(2500, 4)}), FormatError);  // does not hash as named
  const int64_t big = int64_t{3} << 30;
  if (sizeof(size_t) == 4)
    testing::expectThrowWith<FormatError>([&] { ChunkGatherer("weights", h, big); },
                                          {"3221225472 bytes", "32-bit node"});
  else
    EXPECT_EQ(ChunkGatherer("weights", h, big).total(), big);
  EXPECT_THROW(ChunkGatherer("weights", h, 0), FormatError);
}

TEST(WeightCacheTest, StoredWeightsComeBackVerifiedByTheirHash) {
  const std::string dir = testing::freshDir("wcache") + "/nested";
  WeightCache cache(dir, 1 << 20);
  const auto b = bytes(1000, 1);
  const std::string h = contentHash(b);
  EXPECT_TRUE(isContentHash(h));
  EXPECT_NE(contentHash(bytes(1000, 2)), h);
  EXPECT_FALSE(cache.get(h).has_value());
  cache.put(h, b);
  EXPECT_EQ(cache.get(h), b);
  EXPECT_EQ(cache.hashes(), std::vector<std::string>{h});
  // Nothing half-written is left beside it.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  testing::expectThrowWith<FormatError>([&] { cache.put(h, bytes(1000, 2)); }, {"do not hash to"});
  EXPECT_FALSE(cache.get("../etc/passwd").has_value());  // not a hash: never a path
}

TEST(WeightCacheTest, ACorruptedFileIsDetectedAndRemoved) {
  const std::string dir = testing::freshDir("wcache");
  WeightCache cache(dir, 1 << 20);
  const auto b = bytes(5000, 3);
  const std::string h = contentHash(b);
  cache.put(h, b);
  {
    std::fstream f(dir + "/" + h, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x55');
  }
  bool corrupted = false;
  EXPECT_FALSE(cache.get(h, &corrupted).has_value());
  EXPECT_TRUE(corrupted);
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + h));
  cache.put(h, b);
  EXPECT_EQ(cache.get(h, &corrupted), b);
  EXPECT_FALSE(corrupted);
}

TEST(WeightCacheTest, TheOldestGoWhenTheCapIsPassed) {
  const std::string dir = testing::freshDir("wcache");
  WeightCache cache(dir, 2500);
  std::vector<std::string> hashes;
  for (uint8_t i = 0; i < 3; ++i) {
    const auto b = bytes(1000, i);
    hashes.push_back(contentHash(b));
    cache.put(hashes.back(), b);
    std::filesystem::last_write_time(
        dir + "/" + hashes.back(),
        std::filesystem::file_time_type::clock::now() - std::chrono::hours(3 - i));
  }
  cache.put(contentHash(bytes(1000, 9)), bytes(1000, 9));  // 4000 > 2500: two oldest go
  EXPECT_FALSE(cache.get(hashes[0]).has_value());
  EXPECT_FALSE(cache.get(hashes[1]).has_value());
  EXPECT_TRUE(cache.get(hashes[2]).has_value());
  EXPECT_TRUE(cache.get(contentHash(bytes(1000, 9))).has_value());
  // A file larger than the cap is not kept either: the cache never stays over it.
  const auto huge = bytes(3000, 5);
  cache.put(contentHash(huge), huge);
  EXPECT_FALSE(cache.get(contentHash(huge)).has_value());
  uint64_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) total += e.file_size();
  EXPECT_LE(total, 2500u);
}

// Writing leaves no file but the one named (a random temporary name, made exclusively, never
// through a link); a secret is the owner's alone whatever the umask; a link planted where a
// temporary name might go is not followed.
TEST(WeightCacheTest, FilesAreWrittenWholeWithoutFollowingLinks) {
  const std::string dir = testing::freshDir("atomic");
  std::ofstream(dir + "/victim") << "unchanged";
  for (int pid : {0, ::getpid()})  // the old predictable names
    std::filesystem::create_symlink(dir + "/victim", dir + "/key.tmp-" + std::to_string(pid));
  const mode_t before = ::umask(0);
  const std::string text = "secret\n";
  writeFileAtomically(dir + "/key", {reinterpret_cast<const uint8_t*>(text.data()), text.size()},
                      0644, FileReaders::kOwnerOnly);
  writeFileAtomically(dir + "/shared", {reinterpret_cast<const uint8_t*>(text.data()), 3}, 0644);
  ::umask(before);
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((dir + "/shared").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  std::stringstream victim;
  victim << std::ifstream(dir + "/victim").rdbuf();
  EXPECT_EQ(victim.str(), "unchanged");
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 5);  // victim, two links, key, shared: no temporary left
  // Writing over a link replaces the link, not what it points to.
  std::filesystem::create_symlink(dir + "/victim", dir + "/through");
  writeFileAtomically(dir + "/through", {reinterpret_cast<const uint8_t*>(text.data()), 3});
  EXPECT_FALSE(std::filesystem::is_symlink(dir + "/through"));
  victim.str("");
  victim << std::ifstream(dir + "/victim").rdbuf();
  EXPECT_EQ(victim.str(), "unchanged");
}

// A cache folder others may write to loses that right; one of another user is refused.
TEST(WeightCacheTest, TheCacheFolderIsItsOwnersAlone) {
  const std::string dir = testing::freshDir("wcache-mode");
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  WeightCache cache(dir, 1000);
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
  if (::geteuid() != 0) GTEST_SKIP() << "changing a folder's owner needs root";
  const std::string theirs = testing::freshDir("wcache-theirs");
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  testing::expectThrowWith<IoError>([&] { WeightCache(theirs, 1000); },
                                    {theirs, "belongs to another user (uid 65534)"});
}

}  // namespace
}  // namespace tandem::runtime
