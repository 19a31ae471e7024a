// A pipeline job run from the coordinator's side — what `tandem run` and `tandem infer`
// do between parsing their options and printing: the job's starting weights read and
// checked, its nodes' daemons found or started (cluster_daemons.h), its stages planned
// (`partition: auto`) and placed on nodes, every worker's assignment made and checked
// against its node's devices and free memory — all before any worker starts; then the
// run itself (coordinator.h), and the trained slices merged into the job's `save:` file.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/job/checkpoint.h"
#include "runtime/job/cluster_daemons.h"
#include "runtime/job/coordinator.h"
#include "runtime/job/generation_ledger.h"
#include "runtime/job/job.h"
#include "runtime/job/planning.h"

namespace tandem::runtime {

struct JobRunOptions {
  // The nodes: this cluster file's, else the job's `cluster:`, else this machine as one
  // node with a CPU device of the job's threads.
  std::string cluster;
  std::string key;      // the cluster key file, over the cluster file's `key`
  std::string tandemd;  // the daemon program, for nodes without an address
  // Workers forked by this process (`program args... --control HOST:PORT --slot N`)
  // instead of started by the nodes' daemons: kept to measure the daemon path against.
  std::vector<std::string> fork;
  // Train; stream the test set forward (infer); or generate: the stages decode text from
  // the job's weights, stage 0 taking the prompts of `prompts`, with `in_flight`
  // sequences at once, one worker per stage.
  RunMode mode = RunMode::kTrain;
  bool spans = false;  // the workers record spans (timelines, inference latencies)
  // Continue from the newest usable checkpoint in this folder (checkpoint.h): its weights
  // and optimizer state, from its step; the job must match what it was taken with.
  std::string resume;
  // Inference: requests (microbatches) per second fed into the stream (0: as fast as the
  // pipeline takes them).
  double request_rate = 0;
  PromptSource* prompts = nullptr;
  int in_flight = 8;
};

// An inference stream's answers so far, as JobRun::run hands them on: in stream order,
// each request once.
struct StreamTotals {
  int64_t requests = 0, samples = 0, correct = 0;
  double loss_sum = 0;
  int64_t repeated = 0;  // answers that came again after a recovery, dropped
};

class JobRun {
 public:
  // Everything up to starting the workers (see above). Errors name the file, node,
  // device or figure that is wrong.
  JobRun(JobSpec job, JobRunOptions options);
  ~JobRun();
  JobRun(const JobRun&) = delete;
  JobRun& operator=(const JobRun&) = delete;

  const JobSpec& job() const { return job_; }
  // The model spec's text (YAML) the workers are given.
  const std::string& modelSpec() const { return model_spec_; }
  // The plan `partition: auto` made (nullopt for other jobs).
  const std::optional<PlannedJob>& planned() const { return planned_; }
  const std::vector<StagePlacement>& stages() const { return stages_; }
  // By slot: every worker's assignment and its name ("stage 1", "stage 1 replica 0").
  const std::vector<Assign>& assignments() const { return assignments_; }
  const std::vector<std::string>& workerNames() const { return names_; }
  bool startsFromWeights() const { return weights_ != nullptr; }
  // What serving applies to the model's outputs: "softmax" or "log_softmax" when its
  // weights came from an ONNX model that ended in one (metadata "output"), else "".
  const std::string& outputActivation() const { return output_; }
  // The step a resumed run starts from (0 for a fresh one).
  int64_t startStep() const { return start_step_; }
  // Whether the placement's replicas cut each batch by the shares the checkpoint at
  // startStep() carried (assignments' train.microbatch_shares, not rebalanced again):
  // they ran on the same nodes when it was taken (CheckpointShares).
  bool sharesCarried() const { return shares_carried_; }
  // The newest checkpoint this run wrote ("" if none yet).
  const std::string& lastCheckpoint() const { return last_checkpoint_; }

  // Starts the workers and runs the job to its end (coordinate()); `interrupt` as in
  // RunOptions. Error naming the worker or node at the first failure — except, for a job
  // with checkpoints or an inference stream, a worker lost with its node (killed, cut
  // off: WorkerLost): then up to `max_restarts` times the node is left out, the stages
  // are placed on the nodes left (re-planned for `partition: auto`), and the run resumes
  // on the same path — training from the newest checkpoint (or its start), a stream from
  // the batch of its first unanswered request, generation with every sequence in flight
  // prefilled again from its prompt and the tokens it was answered (GenerationLedger:
  // `callbacks.token` hears one stream per request, numbered on across the pause).
  // assignments(), stages() and the result are then the last placement's. A stream's answers reach
  // `callbacks.answer` in stream order, each request once (one answered again after a recovery is
  // dropped); the run fails if any request of the stream was left unanswered.
  RunResult run(const RunCallbacks& callbacks, const std::atomic<int>* interrupt = nullptr);
  // An inference stream's answers handed on so far.
  const StreamTotals& streamTotals() const { return totals_; }
  // Merges the trained slices of `result` into one model file with the optimizer's
  // state, written whole to the job's `save:` path.
  void save(const RunResult& result) const;

