#include "core/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/error.h"

namespace tandem {

std::string readFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(std::string("cannot open ").append(what).append(" '") + path + "'");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void checkWritable(const std::string& path, std::string_view what) {
  namespace fs = std::filesystem;
  auto fail = [&](const std::string& why) {
    throw IoError(std::string("cannot write ").append(what).append(" '") + path + "': " + why);
  };
  std::error_code ec;
  if (path.empty()) fail("no path");
  if (fs::is_directory(path, ec)) fail("it is a directory");
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::exists(dir, ec)) fail("directory '" + dir.string() + "' does not exist");
  if (!fs::is_directory(dir, ec)) fail("'" + dir.string() + "' is not a directory");
  if (::access(dir.c_str(), W_OK) != 0) fail("directory '" + dir.string() + "' is not writable");
}

void writeFileAtomically(const std::string& path, std::span<const uint8_t> bytes,
                         std::string_view what) {
  AtomicFileWriter out(path, what);
  out.write(bytes);
  out.commit();
}

AtomicFileWriter::AtomicFileWriter(const std::string& path, std::string_view what)
    : path_(path), tmp_(path + ".tmp"), what_(what) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) fail("");
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFileWriter::fail(const std::string& step) const {
  const std::string why = std::strerror(errno);
  throw IoError("cannot write " + what_ + " '" + tmp_ + "'" +
                (step.empty() ? "" : " (" + step + ")") + ": " + why);
}

void AtomicFileWriter::write(std::span<const uint8_t> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing");
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
}

void AtomicFileWriter::copy(const FileExtent& from, const std::string& source, bool kernel_copy) {
  auto off = static_cast<off_t>(from.offset);
  uint64_t left = from.bytes;
  const auto shortOf = [&] {
    return IoError(source + " ends " + std::to_string(left) + " bytes before the " +
                   std::to_string(from.bytes) + " bytes at offset " + std::to_string(from.offset) +
                   " it was to give");
  };
  // copy_file_range refuses (EXDEV, EINVAL, ENOSYS, EOPNOTSUPP) before it copies anything
  // where it cannot; then the bytes are read and written.
  while (kernel_copy && left > 0) {
    const ssize_t n = ::copy_file_range(from.fd, &off, fd_, nullptr, left, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && left == from.bytes &&
        (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP))
      break;
    if (n < 0) fail("copying from " + source);
    if (n == 0) throw shortOf();
    left -= static_cast<uint64_t>(n);
  }
  std::vector<uint8_t> piece(left > 0 ? std::min<uint64_t>(left, uint64_t{1} << 20) : 0);
  while (left > 0) {
    const ssize_t n = ::pread(from.fd, piece.data(), std::min<uint64_t>(left, piece.size()), off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError("cannot read " + source + ": " + std::strerror(errno));
    if (n == 0) throw shortOf();
    write({piece.data(), static_cast<size_t>(n)});
    off += n;
    left -= static_cast<uint64_t>(n);
  }
}

void AtomicFileWriter::commit() {
  if (::close(fd_) != 0) {
    fd_ = -1;
    ::unlink(tmp_.c_str());
    fail("closing");
  }
  fd_ = -1;
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp_.c_str());
    throw IoError("cannot rename '" + tmp_ + "' to '" + path_ + "': " + why);
  }
}

}  // namespace tandem
