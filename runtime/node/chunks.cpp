#include "runtime/node/chunks.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "runtime/control/files.h"

namespace tandem::runtime {

void sendChunks(Channel& c, const std::string& hash, const std::vector<uint8_t>& bytes,
                std::chrono::milliseconds timeout) {
  for (size_t at = 0; at < bytes.size(); at += kChunkBytes) {
    const size_t n = std::min(kChunkBytes, bytes.size() - at);
    c.send(WeightsChunk{hash,
                        static_cast<int64_t>(at),
                        static_cast<int64_t>(bytes.size()),
                        {bytes.begin() + static_cast<std::ptrdiff_t>(at),
                         bytes.begin() + static_cast<std::ptrdiff_t>(at + n)}},
           timeout);
  }
}

ChunkGatherer::ChunkGatherer(std::string what, std::string hash, int64_t total)
    : what_(std::move(what)), hash_(std::move(hash)), total_(total) {
  TANDEM_CHECK_MSG(total_ > 0 && total_ <= kMaxWeightsBytes, FormatError,
                   what_ << ": " << total_ << " bytes is no size for it");
  // A 32-bit node (armhf) cannot hold what its address space cannot: refused up front,
  // not truncated or run out of memory at the last chunk.
  TANDEM_CHECK_MSG(static_cast<uint64_t>(total_) <= std::numeric_limits<size_t>::max() / 2,
                   FormatError,
                   what_ << ": " << total_ << " bytes are more than this 32-bit node can hold");
}

bool ChunkGatherer::add(const WeightsChunk& c) {
  const auto have = static_cast<int64_t>(bytes_.size());
  if (c.hash != hash_ || c.total != total_ || c.offset != have || done())
    throw FormatError(what_ + ": a chunk at " + std::to_string(c.offset) + " of " +
                      std::to_string(c.total) + " bytes (" + c.hash.substr(0, 12) + "...) where " +
                      std::to_string(have) + " of " + std::to_string(total_) + " (" +
                      hash_.substr(0, 12) + "...) were due");
  bytes_.insert(bytes_.end(), c.bytes.begin(), c.bytes.end());
  if (!done()) return false;
  if (contentHash(bytes_) != hash_)
    throw FormatError(what_ + ": the " + std::to_string(total_) +
                      " bytes received do not hash to " + hash_);
  return true;
}

}  // namespace tandem::runtime
