// StageExecutor: runs one pipeline stage's action list (schedule.h) for a step, with the
// stage's layers of a Model on its Backend and Links to the neighbouring stages.
//
// Training: gradients of the stage's parameters are cleared at the start of a step and
// accumulate over its microbatches; the optimizer steps at the flush. With recomputation
// a forward keeps only the stage's input, and the backward re-runs the forward (same
// dropout seed, so the same result) before differentiating. The first stage takes
// microbatches from a callback; labels travel with the activations to the last stage,
// which computes the loss (scaled to the step's whole batch) and its gradient.
//
// Sends go through Link::send, which queues the message and returns while the
// transport moves it, so the next computation overlaps the transfer.
//
// Message tags are global microbatch numbers (a running count over the executor's
// steps), so a stage that runs ahead into the next step never confuses its messages.
//
// Interleaved stages (StageRange::chunks, ScheduleKind::kInterleaved1F1B) hold v model
// chunks and run each action on the chunk it names. Chunk c's activations go to virtual
// stage c*p + s + 1: the next stage's chunk c, or, from the last stage, the first stage's
// chunk c + 1 over a link that closes the ring (the first stage's `prev` and the last's
// `next`). Every link then carries v boundaries, so a message's tag is its global
// microbatch number times v plus the chunk on the boundary's sending side. Each
// parameter belongs to one chunk, whose backwards run in microbatch order, so an
// interleaved pipeline is bitwise single-device accumulation too. Not with replicas.
//
// Replicas (the hybrid of pipeline and data parallelism): a stage may run as R
// executors, each with the same layers and a rank of a Group of R. Each runs the stage's
// action list for the microbatches whose global number is its rank modulo R, in the
// list's order (a subsequence of a deadlock-free schedule, so no new waits arise), and
// its neighbours reach the right replica through a ReplicaLinks. The replicas sum their
// gradients in buckets (GradientBuckets, core/train/gradient_buckets.h): during a
// replica's last backward of the step each bucket is summed as soon as its layers are
// done — on a communication thread while a device runs the rest of that backward, on
// the compute thread between layers for a CPU stage — and at the flush the executor
// waits for what is left; every replica takes the same optimizer step (the sums are
// taken in one fixed order, so replicas stay bitwise identical). A replicated last stage also sums
// its loss and counts so that each replica returns the step's whole result.
//
// Threading: one thread drives an executor.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/group.h"
#include "core/comm/link.h"
#include "core/model.h"
#include "core/optimizer.h"
#include "core/pipeline/schedule.h"
#include "core/train/gradient_buckets.h"

