// Reading a whole file, with the one error every reader gives when it cannot.
#pragma once

#include <string>
#include <string_view>

namespace tandem {

// The file's bytes; IoError "cannot open <what> '<path>'" when it cannot be read.
std::string readFile(const std::string& path, std::string_view what);

}  // namespace tandem
