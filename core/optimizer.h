// Optimizers: SGD (momentum, Nesterov, L2 weight decay) and AdamW (decoupled weight
// decay), with a learning-rate schedule: linear warm-up, then constant, step or cosine
// decay, a function of the update count alone — so the single-device trainer, data-parallel
// replicas and pipeline stages, each stepping its own Optimizer once per batch, apply the
// same rate at every step. State (velocity; first and second moments) is kept per
// parameter name so it can be saved in a model file and restored.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/layers/layer.h"

namespace tandem {

struct OptimizerOptions {
  std::string kind = "sgd";  // "sgd" or "adamw"
  float lr = 0.01f;
  float momentum = 0.9f;                            // sgd
  bool nesterov = false;                            // sgd
  float weight_decay = 0.0f;                        // sgd: L2; adamw: decoupled
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // adamw
  // The schedule (learningRate()): `warmup_steps` updates rising linearly to lr, then
  // "constant"; "step": lr * decay_factor^(k / decay_steps) after k more updates;
  // "cosine": from lr down to min_lr over decay_steps updates, min_lr after.
  std::string lr_schedule = "constant";
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;    // step, cosine
  float decay_factor = 0.1f;  // step
  float min_lr = 0.0f;        // cosine
  bool operator==(const OptimizerOptions&) const = default;
};

// The rate of update number `step` (0 for the first) under o's schedule.
float learningRate(const OptimizerOptions& o, int64_t step);

// The linear scaling rule (`lr_scale: linear`): lr * batch / reference_batch, for a
// global batch other than the one the rate was tuned at. InvalidArgument for a
// non-positive batch.
float linearlyScaledLr(float lr, int64_t batch, int64_t reference_batch);

// Checks ranges and the kind; throws InvalidArgument naming the bad field.
void validate(const OptimizerOptions& o);

class Optimizer {
 public:
  Optimizer(Backend& backend, const OptimizerOptions& options);

  const OptimizerOptions& options() const { return options_; }
  int64_t steps() const { return steps_; }
  // The rate the next step() applies.
  float currentLr() const { return learningRate(options_, steps_); }
  // One update of every parameter from its accumulated gradient.
  void step(const std::vector<Param*>& params);

  // State tensors named "<param>.<slot>" (slots: velocity | m, v), for model files.
  std::vector<std::pair<std::string, Tensor>> state() const;
  // Restores state saved by state(); `steps` is the update count it was saved at.
  void restore(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps);

 private:
  std::vector<Tensor>& slots(const Param& p);

  Backend& backend_;
  OptimizerOptions options_;
  int64_t steps_ = 0;
  std::map<std::string, std::vector<Tensor>> state_;  // by parameter name
};

}  // namespace tandem
