// What the tests of tandemd as a process share: daemons on free loopback ports, commands
// run in the background, and the processes a run leaves.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/process_util.h"

namespace tandem::testing::daemons {

using namespace std::chrono_literals;

using Ran = tandem::testing::CommandRun;

inline Ran run(const std::string& cmd) { return tandem::testing::runCommand(cmd); }

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Child `pid`'s exit code once it ends within `limit` (`reaped` set), -1 if it does not
// or was killed by a signal.
inline int reapWithin(pid_t pid, std::chrono::milliseconds limit, bool& reaped) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      reaped = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(10ms);
  }
  return -1;
}

// A tandemd child process on a free loopback port, its log in a file; stopped (SIGKILL
// if still running) when destroyed.
class DaemonProcess {
 public:
  DaemonProcess(const std::string& dir, const std::string& key, const std::string& name,
                const std::string& listen = "127.0.0.1:0")
      : log_(dir + "/" + name + ".log") {
    int out[2];
    EXPECT_EQ(pipe(out), 0);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      const int err = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(err, STDERR_FILENO);
      const std::string cache = dir + "/" + name + "-cache";
      execl(TANDEMD, TANDEMD, "--listen", listen.c_str(), "--key", key.c_str(), "--name",
            name.c_str(), "--cache-dir", cache.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    // Its first stdout line: "listening HOST:PORT".
    std::string line;
    char c;
    while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
    close(out[0]);
    const auto colon = line.rfind(':');
    if (line.rfind("listening ", 0) == 0 && colon != std::string::npos) address_ = line.substr(10);
    EXPECT_FALSE(address_.empty()) << "tandemd said '" << line << "'; its log:\n" << slurp(log_);
  }
  ~DaemonProcess() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  std::string log() const { return slurp(log_); }
  void kill9() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }
  // SIGTERM, then its exit code (-1 if it had to be killed after 10 s).
  int terminate() {
    kill(pid_, SIGTERM);
    return reapWithin(pid_, std::chrono::seconds(10), reaped_);
  }

 private:
  std::string log_, address_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// A command running in the background, its output (stdout and stderr) in a file.
class Background {
 public:
  Background(const std::string& cmd, const std::string& log) : log_(log) {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~Background() {
    if (!reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  std::string output() const { return slurp(log_); }
  void signal(int s) const { kill(pid_, s); }
  // Whether its output holds `text` `times` times within `limit`.
  bool waitFor(const std::string& text, std::chrono::seconds limit, size_t times = 1) const {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      const std::string out = output();
      size_t n = 0;
      for (size_t at = out.find(text); at != std::string::npos && n < times;
           at = out.find(text, at + 1))
        ++n;
      if (n >= times) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
  // Its exit code, -1 if it did not end within `limit` or was killed.
  int wait(std::chrono::seconds limit) { return reapWithin(pid_, limit, reaped_); }

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// The pids `tandem run` printed for its stages ("stage 1: layers [3, 6) on cpu (1
// threads), pid 42").
inline std::vector<pid_t> stagePids(const std::string& out) {
  std::vector<pid_t> pids;
  for (size_t at = out.find(" threads), pid "); at != std::string::npos;
       at = out.find(" threads), pid ", at + 1))
    pids.push_back(static_cast<pid_t>(std::stol(out.substr(at + 15))));
  return pids;
}

inline const std::string kCli = TANDEM_CLI;

// Two daemons (two nodes on loopback) and a cluster file naming them.
struct TwoNodes {
  explicit TwoNodes(const std::string& dir)
      : key(dir + "/c.key"),
        made(run(kCli + " keygen --cluster --out " + dir + "/c").code == 0),
        a(dir, key, "a"),
        b(dir, key, "b"),
        cluster(dir + "/two.yaml") {
    std::ofstream(cluster) << "key: c.key\nnodes:\n"
                           << "  - {name: a, address: '" << a.address()
                           << "', devices: [{backend: cpu}]}\n"
                           << "  - {name: b, address: '" << b.address()
                           << "', devices: [{backend: cpu}]}\n";
  }
  std::string key;
  bool made;
  DaemonProcess a, b;
  std::string cluster;
};

inline std::string writeJob(const std::string& dir, const std::string& name,
                            const std::string& body) {
  const std::string path = dir + "/" + name + ".yaml";
  std::ofstream(path) << "model: " << TANDEM_SOURCE_DIR << "/examples/models/mlp.yaml\n"
                      << "batch: 32\nmicrobatches: 4\npartition: equal\nstages: 2\nseed: 3\n"
                      << body;
  return path;
}

// The pids of the processes whose command line holds `marker` (zombies left out).
inline std::vector<pid_t> processesWith(const std::string& marker) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = slurp("/proc/" + name + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    const auto pid = static_cast<pid_t>(std::stol(name));
    if (cmd.find(marker) != std::string::npos && !tandem::testing::processGone(pid))
      out.push_back(pid);
  }
  return out;
}

// SIGKILLs the one process whose command line holds `marker` (a node's tandemd); false
// when there is not exactly one.
inline bool killTheOneProcessWith(const std::string& marker) {
  const std::vector<pid_t> pids = processesWith(marker);
  return pids.size() == 1 && kill(pids[0], SIGKILL) == 0;
}

}  // namespace tandem::testing::daemons
