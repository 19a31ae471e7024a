// Bytes too large for one control message — starting weights from the coordinator to a
// worker, a trained slice from a worker back — travel as `weights chunk` messages, in
// order, named by the content hash (weight_cache.h) of the whole they make.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/control/channel.h"
#include "runtime/control/messages.h"

namespace tandem::runtime {

// How much one chunk carries (the channel's frames are capped at 16 MiB by default).
inline constexpr size_t kChunkBytes = size_t{1} << 20;

// Sends `bytes`, whose content hash is `hash`, over `c` as chunks of kChunkBytes.
void sendChunks(Channel& c, const std::string& hash, const std::vector<uint8_t>& bytes,
                std::chrono::milliseconds timeout);

// Gathers the chunks of one whole, in order. FormatError naming `what` for a chunk of
// another hash or total, out of order, or a whole that does not hash as named.
class ChunkGatherer {
 public:
  ChunkGatherer(std::string what, std::string hash, int64_t total);
  // Adds the next chunk; true once the whole is in and verified.
  bool add(const WeightsChunk& c);
  bool done() const { return static_cast<int64_t>(bytes_.size()) == total_; }
  const std::string& hash() const { return hash_; }
  int64_t total() const { return total_; }
  // The whole (once done()).
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  std::string what_, hash_;
  int64_t total_;
  std::vector<uint8_t> bytes_;
};

}  // namespace tandem::runtime