namespace tandem {

struct StageRange {
  StageRange() = default;
  StageRange(int stage_, int stages_, size_t begin_, size_t end_)
      : stage(stage_), stages(stages_), begin(begin_), end(end_) {}
  int stage = 0, stages = 1;
  size_t begin = 0, end = 0;  // the stage's layers of the model
  // Interleaved schedules: the stage's model chunks when it holds several, ascending
  // (begin and end then span them all); chunk c is virtual stage c * stages + stage.
  // Empty: one chunk, [begin, end).
  std::vector<LayerRange> chunks;
  bool first() const { return stage == 0; }          // takes the input (in chunk 0)
  bool last() const { return stage == stages - 1; }  // computes the loss (in its last chunk)
  int chunkCount() const { return chunks.empty() ? 1 : static_cast<int>(chunks.size()); }
  LayerRange chunk(int c) const {
    return chunks.empty() ? LayerRange{begin, end} : chunks.at(static_cast<size_t>(c));
  }
  // Stage `stage` of `stages` holding `chunks` (several: interleaved).
  static StageRange interleaved(int stage, int stages, std::vector<LayerRange> chunks);
};

struct ExecutorOptions {
  bool recompute = false;
  uint64_t seed = 1;          // dropout seeds: microbatchSeed(seed, step, k)
  bool record_spans = false;  // keep a Span per action for the timeline
  // The stage's replicas (null: one): this executor is replica rank() of size(). Must
  // outlive the executor.
  Group* replicas = nullptr;
  std::chrono::milliseconds collective_timeout{60000};
  size_t bucket_bytes = size_t{1} << 20;  // replicas: gradient bytes per allreduce
  // Replicas that train: the ZeRO stage of their training state (state_shards.h): 0, every
  // replica keeps all of it; 1, each keeps and steps its own rows' optimizer state and
  // then broadcasts those rows; 2, and each run of the summed gradients is reduced into
  // its owner alone, the gradients living from the step's first backward to their
  // reduce. (Stage 3 would gather a stage's parameters for every microbatch: refused.)
  int zero = 0;
  std::vector<double> state_shares;  // zero > 0: each replica's room (stateShards); empty: equal
};

// A microbatch as the first stage feeds it in.
struct MicrobatchInput {
  Tensor x;       // [n, ...model input]
  Tensor labels;  // i32 [n]; undefined when serving (no loss)
};

// The most a microbatch's global number may be (StepInfo::first_microbatch), so that its
// messages' tags (the number times the stage's chunks) stay far from overflowing; and
// where StageTrainer's evaluations start numbering theirs, apart from training steps'.
inline constexpr int64_t kMaxMicrobatchNumber = int64_t{1} << 50;
inline constexpr int64_t kFirstEvaluationMicrobatch = kMaxMicrobatchNumber / 2;

struct StepInfo {
  int64_t step = 0;           // global step: dropout seeds
  int64_t batch_samples = 0;  // the whole step's samples: the loss is their mean
  bool training = true;
  bool labels = true;    // labels travel to the last stage (training and evaluation)
  bool outputs = false;  // evaluation: the last stage keeps each microbatch's output
  // A replicated last stage: StepResult::replica_seconds is filled in (the replicas' sums
  // carry each one's time; PipelineOptions::rebalance_steps).
  bool replica_seconds = false;
  // The global number of this step's microbatch 0 (>= 0), which its messages' tags and
  // its replica follow (microbatch g is replica g mod R's, on every stage); -1: the one
  // after the previous step's last. StageTrainer numbers a training
  // step's microbatches from its step, so that a run resumed there gives each replica the
  // same microbatches as the run that never stopped, and its evaluations' apart.
  int64_t first_microbatch = -1;
};

// A microbatch's output at the last stage (serving, or StepInfo::outputs).
struct MicrobatchOutput {
  int64_t microbatch = 0;  // within the step
  Tensor y;                // [n, outputs]
  // With labels (StepInfo::outputs): y on the host, as counting the right rows read it,
  // its rows' summed loss, and how many have their largest logit at the label.
  std::vector<float> host;
  double loss_sum = 0;
  int64_t correct = 0;
};

// The last stage's sums over a step's microbatches (zero elsewhere).
struct StepResult {
  double loss_sum = 0;  // sum of per-sample losses
  int64_t correct = 0;  // evaluation only: rows whose largest logit is the label
  int64_t samples = 0;
  // Serving (no labels) or StepInfo::outputs: this stage's microbatches' outputs, in
  // order (a replica's own only).
  std::vector<MicrobatchOutput> outputs;
  // StepInfo::replica_seconds: each replica's seconds in forward, backward and weight
  // gradients this step, by rank, the same on every replica.
  std::vector<double> replica_seconds;
};

struct StageCounters {
  // Forward, backward and the optimizer; not the gradient buckets a CPU replica sums on
  // its own thread inside its last backward (allreduce_s).
  double busy_s = 0;
  double step_s = 0;  // the optimizer's share of busy_s
  // This thread's CPU time in forward, backward and weight gradients: the compute the
  // stage did, apart from time lost to other processes on shared cores. Meaningful for a
  // single-threaded CPU stage (other threads' and devices' work is not counted).
  double compute_cpu_s = 0;
  double recv_wait_s = 0;  // blocked in Link::recv
  double send_s = 0;       // in Link::send (copy or encode, then queue)
  // Replicas: summing gradient buckets on the stage's thread (a CPU replica's, waiting
  // for the others included), waiting for the sums at the flush (what the overlap did not
  // hide), and summing the last stage's loss.
  double allreduce_s = 0;
  // Most microbatches held at once: forwarded, not yet through their backward (or their
  // weight gradient, on a stage that splits backwards). Interleaved: chunks' microbatches
  // (one microbatch in two chunks counts twice).
  int64_t peak_stash = 0;
  int64_t microbatches = 0;  // forwards (an interleaved stage's first chunk's)
  int64_t samples = 0;       // ... and the samples they took
  bool operator==(const StageCounters&) const = default;
};

struct Span {
  ActionType type;
  // Global (an interleaved stage's spans do not name the chunk); an evaluation's counted
  // from its first (StepInfo::first_microbatch less kFirstEvaluationMicrobatch).
  int64_t microbatch;
  // Seconds on the steady clock (CLOCK_MONOTONIC on Linux: one clock for every process
  // of the machine, so stage processes' spans line up).
  double start_s, end_s;
  bool operator==(const Span&) const = default;
};

class StageExecutor {
 public:
  // `prev` is null on the first stage, `next` on the last (interleaved: both are the
  // ring's); `optimizer` may be null when only evaluating or serving. The model must have
  // the stage's layers built.
  StageExecutor(Model& model, StageRange range, Link* prev, Link* next, Optimizer* optimizer,
                ExecutorOptions options);

