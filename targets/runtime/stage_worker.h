// StageWorker: runs one pipeline stage's assignment, talking to its coordinator over a
// control channel (channel.h). Everything it needs arrives in-band — the model spec, its
// layer range and device, the schedule, its neighbours' endpoints, its replicas' group
// addresses — and everything it produces goes back in-band: progress, epoch results, its
// counters and spans, and its trained slice. It reads no file of the coordinator's.
//
//   coordinator -> worker   assign
//   worker -> coordinator   ready {its links' endpoints, device, data sizes}
//   coordinator -> worker   start {the neighbours' endpoints, data sizes}
//   worker <-> coordinator  group address / group addresses (a replicated stage)
//   worker -> coordinator   progress, epoch done | infer done (the last stage's replica 0)
//   worker -> coordinator   stage report (its last message)
//
// On any error it sends `failed` with the message, then raises it.
#pragma once

#include "targets/runtime/channel.h"

namespace tandem::runtime {

// Waits up to `wait` for the assignment, then runs it to the end.
void runStageWorker(Channel& coordinator,
                    std::chrono::milliseconds wait = std::chrono::seconds(60));

// The whole of a worker process (`tandem stage`, `tandemd worker`): reads the run's key
// from standard input, connects to the coordinator at `control` (HOST:PORT), says it is
// worker `slot`, and runs its assignment. Dies with the process that started it.
void runWorkerProcess(const std::string& control, int slot);

}  // namespace tandem::runtime
