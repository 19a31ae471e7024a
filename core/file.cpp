#include "core/file.h"

#include <fstream>
#include <iterator>

#include "core/error.h"

namespace tandem {

std::string readFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(std::string("cannot open ").append(what).append(" '") + path + "'");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace tandem
