// What the CLI tests share: the tandem program run with arguments, and the example models.
#pragma once

#include <string>

#include "tests/process_util.h"

namespace tandem::testing::cli {

using CliRun = CommandRun;

// `tandem ARGS`: its exit code and its output (stdout and stderr).
inline CliRun run(const std::string& args) {
  return runCommand(std::string(TANDEM_CLI) + " " + args);
}

inline const std::string kModels = std::string(TANDEM_SOURCE_DIR) + "/examples/models/";

}  // namespace tandem::testing::cli
