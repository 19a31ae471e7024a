// The two launchers of launcher.h: worker processes on this machine, and worker
// threads of this process (for tests).
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <deque>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>

#include "core/error.h"
#include "runtime/control/handshake.h"
#include "runtime/node/node_info.h"
#include "runtime/worker/child_process.h"
#include "runtime/worker/launcher.h"
#include "runtime/worker/stage_worker.h"

namespace tandem::runtime {

// Writes `text` to a child's pipe. A child that has already exited (an exec that failed,
// a worker that ends at once) closed its end, and the write would raise SIGPIPE, which
// ends a process that does not ignore it (a test's in-process daemon, `tandem run`):
// SIGPIPE is blocked for this thread meanwhile, and one the write raised is consumed.
bool writeToChild(int fd, const std::string& text) {
  sigset_t pipe_signal, before;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, &before);
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (!written && sigismember(&before, SIGPIPE) == 0) {
    const timespec now{0, 0};
    while (sigtimedwait(&pipe_signal, nullptr, &now) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  return written;
}

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class ProcessLauncher final : public Launcher {
 public:
  ProcessLauncher(std::string program, std::vector<std::string> args)
      : program_(std::move(program)), args_(std::move(args)) {}
  ~ProcessLauncher() override { stopAll(); }

  int64_t start(int slot, const Endpoint& coordinator, const ClusterKey& key) override {
    std::vector<std::string> argv = {program_};
    argv.insert(argv.end(), args_.begin(), args_.end());
    argv.insert(argv.end(), {"--control", coordinator.str(), "--slot", std::to_string(slot)});
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    int in[2];
    if (pipe2(in, O_CLOEXEC) != 0) throw Error("cannot start a worker: pipe failed");
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      close(in[0]);
      close(in[1]);
      throw Error("cannot start a worker: fork failed");
    }
    if (pid == 0) {
      // The worker dies with the thread that started it (a daemon's connection, a run),
      // and holds the key's pipe as its standard input and nothing of the daemon's.
      if (!prepareChild(parent, {{in[0], STDIN_FILENO}})) _exit(126);
      execv(program_.c_str(), cargv.data());
      _exit(127);
    }
    close(in[0]);
    // The key goes through the pipe, never a file or the command line.
    const std::string hex = clusterKeyHex(key) + "\n";
    const bool written = writeToChild(in[1], hex);
    close(in[1]);
    running_[slot] = pid;
    if (!written) throw Error("cannot hand worker " + std::to_string(slot) + " its key");
    return pid;
  }

  std::optional<Ended> ended() override {
    reap();
    if (ended_.empty()) return std::nullopt;
    Ended e = ended_.front();
    ended_.pop_front();
    return e;
  }

  std::string finish(std::chrono::milliseconds grace) override {
    const auto until = Clock::now() + grace;
    while (!running_.empty() && Clock::now() < until) {
      reap();
      std::this_thread::sleep_for(5ms);
    }
    std::string bad;
    for (const Ended& e : ended_) bad += endedBadly(e);
    ended_.clear();
    if (!running_.empty()) {
      bad += std::to_string(running_.size()) + " workers did not exit after finishing";
      stopAll();
    }
    return bad;
  }

  void stopAll() override {
    for (const auto& [slot, pid] : running_) kill(pid, SIGTERM);
    const auto deadline = Clock::now() + 3s;
    for (const auto& [slot, pid] : running_) {
      int status = 0;
      while (waitpid(pid, &status, WNOHANG) == 0) {
        if (Clock::now() > deadline) {
          kill(pid, SIGKILL);
          waitpid(pid, &status, 0);
          break;
        }
        std::this_thread::sleep_for(10ms);
      }
    }
    running_.clear();
  }

 private:
  void reap() {
    for (auto it = running_.begin(); it != running_.end();) {
      int status = 0;
      if (waitpid(it->second, &status, WNOHANG) != it->second) {
        ++it;
        continue;
      }
      const std::string pid = "(pid " + std::to_string(it->second) + ") ";
      if (WIFSIGNALED(status))
        ended_.push_back(
            {it->first, pid + "was killed by signal " + std::to_string(WTERMSIG(status)), true});
      else
        ended_.push_back(
            {it->first, pid + "exited with code " + std::to_string(WEXITSTATUS(status)), false});
      it = running_.erase(it);
    }
  }

  std::string program_;
  std::vector<std::string> args_;
  std::map<int, pid_t> running_;  // by slot
  std::deque<Ended> ended_;
};

class ThreadLauncher final : public Launcher {
 public:
  ~ThreadLauncher() override {
    for (auto& [slot, t] : threads_) t.join();
  }

  int64_t start(int slot, const Endpoint& coordinator, const ClusterKey& key) override {
    threads_[slot] = std::thread([this, slot, coordinator, key] {
      std::string how = "exited with code 0";
      try {
        HandshakeOptions o;
        o.build = buildName();
        std::unique_ptr<Channel> c = connectChannelRetrying(coordinator, key, o);  // as workers do
        c->send(WorkerHello{slot, static_cast<int64_t>(getpid())});
        runStageWorker(*c, key);
        c->close();
      } catch (const std::exception& e) {
        how = std::string("exited with code 1 (") + e.what() + ")";
      }
      std::lock_guard lock(mu_);
      ended_.push_back({slot, how, false});
    });
    return 0;
  }

  std::optional<Ended> ended() override {
    std::lock_guard lock(mu_);
    if (ended_.empty()) return std::nullopt;
    Ended e = ended_.front();
    ended_.pop_front();
    return e;
  }

  std::string finish(std::chrono::milliseconds) override {
    for (auto& [slot, t] : threads_) t.join();
    threads_.clear();
    std::string bad;
    std::lock_guard lock(mu_);
    for (const Ended& e : ended_) bad += endedBadly(e);
    ended_.clear();
    return bad;
  }

  // Threads cannot be stopped from outside: they end on their own timeouts once their
  // coordinator and links are gone, and are joined on destruction.
  void stopAll() override {}

 private:
  std::map<int, std::thread> threads_;
  std::mutex mu_;
  std::deque<Ended> ended_;
};

}  // namespace

bool endedCleanly(const Launcher::Ended& e) {
  static constexpr std::string_view kClean = "exited with code 0";
  return !e.killed && e.how.size() >= kClean.size() &&
         e.how.compare(e.how.size() - kClean.size(), kClean.size(), kClean) == 0;
}

std::string endedBadly(const Launcher::Ended& e) {
  return endedCleanly(e) ? ""
                         : "worker " + std::to_string(e.slot) + " " + e.how + " after finishing; ";
}

std::unique_ptr<Launcher> processLauncher(std::string program, std::vector<std::string> args) {
  return std::make_unique<ProcessLauncher>(std::move(program), std::move(args));
}

std::unique_ptr<Launcher> threadLauncher() { return std::make_unique<ThreadLauncher>(); }

}  // namespace tandem::runtime
