// Single-device training and evaluation of a classifier, or of a language model (a label
// per token), on a Dataset.
//
// A step: clear gradients; per microbatch (one unless TrainOptions::microbatches): upload,
// forward, softmax cross-entropy (scaled to the whole batch's mean), backward
// (accumulating); then one optimizer step. Dropout draws from (seed, global step,
// microbatch), so two runs with the same seed produce bitwise the same weights.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/data/dataset.h"
#include "core/model.h"
#include "core/optimizer.h"

namespace tandem {

struct TrainOptions {
  int64_t batch = 64;
  uint64_t seed = 1;
  bool shuffle = true;
  // Gradient accumulation: each batch runs as this many microbatches (splitBatch), their
  // gradients summed before one optimizer step — what a pipeline computes.
  int64_t microbatches = 1;
  // Cut as a pipeline with unequal replicas cuts them (PipelineOptions::microbatch_shares):
  // microbatch g, counted over every step, in proportion to microbatch_shares[g mod R].
  std::vector<double> microbatch_shares = {};
};

struct StepReport {
  int64_t epoch = 0;
  int64_t step = 0, steps = 0;  // within the epoch, 1-based
  double loss = 0;              // running mean over the epoch so far
  double samples_per_s = 0;
  double elapsed_s = 0;
};

struct EvalResult {
  double loss = 0;      // mean per label: per sample, or per token for a language model
  double accuracy = 0;  // of the labels (tokens) predicted as the largest logit
  int64_t samples = 0;
};

struct EpochReport {
  int64_t epoch = 0;
  double train_loss = 0;
  double seconds = 0;
  double samples_per_s = 0;
};

class Trainer {
 public:
  Trainer(Model& model, Optimizer& optimizer, const TrainOptions& options);

  // One step on a host batch of n samples; returns the batch's mean loss.
  double step(const float* x, const int32_t* labels, int64_t n);
  // One pass over `data`; `progress` (may be empty) is called after every step.
  EpochReport trainEpoch(const Dataset& data, int64_t epoch,
                         const std::function<void(const StepReport&)>& progress);
  int64_t globalStep() const { return global_step_; }

 private:
  Model& model_;
  Optimizer& optimizer_;
  TrainOptions options_;
  int64_t global_step_ = 0;
  int64_t microbatches_run_ = 0;  // over every step (microbatch_shares)
};

// One epoch's loop over `samples` samples in batches of `batch`: `step(begin, n)` trains
// samples [begin, begin + n) of the epoch's order and returns their summed loss;
// `progress` (may be empty) hears after every step. Shared by Trainer and a pipeline's
// stages.
// `first_step` > 0 resumes the epoch there (the steps before it were taken elsewhere,
// e.g. before a checkpoint); the report covers the steps run here.
EpochReport runEpoch(int64_t epoch, int64_t samples, int64_t batch,
                     const std::function<double(int64_t begin, int64_t n)>& step,
                     const std::function<void(const StepReport&)>& progress,
                     int64_t first_step = 0);

// InvalidArgument unless `model` maps the data's samples to its classes.
void checkClassifier(const Model& model, const Dataset& data);

// The vocab of the model's first layer when it is an embedding (token ids in [0, vocab)),
// else 0.
int64_t inputVocab(const Model& model);
// Labels per sample the model's output takes: 1 for a classifier's [classes], T for a
// language model's [T, vocab] (a label per token).
int64_t labelsPerSample(const Model& model);
// n samples of x (floats, as gatherBatch gives them) as a tensor on `backend` in the
// model's input dtype: token ids become i32.
Tensor uploadSamples(Backend& backend, const Model& model, const float* x, int64_t n);

// One epoch over `data` in batches of `batch` (shuffled by (seed, epoch) if asked):
// step(order, begin, n) trains samples order[begin, begin + n) of the data (gathering
// them as it likes) and returns their mean loss. InvalidArgument if `model` does not map
// the data's samples to its classes. Shared by Trainer and DataParallelTrainer.
EpochReport datasetEpoch(
    const Model& model, const Dataset& data, int64_t epoch, int64_t batch, bool shuffle,
    uint64_t seed,
    const std::function<double(const std::vector<int64_t>& order, int64_t begin, int64_t n)>& step,
    const std::function<void(const StepReport&)>& progress);

// Forward-only pass over `data` in batches: mean loss and accuracy.
EvalResult evaluate(Model& model, const Dataset& data, int64_t batch);

}  // namespace tandem
