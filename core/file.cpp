#include "core/file.h"

#include <unistd.h>

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

}  // namespace tandem
