// WeightCache: a node's content-addressed store of model files (weights a run starts
// from), so a second run of the same model ships no weight bytes. A file is named by the
// BLAKE2b-256 of its bytes, written atomically (a temporary file, fsync, rename), checked
// against its name on every read (a corrupted file is removed and reported as absent),
// and the oldest files are removed when the cache passes its size cap.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/control/files.h"

namespace tandem::runtime {

class WeightCache {
 public:
  // `dir` is made if missing (IoError naming it if it cannot be).
  WeightCache(std::string dir, uint64_t max_bytes);

  // The bytes stored under `hash`, verified; nullopt if absent, or if the file no longer
  // matches its hash (it is removed, and `corrupted` says so).
  std::optional<std::vector<uint8_t>> get(const std::string& hash, bool* corrupted = nullptr);
  // Stores `bytes`, which must hash to `hash` (FormatError otherwise); then removes the
  // oldest files while the cache holds more than its cap (never the one just stored).
  void put(const std::string& hash, std::span<const uint8_t> bytes);
  // Every hash stored, for the node's report.
  std::vector<std::string> hashes() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  uint64_t max_bytes_;
};

// The default folder: $XDG_CACHE_HOME/tandem/weights, else ~/.cache/tandem/weights.
std::string defaultWeightCacheDir();

// An exclusive lock on a folder (flock), held while it lives: the workers of one node
// take turns at its weight cache, so the first fetches and stores and the others find
// the weights there — one fetch per node, however many of its workers start from them.
class FolderLock {
 public:
  explicit FolderLock(const std::string& dir);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_;
};

}  // namespace tandem::runtime
