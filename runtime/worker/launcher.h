// How a run starts its stage workers: the Launcher interface the coordinator drives
// (runtime/job/coordinator.h), and its two launchers on this machine, worker processes
// and worker threads (launchers.cpp). The daemons' launcher, which asks node daemons to
// start them, is the job's (daemonLauncher in coordinator.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/endpoint.h"
#include "runtime/control/cluster_key.h"

namespace tandem::runtime {

// Starts stage workers that connect back to the coordinator.
class Launcher {
 public:
  virtual ~Launcher() = default;
  // Starts the worker for `slot`: it must connect to `coordinator` with `key` and say
  // WorkerHello{slot}. Returns its process id (0 when it is no process of its own).
  virtual int64_t start(int slot, const Endpoint& coordinator, const ClusterKey& key) = 0;
  // A worker that has ended on its own since the last call: its slot and how it ended
  // ("was killed by signal 9", "exited with code 1"), `killed` when by a signal.
  struct Ended {
    int slot;
    std::string how;
    bool killed;
  };
  virtual std::optional<Ended> ended() = 0;
  // Waits up to `grace` for every worker to end; what ended badly ("" if all ended
  // cleanly, with code 0).
  virtual std::string finish(std::chrono::milliseconds grace) = 0;
  // Stops every worker still running (and waits for them).
  virtual void stopAll() = 0;
  // The clock of worker `slot`'s machine minus this one's, in seconds (0 on this machine).
  virtual double clockOffset(int /*slot*/) const { return 0; }
};

// True when a worker ended as one should after its report: exited with code 0.
bool endedCleanly(const Launcher::Ended& e);
// "worker 3 (pid 42) was killed by signal 9 after finishing; " for a worker that did not
// end cleanly, "" for one that did: what finish() collects.
std::string endedBadly(const Launcher::Ended& e);

// Writes `text` to the pipe `fd` of a child process; false if the child has gone (its end
// closed), without the SIGPIPE that would end this process.
bool writeToChild(int fd, const std::string& text);

// Worker processes: `program args... --control HOST:PORT --slot N` started on this
// machine, the key written to their standard input.
std::unique_ptr<Launcher> processLauncher(std::string program, std::vector<std::string> args);

// Workers as threads of this process (runStageWorker): a coordinator and its workers in
// one process, for tests.
std::unique_ptr<Launcher> threadLauncher();

}  // namespace tandem::runtime
