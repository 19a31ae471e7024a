// StageWorker: runs one pipeline stage's assignment, talking to its coordinator over a
// control channel (channel.h). Everything it needs arrives in-band — the model spec, its
// layer range and device, the schedule, its neighbours' endpoints, its replicas' group
// addresses — and everything it produces goes back in-band: progress, epoch results, its
// counters and spans, and its trained slice. It reads no file of the coordinator's.
//
//   coordinator -> worker   assign
//   worker <-> coordinator  weights request / weights chunks (starting weights not cached)
//   worker -> coordinator   ready {its links' endpoints, device, data sizes}
//   coordinator -> worker   start {the neighbours' endpoints, data sizes}
//   worker <-> coordinator  group address / group addresses (a replicated stage)
//   worker -> coordinator   progress, epoch done | infer done (the last stage's replica 0)
//   coordinator -> worker   prompt..., prompts done (stage 0 of a generation run)
//   worker -> coordinator   token... (the last stage of a generation run)
//   worker -> coordinator   stage report (its last message)
//
// On any error it sends `failed` with the message, then raises it.
#pragma once

#include "core/data/data_access.h"
#include "runtime/control/channel.h"
#include "runtime/control/cluster_key.h"

namespace tandem::runtime {

// What a node gives each of its workers (tandemd's options).
struct WorkerOptions {
  // The node's weight cache (empty: none) and its cap: past it the least recently used
  // files go, the one just written too if it alone is over.
  std::string cache_dir;
  uint64_t cache_max_bytes = uint64_t{8} << 30;
  DataAccess data;  // where the job's data may be read from (none set: anywhere)
};

// Waits up to `wait` for the assignment, then runs it to the end. Starting weights come
// from the node's weight cache (`o.cache_dir`) when it holds them (verified), else from
// the coordinator (`weights request`, then `weights chunk`s), and are then cached there.
// `run_key` is the key the worker proved to its coordinator: an assignment that asks for
// encrypted links derives their CurveZMQ keys from it (cluster_key.h). The job's data is
// read only where `o.data` allows (a daemon's --data-root rules).
void runStageWorker(Channel& coordinator, const ClusterKey& run_key, const WorkerOptions& o = {},
                    std::chrono::milliseconds wait = std::chrono::seconds(60));

// The whole of a worker process (`tandem stage`, `tandemd worker`): reads the run's key
// from standard input, connects to the coordinator at `control` (HOST:PORT), says it is
// worker `slot`, and runs its assignment. Dies with the process that started it.
void runWorkerProcess(const std::string& control, int slot, const WorkerOptions& o = {});

}  // namespace tandem::runtime
