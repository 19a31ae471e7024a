// Reading a whole file, with the one error every reader gives when it cannot.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace tandem {

// The file's bytes; IoError "cannot open <what> '<path>'" when it cannot be read.
std::string readFile(const std::string& path, std::string_view what);

// Refuses, before any work is done for it, an output path that cannot be written: its
// directory missing, not a directory or not writable, or the path itself a directory.
// IoError "cannot write <what> '<path>': <why>".
void checkWritable(const std::string& path, std::string_view what);

// Writes `bytes` to `path` atomically: a temporary file beside it renamed over it, so a
// crash never leaves half a file. IoError "cannot write <what> '<path>...'" naming the step
// that failed.
void writeFileAtomically(const std::string& path, std::span<const uint8_t> bytes,
                         std::string_view what);

}  // namespace tandem
