#include "runtime/daemon/local_daemon.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/worker/child_process.h"

namespace tandem::runtime {

namespace {

using Clock = std::chrono::steady_clock;

void stop(pid_t pid) {
  kill(pid, SIGTERM);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

LocalDaemon::LocalDaemon(const std::string& program, const ClusterKey& key,
                         const std::string& name) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) throw Error("cannot start tandemd: pipe failed");
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    throw Error("cannot start tandemd: pipe failed");
  }
  // A local run's daemon is this user's own: its workers read the job's data wherever
  // this user can (regular files within the size limit still).
  std::vector<std::string> argv = {program,  "--listen", "127.0.0.1:0", "--key", "-",
                                   "--name", name,       "--log-level", "warn",  "--data-root",
                                   "/"};
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) {
    for (int fd : {in[0], in[1], out[0], out[1]}) close(fd);
    throw Error("cannot start tandemd: fork failed");
  }
  if (pid_ == 0) {
    // It dies with the run, and holds only its two pipes (and stderr).
    if (!prepareChild(parent, {{in[0], STDIN_FILENO}, {out[1], STDOUT_FILENO}})) _exit(126);
    execv(program.c_str(), cargv.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  const std::string hex = clusterKeyHex(key) + "\n";
  const bool written = write(in[1], hex.data(), hex.size()) == static_cast<ssize_t>(hex.size());
  close(in[1]);
  // Its first line on stdout: "listening HOST:PORT" (10 s: it lists this machine's
  // devices first).
  std::string line;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  char c = 0;
  while (written && Clock::now() < deadline) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    if (read(out[0], &c, 1) != 1 || c == '\n') break;
    line += c;
  }
  close(out[0]);
  if (line.rfind("listening ", 0) != 0) {
    stop(pid_);
    throw Error("the local node daemon " + program + " did not start (it said '" + line + "')");
  }
  endpoint_ = parseEndpoint(line.substr(10));
}

LocalDaemon::~LocalDaemon() {
  if (pid_ > 0) stop(pid_);
}

}  // namespace tandem::runtime
