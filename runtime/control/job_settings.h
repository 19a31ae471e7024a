// The settings a job file states and every one of its workers' assignments carries, each
// one struct: JobSpec (job.h) holds them as the job says, Assign (messages.h) as the
// worker runs them; settings_codec.cpp and stage_messages.cpp encode and decode each once.
// And the slice of the model a stage holds, as its placement (planning.h) and each of its
// workers' assignments carry it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/optimizer.h"
#include "core/pipeline/schedule.h"
#include "core/wire_codec.h"

namespace tandem::runtime {

// The most replicas whose shares TrainSettings::microbatch_shares carries.
inline constexpr size_t kMaxReplicaShares = 64;
inline constexpr int32_t kMaxTensorRanks = 64;  // a stage's (StageSlice::tensor)
// A job's rebalance_steps unless it says (TrainSettings::rebalance_steps), and the most.
inline constexpr int64_t kDefaultRebalanceSteps = 3;
inline constexpr int64_t kMaxRebalanceSteps = 1000;

// How the run trains (a serving run keeps the batch and microbatches).
struct TrainSettings {
  int64_t epochs = 1;
  int64_t batch = 64;
  int64_t microbatches = 4;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  bool recompute = false;
  uint64_t seed = 1;
  OptimizerOptions optimizer;
  // Unequal replicas of a stage (a plan's, or a job's `shares:`): each batch cut so that
  // microbatch g goes to replica g mod R with a size in proportion to its share
  // (PipelineOptions::microbatch_shares); empty: equal microbatches.
  std::vector<double> microbatch_shares;
  // Replicas of the whole model with shares: the shares are set once from the replicas'
  // speed measured in the run's steps 1 to rebalance_steps, then stay (PipelineOptions::
  // rebalance_steps); 0: they stay as planned. A job's `rebalance_steps` (default
  // kDefaultRebalanceSteps), sent only to such replicas.
  int64_t rebalance_steps = 0;
  // A replicated stage's ZeRO stage (a job's `zero:`; ExecutorOptions::zero): 0, each
  // replica keeps its whole training state; 1, the optimizer state sharded over the
  // stage's replicas; 2, and the summed gradients. Stages without replicas ignore it.
  int zero = 0;
  // A sharded stage's replicas' room for their shards (relative, one per replica; the run
  // sets them from the cluster file's device memory); empty: equal.
  std::vector<double> state_shares;
  bool operator==(const TrainSettings&) const = default;
};

// A job's train settings where it says nothing: TrainSettings' own, rebalancing unequal
// replicas of the whole model over kDefaultRebalanceSteps steps.
inline TrainSettings jobTrainDefaults() {
  TrainSettings t;
  t.rebalance_steps = kDefaultRebalanceSteps;
  return t;
}

// Where the samples come from, read where the first stage runs.
struct DataSettings {
  std::string name = "fashion-mnist";       // or "text:PATH" (a language model)
  std::string dir;                          // empty: the Debian package's directory
  int64_t train_limit = 0, test_limit = 0;  // > 0: only the first so many samples
  bool operator==(const DataSettings&) const = default;
};

// What a stage's links carry and how long their blocking calls wait. In an assignment,
// `activations` is what its link to the next stage carries and `gradients` what its link
// to the previous one does; in a job, what every link carries unless the plan chooses.
struct WireSettings {
  WireCodec activations = WireCodec::kRaw, gradients = WireCodec::kRaw;
  int64_t timeout_s = 60;
  bool operator==(const WireSettings&) const = default;
};

// Checkpoints as a worker takes part in them, and where a resumed run starts.
struct CheckpointSettings {
  int64_t every_steps = 0;         // send the trained slice every so many steps (0: never)
  int64_t start_step = 0;          // training steps already taken: a resumed run starts there
  bool restore_optimizer = false;  // the starting weights carry optimizer state to restore
  bool operator==(const CheckpointSettings&) const = default;
};

// One stage's slice of the model and where it runs: its layers, its model chunks when
// interleaved, the device and its CPU threads.
struct StageSlice {
  LayerRange layers{0, 1};  // [begin, end)
  // Interleaved 1F1B: the stage's chunks, ascending, from layers.begin to layers.end
  // (empty: one chunk, `layers`).
  std::vector<LayerRange> chunks = {};
  std::string device = "cpu";  // "cpu", "opencl:0"
  int32_t threads = 1;
  // Tensor parallelism: the stage's layers split over this many ranks in its worker's
  // process, each on a backend (`tensor_devices`, else `device`) with `threads` threads
  // (core/pipeline/ tensor_stage.h), by `tensor_shares` (one per rank; empty: equal).
  int32_t tensor = 1;
  std::vector<double> tensor_shares = {};
  // Each rank's backend ("cpu", "opencl:0"; rank 0's is `device`); empty: `device` for all.
  std::vector<std::string> tensor_devices = {};
  bool operator==(const StageSlice&) const = default;
};

}  // namespace tandem::runtime
