// From a job and files to a plan and the workers' assignments: what `tandem partition`,
// `tandem run` and `partition: auto` share.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/model.h"
#include "partitioner/plan.h"
#include "runtime/control/messages.h"
#include "runtime/job/cluster_daemons.h"
#include "runtime/job/job.h"

namespace tandem::runtime {

// Wire bytes per fp32 byte under a codec ("fp32", "fp16", "bf16", "int8"), measured by
// encoding a block with the transport's own codec (int8 carries its scales).
double codecRatio(const std::string& codec);

// Optimizer state bytes per parameter byte: SGD without momentum 0, with momentum 1,
// AdamW 2.
double optimizerStatePerParam(const std::string& kind, float momentum);

// The cost model for `model` on the cluster file with the profiles it names (and
// `profile`, the default for its devices).
partitioner::CostModel loadCostModel(const Model& model, const std::string& cluster,
                                     const std::string& profile,
                                     const partitioner::CostOptions& options);

// The cost options a job implies (schedule, microbatches, optimizer, codecs).
partitioner::CostOptions jobCostOptions(const JobSpec& job);

// The partitioner's problem for `model` (its spec's text: `model_spec`) on the daemons'
// cluster — the devices' and links' costs, which depend on the microbatch size and not on
// the schedule — under `options`: a
// device with a profile file (its own, its node's, or `default_profile`) is priced from
// it; the others are measured by their node's daemon (a profile task, cached there by
// model and device). Links the cluster file does not give (`between`, `measured`,
// `local` within a node) are measured by the daemons, or taken from `links` when it holds
// some (it receives what was measured: planning several microbatch sizes measures once).
partitioner::Problem measuredProblem(const Model& model, const std::string& model_spec,
                                     const ClusterDaemons& daemons,
                                     const std::string& default_profile,
                                     const partitioner::CostOptions& options,
                                     std::optional<LinkSet>* links = nullptr);

// The problems of several cost options (one per microbatch count a plan prices), as
// measuredProblem makes each, in order: each node's daemon measures every microbatch
// size in one profile task, so they share its sustained window, update and message
// measurements (node_profile.h) and the plans compared differ by their microbatches
// only.
std::vector<partitioner::Problem> measuredProblems(
    const Model& model, const std::string& model_spec, const ClusterDaemons& daemons,
    const std::string& default_profile, const std::vector<partitioner::CostOptions>& options,
    std::optional<LinkSet>* links = nullptr);

// `partition: auto`: plans the job with the partitioner over the daemons' cluster (priced
// as measuredProblem does, with the job's `profile`): the plan that runs (the search's,
// or the job's `baseline`), priced, and its YAML (for jobStages); the search's plan and
// the baselines, priced on the same cost model, for the run to print beside it.
//
// With `microbatches: auto` or `schedule: auto` it plans every candidate — microbatch
// counts 1, 2, 4, ... up to the batch (at most 64), profiled at their microbatch sizes in
// one task per node (measuredProblems);
// schedules 1f1b, gpipe, zb-h1 and interleaved (2 chunks per stage) — and takes the one with
// the shortest predicted step whose plan fits in memory — an interleaved one only when
// its step is predicted shorter than the best other's by more than kSelectionMargin (it
// sends each microbatch over `chunks` times the links) —; `microbatches`, `schedule` and
// `chunks` say which. Interleaved stages are the 1F1B plan's (after its device selection),
// each cut into chunks (partitioner::interleavedPlan); a job that asks for interleaved
// stages (`chunks` of them) whose plan is one device runs that device with 1F1B.
struct PlanCandidate {
  int64_t microbatches = 0;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int chunks = 1;  // interleaved: model chunks per stage
  double step_s = 0, samples_per_s = 0;
  std::string infeasible;  // why it does not fit (empty: it does)
  bool refused = false;    // `infeasible` is why it could not be planned at all
};
struct PlannedJob {
  partitioner::Plan plan;
  std::vector<partitioner::PlanStageSpec> stages;  // the plan's, as a plan file states them
  partitioner::Plan searched;
  // When the search's plan tensor-splits a stage: the best plan without (max_tensor 1),
  // planned the same way on the same cost model, to print beside it; else no stages.
  partitioner::Plan layer_only;
  std::vector<partitioner::Plan> baselines;
  std::vector<std::string> devices;  // the cost model's devices ("node/device"), which plans index
  int64_t microbatches = 0;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int chunks = 1;  // interleaved: model chunks per stage (the plan's stages are chunks)
  std::vector<PlanCandidate> candidates;  // every one priced, when the job let it choose
};
// `spec`: the model's spec text (a Hugging Face folder's, made from its config).
PlannedJob planJob(const JobSpec& job, const Model& model, const std::string& spec,
                   const ClusterDaemons& daemons);

// `partition: auto` for a generation run (`tandem generate JOB.yaml`, `tandem serve
// JOB.yaml`): the daemons' profiles priced per token with `in_flight` sequences
// (partitioner::planGeneration) — one device unless a split is predicted faster by more
// than the selection margin. Logs the choice with its prediction beside the best single
// device's and the best split's.
PlannedJob planGenerationJob(const JobSpec& job, const Model& model, const std::string& spec,
                             const ClusterDaemons& daemons, int in_flight);
// A generation job's own split (its ranges or plan file), stage s's layers `ranges[s]` on
// backend `backends[s]` of the cluster's node `nodes[s]`: priced per token beside the
// best single device (planGenerationJob's candidates), with a warning when the split is
// predicted slower. The split is run as it is either way; where the daemons cannot
// profile, or a stage's device is not in the cluster's profiles, nothing is said.
void warnSlowGenerationSplit(const JobSpec& job, const Model& model, const std::string& spec,
                             const ClusterDaemons& daemons, int in_flight,
                             const std::vector<LayerRange>& ranges, const std::vector<int>& nodes,
                             const std::vector<std::string>& backends);
// Per layer of a language model, the bytes of its output for one token (fp32).
std::vector<int64_t> tokenBytes(const Model& model);

// Whether planJob takes the fastest interleaved candidate over the fastest other one: only
// when it is predicted faster by more than kSelectionMargin, since it sends each
// microbatch over `chunks` times the links, the costs the model prices least well (on the
// emulated four-node cluster an interleaved plan predicted 9% faster than the best 1F1B
// plan ran 1.68x its prediction).
bool prefersInterleaved(double interleaved_samples_per_s, double other_samples_per_s);

// One stage of a job as `tandem run` starts it.
struct StagePlacement {
  StageSlice slice;                           // its device: replica 0's (`backendOf`)
  double predicted_compute_s = -1;            // from the plan, per microbatch (-1: no plan)
  int replicas = 1;                           // data-parallel replicas, each a worker of its own
  std::vector<std::string> replica_backends;  // each replica's device (empty: the slice's)
  std::vector<std::string> replica_devices;   // from a plan: each replica's "node/device"
  std::vector<double> shares;                 // unequal replicas' shares (empty: equal)
  // From a plan: the codecs of its link to the next stage (none: the job's).
  std::optional<WireCodec> next_activation_codec, next_gradient_codec;
  const std::string& backendOf(int replica) const {
    return replica_backends.empty() ? slice.device
                                    : replica_backends.at(static_cast<size_t>(replica));
  }
};

// Whether `slice`'s layers of `model` split over its tensor ranks by its shares;
// InvalidArgument naming `where` (the job file's line) and why not.
void checkTensorSplit(const Model& model, const StageSlice& slice, const std::string& where);

// The job's stages: from `planned` when given (the plan `tandem run` made for
// `partition: auto`), else the job's plan file, else its ranges or equal split on the
// CPU with the job's threads. Plans are checked to cover the model exactly once; a
// plan's stage on several devices has that many replicas.
std::vector<StagePlacement> jobStages(
    const JobSpec& job, const Model& model,
    const std::vector<partitioner::PlanStageSpec>* planned = nullptr);

// How the job's batches are cut (TrainSettings::microbatch_shares): the shares of its
// stage with unequal replicas, empty when none has them. InvalidArgument when two stages
// have shares or another stage's replicas are not as many as the shares (microbatch g
// goes to replica g mod R of every replicated stage, so the cut can follow one R only).
std::vector<double> microbatchShares(const std::vector<StagePlacement>& stages);

// Every worker's assignment (slot order: stage by stage, replicas within): the job and its
// placement, carried in-band; `spec` is the model spec's text, the weights (if any) named
// by content hash and size; `spans`: record spans for a timeline. The job's transport is
// copied as it is: a run resolves an unset one first (JobRun).
std::vector<Assign> jobAssignments(const JobSpec& job, const std::vector<StagePlacement>& stages,
                                   RunMode mode, bool spans, const std::string& spec,
                                   const std::string& weights_hash, int64_t weights_bytes);

// The replicas of each sharded stage (a job's `zero:`) get their room for their shards
// (TrainSettings::state_shares) from the memory the cluster file declares for the device
// each runs on (`node_of`: each slot's node), relative to the largest; equal where a
// replica's device declares none.
void shardStateByMemory(std::vector<Assign>& assignments, const partitioner::Cluster& cluster,
                        const std::vector<int>& node_of);
// What replica `replica` of a sharded stage holds: `stage_bytes` (stageMemory's, which
// prices each replica's equal part of the stage's `state_bytes` of optimizer state) with
// its part as its share of `shares` instead; `stage_bytes` where the shares are empty.
int64_t replicaMemory(int64_t stage_bytes, int64_t state_bytes, const std::vector<double>& shares,
                      int replica);

// Each worker's starting weights: of `whole` (a model file's bytes, of a model of `layers`
// layers), the slice with only its stage's layers' tensors (sliceModelFile) — the file
// itself for a worker of every layer — named in its weights_hash and weights_bytes, so a
// node receives only its stages' weights. Returns the files by hash: what the workers may
// ask for.
std::map<std::string, std::shared_ptr<const std::vector<uint8_t>>> stageWeights(
    std::vector<Assign>& assignments, const std::shared_ptr<const std::vector<uint8_t>>& whole,
    size_t layers);

// The memory each stage's worker needs, as the partitioner prices it (weights, and when
// training their gradients and optimizer state, the activations the schedule keeps in
// flight, transport buffers), one entry per stage, for one replica of it (of unequal
// replicas, the one with the largest share).
std::vector<int64_t> stageMemory(const JobSpec& job, const Model& model,
                                 const std::vector<StagePlacement>& stages, RunMode mode);

}  // namespace tandem::runtime
