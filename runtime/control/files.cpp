#include "runtime/control/files.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace tandem::runtime {

namespace fs = std::filesystem;

std::string contentHash(std::span<const uint8_t> bytes) {
  if (sodium_init() < 0) throw Error("libsodium failed to initialise");
  std::array<uint8_t, 32> h{};
  crypto_generichash(h.data(), h.size(), bytes.data(), bytes.size(), nullptr, 0);
  std::string hex(65, '\0');
  sodium_bin2hex(hex.data(), hex.size(), h.data(), h.size());
  hex.pop_back();
  return hex;
}

namespace {

// Opens a new file beside `path` under a random name (`tmp`): made by this call, not
// through a link; -1 with errno if it cannot be.
int openTemporary(const std::string& path, unsigned mode, std::string& tmp) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, ".tmp-%08x%08x", randombytes_random(),
                  randombytes_random());
    tmp = path + suffix;
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

}  // namespace

void writeFileAtomically(const std::string& path, std::span<const uint8_t> bytes, unsigned mode,
                         FileReaders readers) {
  if (sodium_init() < 0) throw Error("libsodium could not be initialised");
  std::string tmp;
  const int fd = openTemporary(path, mode, tmp);
  if (fd < 0) throw IoError("cannot write '" + tmp + "': " + std::strerror(errno));
  size_t done = 0;
  // A secret is the owner's whatever the umask and mode said.
  bool ok = readers == FileReaders::kMode || ::fchmod(fd, 0600) == 0;
  while (ok && done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw IoError("cannot write '" + path + "': " + std::strerror(ok ? errno : err));
  }
}

}  // namespace tandem::runtime
