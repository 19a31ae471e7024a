#include "core/data/data_access.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace tandem {
namespace fs = std::filesystem;

namespace {

std::string rules(const DataAccess& access) {
  std::string roots;
  for (const std::string& r : access.roots) roots += (roots.empty() ? "" : ", ") + r;
  return "regular files of at most " + std::to_string(access.max_file_bytes) + " bytes under " +
         roots + "; tandemd --data-root, --max-data-bytes";
}

[[noreturn]] void refuse(const DataAccess& access, const std::string& path, std::string_view what) {
  throw InvalidArgument(std::string(what) + " '" + path +
                        "' is not readable under this node's data rules (" + rules(access) + ")");
}

bool underRoot(const DataAccess& access, const fs::path& real) {
  for (const std::string& r : access.roots) {
    std::error_code ec;
    const fs::path root = fs::canonical(r, ec);
    if (ec) continue;
    const std::string a = root.string(), b = real.string();
    if (a == "/" || b == a ||
        (b.size() > a.size() && b.compare(0, a.size(), a) == 0 && b[a.size()] == '/'))
      return true;
  }
  return false;
}

}  // namespace

std::string checkDataFile(const DataAccess& access, const std::string& path,
                          std::string_view what) {
  std::error_code ec;
  const fs::path real = fs::canonical(path, ec);
  struct stat st {};
  const bool found = !ec && ::stat(real.c_str(), &st) == 0;
  const bool regular = found && S_ISREG(st.st_mode);
  const bool fits = regular && st.st_size <= access.max_file_bytes;
  if (!access.roots.empty()) {
    if (!fits || !underRoot(access, real)) refuse(access, path, what);
    return real.string();
  }
  if (!found) throw IoError(std::string(what) + " not found: '" + path + "'");
  TANDEM_CHECK_MSG(regular, InvalidArgument, what << " '" << path << "' is not a regular file");
  TANDEM_CHECK_MSG(fits, InvalidArgument,
                   what << " '" << path << "' holds " << st.st_size << " bytes, over the limit of "
                        << access.max_file_bytes);
  return real.string();
}

std::string checkDataFolder(const DataAccess& access, const std::string& path,
                            std::string_view what) {
  std::error_code ec;
  const fs::path real = fs::canonical(path, ec);
  if (!access.roots.empty() && (ec || !fs::is_directory(real, ec) || !underRoot(access, real)))
    refuse(access, path, what);
  if (ec) throw IoError(std::string(what) + " not found: '" + path + "'");
  return real.string();
}

std::string readDataFile(const DataAccess& access, const std::string& checked,
                         std::string_view what) {
  std::ifstream in(checked, std::ios::binary);
  if (!in) throw IoError(std::string("cannot open ").append(what).append(" '") + checked + "'");
  std::string bytes;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    bytes.append(buf, static_cast<size_t>(in.gcount()));
    TANDEM_CHECK_MSG(static_cast<int64_t>(bytes.size()) <= access.max_file_bytes, InvalidArgument,
                     what << " '" << checked << "' grew past the limit of " << access.max_file_bytes
                          << " bytes while it was read");
  }
  return bytes;
}

}  // namespace tandem
