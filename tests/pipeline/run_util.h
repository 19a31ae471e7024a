// What the `tandem run` tests share (run_test.cpp, run_parallel_test.cpp): a running
// `tandem run` process, a job file of the MLP, and single-device gradient accumulation,
// the weights every pipeline must give.
#pragma once

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "core/data/dataset.h"
#include "core/model_spec.h"
#include "core/train/trainer.h"

extern char** environ;

namespace tandem::testing {

inline const std::string kMlp = std::string(TANDEM_SOURCE_DIR) + "/examples/models/mlp.yaml";

// A running `tandem run`, its stdout and stderr read through one pipe.
class RunProcess {
 public:
  explicit RunProcess(const std::string& job, std::vector<std::string> extra = {},
                      const char* command = "run") {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    std::vector<const char*> argv = {TANDEM_CLI, command, job.c_str()};
    for (const std::string& e : extra) argv.push_back(e.c_str());
    argv.push_back(nullptr);
    EXPECT_EQ(
        posix_spawn(&pid_, TANDEM_CLI, &actions, nullptr, const_cast<char**>(argv.data()), environ),
        0);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    out_fd_ = fds[0];
  }
  ~RunProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(out_fd_);
  }

  // Reads output until a whole line contains `marker` or `limit` passes; the rest of
  // that line after the marker, or nullopt. (No std::regex: GCC 12 warns inside it
  // under the sanitizer build.)
  std::optional<std::string> waitForLine(const std::string& marker, std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      const size_t at = text_.find(marker);
      if (at != std::string::npos) {
        const size_t end = text_.find('\n', at);
        if (end != std::string::npos)
          return text_.substr(at + marker.size(), end - at - marker.size());
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      readSome(100);
    }
  }

  // Waits for the exit (bounded) and returns the exit code, -1 on a signal or timeout.
  int wait(std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      readSome(50);
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        while (readSome(0)) {
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
    }
    return -1;
  }

  const std::string& output() const { return text_; }

 private:
  bool readSome(int timeout_ms) {
    pollfd p{out_fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    const ssize_t n = read(out_fd_, buf, sizeof buf);
    if (n <= 0) return false;
    text_.append(buf, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  bool exited_ = false;
  std::string text_;
};

inline std::string writeJob(const std::string& name, const std::string& body) {
  const std::string path = ::testing::TempDir() + "/" + name + ".yaml";
  std::ofstream(path) << "model: " << kMlp << "\n" << body;
  return path;
}

// Single-device gradient accumulation over m microbatches, one epoch from seed 3: the
// weights (by name) and optimizer steps every pipeline must give.
struct Reference {
  std::map<std::string, std::vector<float>> weights;
  int64_t steps = 0;
};
inline Reference singleDevice(const Dataset& train, int64_t batch, int64_t m,
                              const OptimizerOptions& options = {},
                              const std::string& model = kMlp) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model ref(loadModelSpec(model));
  ref.build(be, 3);
  Optimizer opt(be, options);
  Trainer trainer(ref, opt, TrainOptions{batch, 3, true, m});
  trainer.trainEpoch(train, 0, {});
  Reference r;
  for (const Param* p : ref.params()) r.weights[p->name] = toHost(p->value);
  r.steps = opt.steps();
  return r;
}

}  // namespace tandem::testing
