// The coordinator's side of a run: it starts one stage worker per assignment through a
// Launcher, lets each connect back over an authenticated channel (a key made for the
// run), hands out the assignments in-band, wires the stages together (each one's
// neighbours' endpoints, each replicated stage's group addresses), relays progress to
// the caller, and gathers every worker's report. The first failure — a worker's error,
// a lost connection, a process that died — stops every worker and raises an Error naming
// the worker; a process killed by a signal is named before the errors its neighbours
// report because of it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/endpoint.h"
#include "runtime/control/cluster_key.h"
#include "runtime/control/messages.h"
#include "runtime/worker/launcher.h"

namespace tandem::runtime {

// Workers started by node daemons (daemon.h): connects to every node now (IoError or
// HandshakeRefused naming the node and its address), and asks node `node_of_slot[i]` to
// start worker i. A node whose connection closes or falls silent ends every worker it
// ran, named with the node. stopAll() says `leave`, and the daemons stop their workers.
// With `needs` (per worker: its device and the memory it will hold), a node that lacks a
// worker's device, or whose free memory (its node info) is less than its workers' sum,
// refuses the run here, before any worker is started: InvalidArgument naming the node,
// the device or both figures, and the workers.
struct DaemonNode {
  std::string name;
  Endpoint address;
};
struct WorkerNeeds {
  int64_t memory_bytes = 0;
  std::string device;  // "cpu", "opencl:0" (empty: not checked)
  std::string worker;  // its name in messages ("stage 1"; empty: "worker N")
};
// What the launcher checks of node `n` (named `name`) from its node info: InvalidArgument
// when it lacks the device of a worker placed on it (node_of_slot[i] == n), or has less
// free memory than those workers need together. Nothing to check when `needs` is empty.
void checkWorkersFit(const std::string& name, const NodeInfo& info, int n,
                     const std::vector<int>& node_of_slot, const std::vector<WorkerNeeds>& needs);
std::unique_ptr<Launcher> daemonLauncher(const std::vector<DaemonNode>& nodes,
                                         const std::vector<int>& node_of_slot,
                                         const ClusterKey& cluster_key,
                                         std::chrono::milliseconds timeout,
                                         const std::vector<WorkerNeeds>& needs = {});

// Generation: where a run's stage 0 gets its prompts and cancels from, in order (read by
// one thread of the coordinator's).
class PromptSource {
 public:
  virtual ~PromptSource() = default;
  // The next prompt or cancel, or PromptsDone once there are no more; nullopt if `wait`
  // passes first.
  virtual std::optional<Message> pop(std::chrono::milliseconds wait) = 0;
};

// The prompts a run's stage 0 serves, pushed by the caller as they come (from any thread)
// and closed after the last. The coordinator passes them on in order once the stages are
// wired.
class PromptQueue : public PromptSource {
 public:
  void push(Prompt p);
  // Request `id`'s client has gone: its sequence ends on every stage (CancelPrompt), in
  // order after its prompt. Its remaining tokens do not come.
  void cancel(int64_t id);
  void close();
  // PromptsDone once closed and empty.
  std::optional<Message> pop(std::chrono::milliseconds wait) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> queue_;
  bool closed_ = false;
};

struct RunCallbacks {
  std::function<void(int slot, int64_t pid)> started;
  std::function<void()> wired;  // every worker is ready and was told its neighbours
  std::function<void(const Progress&)> progress;
  std::function<void(const EpochDone&)> epoch;
  std::function<void(const InferDone&)> infer;
  // Inference streams: each request's answer, as the last stage's workers send them
  // (checked to lie in the stream; in each worker's order).
  std::function<void(const Answer&)> answer;
  // Generation: each token as the last stage sends it (checked to belong to a prompt in
  // flight, in order within it).
  std::function<void(const Token&)> token;
  // Generation: what stage `stage` has run so far (sent by each about once a second;
  // rank 0's for a tensor-split stage).
  std::function<void(int stage, const StageBusy&)> stage_busy;
  // Every stage's slice (a model file) after `step` training steps, by slot (empty for the
  // replicas beyond the first, which hold the same): workers with checkpoint.every_steps.
  // `shares`: how replicas of the whole model cut each batch from the step on, once
  // settled (Checkpointed::shares); empty otherwise.
  std::function<void(int64_t step, const std::vector<std::vector<uint8_t>>& slices,
                     const std::vector<double>& shares)>
      checkpoint;
};

struct RunOptions {
  std::string listen = "127.0.0.1:0";  // where workers connect back
  // Starting weights the workers may ask for, by content hash (weight_cache.h).
  std::map<std::string, std::shared_ptr<const std::vector<uint8_t>>> weights;
  std::chrono::milliseconds connect_timeout{60000};  // for every worker to connect
  std::chrono::milliseconds silence{0};  // no message from any worker this long: fail (0: never)
  // Set (to a signal's number) by whoever wants the run stopped, e.g. a signal handler:
  // seen within 200 ms, every worker is stopped and coordinate() raises Interrupted.
  const std::atomic<int>* interrupt = nullptr;
  // Generation: where the prompts come from (assignments with `generate`).
  PromptSource* prompts = nullptr;
};

// A run ended by a worker killed by a signal or lost with its node — not by an error the
// worker reported, which would recur: what a run may recover from by leaving that
// worker's node out. `slot` is the worker named first.
class WorkerLost : public Error {
 public:
  WorkerLost(const std::string& what, int slot) : Error(what), slot(slot) {}
  int slot;
};

struct RunResult {
  std::vector<Ready> ready;  // by slot
  // By slot; spans on this machine's realtime clock (seconds since the epoch): each
  // worker's own, less its machine's clock offset, so spans of several hosts line up.
  std::vector<StageReport> reports;
  // By slot: the trained slice (a model file) of each worker asked to save, verified
  // against the hash its report names; empty for the others.
  std::vector<std::vector<uint8_t>> slices;
  // Generation: prompts cancelled (PromptQueue::cancel) before their last token, and the
  // tokens of theirs that came after the cancel went to stage 0 (dropped, not passed on).
  int64_t cancelled = 0, tokens_after_cancel = 0;
};

// Runs the workers of `assignments` (slot i runs assignments[i]; `names[i]` names it in
// messages, e.g. "stage 1 replica 0"). Error naming the worker at the first failure
// (WorkerLost when a worker was killed or lost with its node).
RunResult coordinate(const std::vector<Assign>& assignments, const std::vector<std::string>& names,
                     Launcher& launcher, const RunCallbacks& callbacks, const RunOptions& options);

}  // namespace tandem::runtime
