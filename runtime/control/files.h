// Files written whole and named by their content, with libsodium: the content hash that
// weights go by in the cache and the protocol, and the atomic, link-safe write that the
// cache, keys, checkpoints, saved models and profiles use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

namespace tandem::runtime {

// The content hash the cache and the protocol name weights by: 64 hex digits.
std::string contentHash(std::span<const uint8_t> bytes);
// True for 64 lowercase hex digits. Inline: the control messages' decoder checks the
// hashes it receives with it without linking the file writer.
inline bool isContentHash(const std::string& text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// Who may read a file written: as `mode` less the umask, or the owner alone whatever the
// umask (a secret: the mode is set to 0600 and checked).
enum class FileReaders { kMode, kOwnerOnly };

// Writes `path` so that it is either absent, as it was, or whole: a temporary file beside
// it, fsync, rename. The temporary file has a name no other process can guess and is made
// by this call (O_EXCL), never through a symbolic link (O_NOFOLLOW): a folder others may
// write to cannot make it write elsewhere. IoError naming the path. `mode` as open(2)
// takes it: the cache's files are the owner's alone; a user's files (a save, a
// checkpoint) 0666.
void writeFileAtomically(const std::string& path, std::span<const uint8_t> bytes,
                         unsigned mode = 0600, FileReaders readers = FileReaders::kMode);

}  // namespace tandem::runtime
