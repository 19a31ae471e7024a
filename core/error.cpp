#include "core/error.h"

namespace tandem::detail {

std::string checkMessage(const char* expr, const char* file, int line) {
  std::ostringstream os;
  os << expr << " at " << file << ":" << line;
  return os.str();
}

}  // namespace tandem::detail
