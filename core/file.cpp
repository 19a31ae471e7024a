#include "core/file.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

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
  const std::string tmp = path + ".tmp";
  const std::string named = std::string(what) + " '" + tmp + "'";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw IoError("cannot write " + named);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) throw IoError("writing " + named + " failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw IoError("cannot rename '" + tmp + "' to '" + path + "'");
  }
}

}  // namespace tandem
