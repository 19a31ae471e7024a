// StageTrainer: one pipeline stage's side of training and evaluation over a dataset —
// the loop of steps around a StageExecutor. Every stage runs the same loop; only the
// first reads samples (it is given the Dataset), and only the last sees the loss. The
// stages agree on the steps because they share the options and the sample count.
//
// With the same seed, batch and microbatches, the weights after any number of steps are
// bitwise those of Trainer with TrainOptions::microbatches (single-device gradient
// accumulation) when activations and gradients travel as fp32.
#pragma once

#include <functional>

#include "core/data/dataset.h"
#include "core/pipeline/executor.h"
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
  std::chrono::milliseconds collective_timeout{60000};
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
  // mean loss and accuracy (zero elsewhere).
  EvalResult evaluate(const Dataset* data, int64_t samples, int64_t batch);

  StageExecutor& executor() { return executor_; }

 private:
  // Runs one step of `n` samples starting at `begin` of `order`.
  StepResult step(const Dataset* data, const std::vector<int64_t>& order, int64_t begin, int64_t n,
                  ScheduleKind kind, bool training);

  Model& model_;
  StageRange range_;
  PipelineOptions options_;
  StageExecutor executor_;
  int64_t global_step_ = 0;
  std::vector<float> x_;  // the first stage's host batch
  std::vector<int32_t> y_;
};

}  // namespace tandem
