// Reading a whole file, with the one error every reader gives when it cannot; writing one
// atomically, from memory or copied from other files.
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

// A run of `bytes` bytes at `offset` of an open file (the descriptor stays its owner's).
struct FileExtent {
  int fd = -1;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// A file written atomically piece by piece: appended to a temporary file beside `path`
// (`path`.tmp), which commit() renames over `path`; a writer destroyed uncommitted (an
// error on the way) removes it. Errors are IoError "cannot write <what> '<path>.tmp'...".
class AtomicFileWriter {
 public:
  AtomicFileWriter(const std::string& path, std::string_view what);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(std::span<const uint8_t> bytes);
  // Appends the extent's bytes, copied file to file by the kernel (copy_file_range: the
  // bytes never pass through this process) or, where the kernel cannot (another file
  // system on an old kernel, a file system without it) or `kernel_copy` is false, read
  // and written in pieces. IoError naming `source` (what the extent's file is to the
  // caller: "'<path>'") when the extent is not all there or cannot be read.
  void copy(const FileExtent& from, const std::string& source, bool kernel_copy = true);
  void commit();

 private:
  [[noreturn]] void fail(const std::string& step) const;

  std::string path_, tmp_, what_;
  int fd_ = -1;
};

}  // namespace tandem
