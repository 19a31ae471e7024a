// What the tests that start programs share: a shell command's exit code and output, and
// whether a process has finished.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

namespace tandem::testing {

struct CommandRun {
  int code;         // the exit code; -1 if it was killed or could not start
  std::string out;  // stdout and stderr together
};

// Runs `command` in a shell and waits for it.
inline CommandRun runCommand(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// In the output of `tandem generate --serve` (a JSON line per prompt, keys in order):
// the text answering `prompt` as `"prompt":"P","text":"..."`, or "" if there is none.
inline std::string servedText(const std::string& out, const std::string& prompt) {
  const std::string key = "\"prompt\":\"" + prompt + "\",\"text\":";
  const auto at = out.find(key);
  if (at == std::string::npos) return "";
  const auto end = out.find(",\"tokens_per_s\"", at);
  return end == std::string::npos ? "" : out.substr(at, end - at);
}

// True once process `pid` has finished: gone, or a zombie its parent has not reaped.
inline bool processGone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const auto close_paren = line.rfind(')');
  return close_paren != std::string::npos && line.size() > close_paren + 2 &&
         line[close_paren + 2] == 'Z';
}

}  // namespace tandem::testing