  // Runs one step's actions; `input(k)` gives microbatch k of this step on the first
  // stage (not called elsewhere). `before_input(k)`, if given, is called there just
  // before, outside the forward's timing: a paced stream waits in it for k's turn.
  StepResult run(const std::vector<Action>& actions, const StepInfo& info,
                 const std::function<MicrobatchInput(int64_t)>& input,
                 const std::function<void(int64_t)>& before_input = {});

  const StageCounters& counters() const { return counters_; }
  const std::vector<Span>& spans() const { return spans_; }
  // A sharded stage (zero > 0): the whole optimizer state, on replica 0, from the rows
  // every replica keeps (gatherShardedState; elsewhere empty). Every replica calls it at
  // the same point between steps.
  std::vector<std::pair<std::string, Tensor>> gatherOptimizerState();
  bool sharded() const { return !shards_.empty(); }
  // The most gradient bytes this stage held at once while training: its buckets' count
  // (GradientBuckets::peakGradientBytes) where it has replicas, else its gradients'.
  int64_t peakGradientBytes() const;

 private:
  // What a microbatch holds on this stage between its actions.
  struct InFlight {
    Tensor x, labels;  // the stage's input (kept for recomputation) and the labels
    Tensor y;          // the output, until sent
    Tensor dy, dx;     // the output's gradient (received or from the loss); the input's
    Stash stash;
    bool split = false;  // backward ran its input half; the weight gradient is pending
  };
  using Clock = std::chrono::steady_clock;

  void forward(int64_t k, int c, const StepInfo& info, StepResult& result,
               const std::function<MicrobatchInput(int64_t)>& input);
  // `done`: the step's last gradient of this replica, reported layer by layer.
  void backward(int64_t k, int c, const StepInfo& info, bool split, const LayerDone& done);
  // The tag of microbatch k's message over the boundary whose sending side is chunk c.
  MessageTag tag(MessageKind kind, int64_t k, int c) const {
    return {kind, (tag_base_ + k) * range_.chunkCount() + c};
  }
  // Virtual stages: chunk c's, and whether it takes the input or computes the loss.
  int virtualStage(int c) const { return c * range_.stages + range_.stage; }
  bool firstVirtual(int c) const { return virtualStage(c) == 0; }
  bool lastVirtual(int c) const {
    return virtualStage(c) == range_.stages * range_.chunkCount() - 1;
  }
  // The chunk on the sending side of chunk c's input boundary.
  int inputBoundary(int c) const { return range_.first() ? c - 1 : c; }
  void record(ActionType type, int64_t k, Clock::time_point t0, double& counter);
  // Whether the stage has replicas besides this one.
  bool replicated() const { return options_.replicas && options_.replicas->size() > 1; }
  // Whether microbatch k of this step is this replica's.
  bool mine(int64_t k) const {
    return !options_.replicas ||
           (tag_base_ + k) % options_.replicas->size() == options_.replicas->rank();
  }
  StepResult runActions(const std::vector<Action>& actions, const StepInfo& info,
                        const std::function<MicrobatchInput(int64_t)>& input,
                        const std::function<void(int64_t)>& before_input);
  // The step's microbatch count, and per chunk whether its backwards leave the weight
  // gradients to their own action; InvalidArgument (Unsupported) for actions or step
  // settings this stage cannot run.
  std::pair<int64_t, std::vector<bool>> checkActions(const std::vector<Action>& actions,
                                                     const StepInfo& info) const;
  // The step's update: every parameter's, or a sharded replica's rows and then the
  // broadcasts of every replica's.
  void optimizerStep();
  // `compute_s`: this replica's compute time this step, summed into result.replica_seconds
  // (negative: not asked for).
  void allreduceResult(StepResult& result, double compute_s);

  Model& model_;
  Backend& backend_;
  StageRange range_;
  Link *prev_, *next_;
  Optimizer* optimizer_;
  ExecutorOptions options_;
  // By microbatch of the current step and chunk.
  std::map<std::pair<int64_t, int>, InFlight> inflight_;
  int64_t tag_base_ = 0;                      // global number of this step's microbatch 0
  uint64_t collectives_ = 0;                  // tags of the replicas' collectives
  std::unique_ptr<GradientBuckets> buckets_;  // replicas that train
  std::vector<StateShard> shards_;            // zero > 0: the rows each replica keeps
  StageCounters counters_;
  std::vector<Span> spans_;
};

}  // namespace tandem
