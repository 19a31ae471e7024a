// What `tandem run` and `tandem infer` print of a run (run_command.cpp drives it): the
// plan, the workers' layers and links, and after the run a table per stage, the bubble
// and step beside the plan's, memory per worker, inference figures and a timeline.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/pipeline/timeline.h"
#include "runtime/job/job_run.h"

namespace tandem::cli {

// Writes DIR/trace.json and DIR/timeline.svg (three training steps from the middle of
// the run, or all of it when shorter).
void writeTimeline(const std::string& dir, const std::vector<StageSpans>& all);

// Inference figures from the spans: each request (microbatch) from the start of its
// first-stage forward (which takes the input) to the end of its last-stage forward.
// After a recovery the spans are the last placement's: its requests only.
void printInference(const std::vector<StageSpans>& all, const runtime::InferDone& result,
                    const runtime::StreamTotals& stream, int64_t batch, int64_t microbatches);

// A worker's layers: "[0, 7)", or an interleaved stage's chunks "[0,2)+[5,7)" (one word,
// as the table's column is).
std::string layersOf(const runtime::Assign& a);

// The links' codecs as the workers were given them: "fp32" (or "fp16/fp32": activations,
// gradients) when every link has the same, else each link's ("0->1 int8/fp32, 1->2 fp32").
std::string linkCodecs(const std::vector<runtime::Assign>& as);

// What `partition: auto` chose (nothing for a run without it), the candidates it priced
// and the other splits beside it.
void printChosenPlan(const runtime::JobRun& jr);

// What the `n` workers had to be sent of the starting weights, and what they held already.
void printWeightsShipped(const runtime::RunResult& result, int n);

// Per stage (per replica) of the `p` stages: where its time went, its compute per
// microbatch beside the plan's prediction; then the bubble and the step, measured and
// predicted (training).
void printStages(const runtime::JobRun& jr, const runtime::RunResult& result, int p);

// Each worker's memory: what it grew by from before its model was built to its peak,
// beside the partitioner's model of a stage (weights, gradients, optimizer state,
// activations in flight, link buffers).
void printMemory(const runtime::JobRun& jr, const runtime::RunResult& result,
                 runtime::RunMode mode);

}  // namespace tandem::cli
