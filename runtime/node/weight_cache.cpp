#include "runtime/node/weight_cache.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace tandem::runtime {

namespace fs = std::filesystem;

std::string defaultWeightCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/tandem/weights";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/tandem/weights";
  return "/tmp/tandem-weights";
}

WeightCache::WeightCache(std::string dir, uint64_t max_bytes)
    : dir_(std::move(dir)), max_bytes_(max_bytes) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    throw IoError("cannot make the weight cache '" + dir_ + "': " + ec.message());
  // Another user's folder (a /tmp fallback made first by someone else) could swap the
  // files under us: refused. Our own loses group and other write access.
  struct stat st {};
  if (::stat(dir_.c_str(), &st) != 0)
    throw IoError("cannot read the weight cache '" + dir_ + "': " + std::strerror(errno));
  if (st.st_uid != ::geteuid())
    throw IoError("the weight cache '" + dir_ + "' belongs to another user (uid " +
                  std::to_string(st.st_uid) +
                  "): give the daemon a folder of its own (--cache-dir)");
  if ((st.st_mode & 022) != 0 && ::chmod(dir_.c_str(), st.st_mode & 07755) != 0)
    throw IoError("cannot make the weight cache '" + dir_ +
                  "' its owner's to write: " + std::strerror(errno));
}

std::optional<std::vector<uint8_t>> WeightCache::get(const std::string& hash, bool* corrupted) {
  if (corrupted) *corrupted = false;
  if (!isContentHash(hash)) return std::nullopt;
  const std::string path = dir_ + "/" + hash;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  if (contentHash(bytes) != hash) {
    std::error_code ignored;
    fs::remove(path, ignored);
    if (corrupted) *corrupted = true;
    return std::nullopt;
  }
  std::error_code ignored;
  fs::last_write_time(path, fs::file_time_type::clock::now(), ignored);  // recently used
  return bytes;
}

void WeightCache::put(const std::string& hash, std::span<const uint8_t> bytes) {
  if (!isContentHash(hash) || contentHash(bytes) != hash)
    throw FormatError("weights of " + std::to_string(bytes.size()) + " bytes do not hash to '" +
                      hash + "'");
  writeFileAtomically(dir_ + "/" + hash, bytes);
  // Over the cap: the least recently used go first, the file just written last (if it
  // alone is over the cap it goes too: the caller holds its bytes).
  std::vector<std::pair<fs::file_time_type, fs::path>> files;
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (!e.is_regular_file() || !isContentHash(e.path().filename().string())) continue;
    total += e.file_size();
    files.push_back({e.last_write_time(), e.path()});
  }
  std::sort(files.begin(), files.end());
  for (const auto& [time, file] : files) {
    if (total <= max_bytes_) break;
    std::error_code size_ec;
    const uint64_t size = fs::file_size(file, size_ec);
    if (fs::remove(file, size_ec)) total -= size;
  }
}

std::vector<std::string> WeightCache::hashes() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (e.is_regular_file() && isContentHash(e.path().filename().string()))
      out.push_back(e.path().filename().string());
  return out;
}

FolderLock::FolderLock(const std::string& dir)
    : fd_(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
  if (fd_ >= 0)
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace tandem::runtime
