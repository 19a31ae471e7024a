// Checkpoints of a training run (job key `checkpoint:`), written by the coordinator into
// a folder: for a step S, `step-S.tdm` (the whole model and its optimizer state, merged
// from every stage's slice at that step boundary) and `step-S.json` (a manifest: the step,
// the model file's size and BLAKE2b, the job settings a resumed run must share for its
// result to be bitwise the uninterrupted run's, and unequal replicas' shares). Each file
// is written atomically (temporary file, fsync, rename), the manifest last, so a
// checkpoint with a manifest is whole; the newest `keep` are kept.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/job/job.h"

namespace tandem::runtime {

// What a resumed run must share with the run that took the checkpoint.
struct CheckpointJob {
  std::string model_spec_hash;  // content hash of the model spec's text
  int64_t batch = 0, microbatches = 0, train_limit = 0;
  uint64_t seed = 0;
  std::string data, optimizer;
  bool operator==(const CheckpointJob&) const = default;
};
CheckpointJob checkpointJob(const JobSpec& job, const std::string& model_spec);

// Unequal replicas of the whole model: the nodes they ran on (by replica) and how each
// batch was cut among them from the checkpoint's step on (the shares their first steps
// measured, or the plan's). A run resumed with its replicas on the same nodes cuts its
// batches alike (JobRun), so that it continues the uninterrupted run bitwise. Empty: the
// run had none, or they were still measuring.
struct CheckpointShares {
  std::vector<std::string> nodes;
  std::vector<double> shares;
  bool operator==(const CheckpointShares&) const = default;
};

struct Checkpoint {
  int64_t step = 0;
  std::string model_path;  // the .tdm file
  std::vector<uint8_t> model;
  CheckpointJob job;
  CheckpointShares replicas;  // the manifest's optional "replicas" (older ones have none)
};

// Writes the checkpoint of `step` (the merged model file's bytes) into `dir` (made if
// missing), then removes all but the newest `keep`. IoError naming the file;
// InvalidArgument when `replicas` is not as CheckpointShares says.
void writeCheckpoint(const std::string& dir, int64_t step, const std::vector<uint8_t>& model,
                     const CheckpointJob& job, int keep, const CheckpointShares& replicas = {});

// The newest checkpoint in `dir` whose manifest parses and whose model file has the size
// and hash it names; each damaged newer one is passed over with a warning naming it and
// what is wrong. nullopt when there is none (IoError when `dir` cannot be read).
std::optional<Checkpoint> newestCheckpoint(const std::string& dir);

// InvalidArgument naming the setting and both values when `job` differs from what the
// checkpoint was taken with (then the resumed run could not end as the uninterrupted one).
void checkResumable(const Checkpoint& checkpoint, const CheckpointJob& job,
                    const std::string& job_source);

}  // namespace tandem::runtime
