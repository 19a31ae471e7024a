// StageTrainer: one pipeline stage's side of training and evaluation over a dataset —
// the loop of steps around a StageExecutor. Every stage runs the same loop; only the
// first reads samples (it is given the Dataset), and only the last sees the loss. The
// stages agree on the steps because they share the options and the sample count.
//
// With the same seed, batch and microbatches, the weights after any number of steps are
// bitwise those of Trainer with TrainOptions::microbatches (single-device gradient
// accumulation) when activations and gradients travel as fp32.
#pragma once

#include <chrono>
#include <functional>

#include "core/data/dataset.h"
#include "core/pipeline/executor.h"
#include "core/train/microbatch.h"
#include "core/train/trainer.h"

namespace tandem {

struct PipelineOptions {
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int64_t microbatches = 4;
  int64_t batch = 64;
  uint64_t seed = 1;
  bool shuffle = true;
  bool recompute = false;
  bool record_spans = false;
  Group* replicas = nullptr;  // this stage's replicas (executor.h); null: one
  // Unequal replicas: how the first stage cuts each batch, microbatch g (global) in
  // proportion to microbatch_shares[g mod R] (splitBatch, microbatch.h), R the replicated
  // stage's replica count; empty: sizes that differ by at most one.
  std::vector<double> microbatch_shares;
  // Replicas of the whole model (a stage that is first and last) on devices of unequal or
  // unknown speed: this run's training steps 1 to rebalance_steps (its step 0 warms up)
  // each measure the replicas under the given shares (measuredShares: each replica's
  // samples over its time in forward and backward, which the replicas' sums of the loss
  // carry, so every replica reads the same), and after the last of them the shares become
  // the steps' median (medianShares) and stay. Once: a step in which a replica's
  // microbatches grow runs far longer than its others (docs/pipeline.md), which a step
  // measuring it would take for the replica's speed. 0: the shares stay.
  int64_t rebalance_steps = 0;
  std::chrono::milliseconds collective_timeout{60000};
  size_t bucket_bytes = size_t{1} << 20;  // replicas: gradient bytes per allreduce
  int zero = 0;  // replicas: ZeRO stage of their training state (ExecutorOptions::zero)
  std::vector<double> state_shares;  // ... and each replica's room for its shards
};

// One request's answer in an evaluation stream (StageTrainer::evaluate): a microbatch
// of the test samples, from sample `first`, as the last stage computed it.
struct EvalAnswer {
  int64_t first = 0, count = 0, columns = 0;
  std::vector<float> outputs;  // count rows of `columns` (the model's output)
  double loss_sum = 0;         // the rows' summed loss
  int64_t correct = 0;         // rows whose largest output is the label
};

// How evaluate streams its samples when serving (`tandem infer`).
struct EvalStream {
  // The first sample, a multiple of the batch: a stream resumed after a failure starts
  // at the batch of its first unanswered request, so every request is the same
  // microbatch of the same batch as in an uninterrupted stream.
  int64_t from = 0;
  // The first stage feeds one request (microbatch) every `interval` (open loop: a late
  // request goes at once); zero: as fast as the pipeline takes them.
  std::chrono::microseconds interval{0};
  // Called on the last stage (each replica: its own requests) with every answer.
  std::function<void(const EvalAnswer&)> answer;
};

class StageTrainer {
 public:
  StageTrainer(Model& model, StageRange range, Link* prev, Link* next, Optimizer* optimizer,
               const PipelineOptions& options);

  // One pass over `samples` samples (all of `data` on the first stage, which alone gets
  // it; null elsewhere). The loss in the report and in progress is the last stage's.
  // `first_step` > 0 resumes the epoch at that step (see resumeAt).
  EpochReport trainEpoch(const Dataset* data, int64_t samples, int64_t epoch,
                         const std::function<void(const StepReport&)>& progress,
                         int64_t first_step = 0);
  // A run resumed from a checkpoint: `steps` training steps were already taken (they
  // number the steps, which seed dropout; the shuffle is by epoch).
  void resumeAt(int64_t steps) { global_step_ = steps; }
  int64_t stepsTaken() const { return global_step_; }
  // Forward-only over `samples` test samples in batches of `batch`: the last stage's
  // mean loss and accuracy (zero elsewhere) over the samples from stream.from.
  EvalResult evaluate(const Dataset* data, int64_t samples, int64_t batch,
                      const EvalStream& stream = {});

  StageExecutor& executor() { return executor_; }
  // The replicas' shares of each batch now (PipelineOptions::microbatch_shares, as
  // rebalancing left them; empty: equal).
  const std::vector<double>& shares() const { return options_.microbatch_shares; }
  // Whether shares() stays for the rest of the run: no rebalancing asked, or it is done.
  // (A checkpoint carries such shares, so that a run resumed from it cuts its batches as
  // the uninterrupted one does.)
  bool sharesSettled() const { return steps_run_ > options_.rebalance_steps; }

 private:
  // The global number of the next step's microbatch 0 (StepInfo::first_microbatch): a
  // training step's from its global step, an evaluation's from 2^49 on.
  int64_t firstMicrobatch(bool training) const;
  // The next step's microbatches of an n-sample batch.
  std::vector<MicrobatchSlice> slices(int64_t n, bool training) const;
  // Runs one step of `n` samples starting at `begin` of `order`, cut into `slices`
  // (`outputs`: the last stage keeps each microbatch's output).
  StepResult step(const Dataset* data, const std::vector<int64_t>& order, int64_t begin, int64_t n,
                  const std::vector<MicrobatchSlice>& slices, ScheduleKind kind, bool training,
                  bool outputs, bool replica_seconds = false);
  // Whether the next training step measures the replicas (rebalance_steps).
  bool rebalances() const;

  Model& model_;
  StageRange range_;
  PipelineOptions options_;
  StageExecutor executor_;
  int64_t global_step_ = 0;
  int64_t steps_run_ = 0;                      // training steps this trainer took (rebalance_steps)
  int64_t eval_microbatches_ = 0;              // evaluated so far (numbered apart: firstMicrobatch)
  std::vector<std::vector<double>> measured_;  // each measured step's shares (rebalancing)
  std::vector<float> x_;                       // the first stage's host batch
  // Evaluation streams: when the first stage feeds its next request (interval_ > 0).
  std::chrono::microseconds interval_{0};
  std::chrono::steady_clock::time_point next_feed_;
  std::vector<int32_t> y_;
};

}  // namespace tandem