 private:
  // Stages (from the plan, if one was made), assignments, names, nodes and needs.
  bool infers() const { return options_.mode == RunMode::kInfer; }
  bool generates() const { return options_.mode == RunMode::kGenerate; }
  // The job's transport, or the run's choice where it gives none (JobSpec::transport);
  // ipc on a cluster with addresses is refused, named.
  void resolveTransport();
  void place(const Model& model);
  RunResult runOnce(const RunCallbacks& callbacks, const std::atomic<int>* interrupt);
  // A stream's answer from a worker: handed on in order once, or dropped as a repeat.
  void answer(const Answer& a, const RunCallbacks& callbacks);
  // After a stream's run: every one of its samples was answered (Error otherwise).
  void checkStreamAnswered(const RunResult& result) const;
  // After losing worker `slot`: its node left out, the daemons and the placement anew.
  void leaveOut(int slot);
  // At a checkpoint: a left-out node whose back-off has passed is tried (in the
  // background); once it answers, the run stops there (NodeRejoins) to take it back.
  void offerRejoin(int64_t step);
  // The left-out node `name` back in, the daemons and the placement anew.
  void rejoin(const std::string& name);
  // How long a left-out node waits before it is tried: rejoin_after_s, doubled for each
  // loss of it after the first.
  double backOff(const std::string& node) const;
  // Where a stream resumes: the batch of its first unanswered sample.
  int64_t streamResumesAt() const;
  // The daemons, the plan (`partition: auto`) and the placement for cluster_ as it is
  // now, from the newest checkpoint.
  void replace();
  // A training job of its own ranges or `equal` (made for the whole cluster) with nodes
  // left out: its layers planned over the nodes left by the partitioner; with the whole
  // cluster back, its own ranges again. InvalidArgument naming the nodes and the memory
  // when they cannot hold the model.
  void replanOwnRanges(const Model& model);
  // `partition: auto` over the daemons: planGenerationJob for a generation run (per token),
  // else planJob.
  PlannedJob plan(const JobSpec& job, const Model& model) const;
  // A generation job's own split (not `partition: auto`), priced per token beside one
  // device: warnSlowGenerationSplit.
  void priceOwnSplit(const Model& model) const;
  // One model file of the whole model and its optimizer state from the stages' slices
  // (by slot; empty for the slots that send none).
  std::vector<uint8_t> merge(const std::vector<std::vector<uint8_t>>& slices) const;
  void checkpoint(int64_t step, const std::vector<std::vector<uint8_t>>& slices,
                  const std::vector<double>& shares);
  // Replicas of the whole model: the node of each, by replica (empty otherwise, and for
  // forked workers, which have no nodes).
  std::vector<std::string> replicaNodes() const;
  // A resumed placement whose replicas are on the nodes resume_replicas_ names: their
  // shares set to its, and no rebalancing (sharesCarried()).
  void carryShares();

  JobSpec job_;
  JobRunOptions options_;
  partitioner::Cluster cluster_;
  bool local_ = false;  // no node has an address: the nodes are this machine
  std::shared_ptr<const std::vector<uint8_t>> weights_;
  // ... and each placed worker's part of them, by hash (stageWeights).
  std::map<std::string, std::shared_ptr<const std::vector<uint8_t>>> stage_weights_;
  std::string output_;      // outputActivation()
  std::string model_spec_;  // the model spec's text
  int64_t start_step_ = 0;
  std::string last_checkpoint_;
  // The newest checkpoint's model file and step, to resume from after a loss.
  std::shared_ptr<const std::vector<uint8_t>> resume_weights_;
  int64_t resume_step_ = 0;
  CheckpointShares resume_replicas_;  // ... and its replicas' shares, if it had any
  bool shares_carried_ = false;
  // The last membership change (a loss seen, a node rejoining) and what it was.
  std::optional<std::chrono::steady_clock::time_point> changed_at_;
  std::string change_;
  // Nodes left out after a loss (with their links), each tried again after a back-off:
  // rejoin_after_s, doubled for each further loss of the same node.
  struct LeftOut {
    partitioner::ClusterNode node;
    std::vector<partitioner::ClusterLink> links;
    std::chrono::steady_clock::time_point retry_at;
  };
  std::vector<LeftOut> left_out_;
  std::map<std::string, int> losses_;    // by node name
  std::vector<std::string> node_order_;  // the cluster file's, kept when a node rejoins
  // The job's own schedule and chunks, which a plan over fewer nodes may change.
  ScheduleKind given_schedule_ = ScheduleKind::k1F1B;
  int given_chunks_ = 1;
  std::string probing_;      // the left-out node being tried, if any
  std::future<bool> probe_;  // whether its daemon answered
  // An inference stream: the first sample not yet handed on, the answers that came
  // ahead of it (replicas of the last stage answer in their own order), the totals.
  int64_t next_answer_ = 0;
  std::map<int64_t, Answer> ahead_;
  StreamTotals totals_;
  // Generation: the prompts passed on and the tokens answered, to resume from.
  std::unique_ptr<GenerationLedger> ledger_;
  std::unique_ptr<ClusterDaemons> daemons_;
  std::optional<PlannedJob> planned_;
  std::vector<StagePlacement> stages_;
  std::vector<Assign> assignments_;
  std::vector<std::string> names_;
  std::vector<int> node_of_;        // by slot: its node's index in the cluster
  std::vector<WorkerNeeds> needs_;  // by slot: device and memory, checked before starting
};

}  // namespace tandem::runtime
