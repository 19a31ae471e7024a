// Optimizers: SGD (momentum, Nesterov, L2 weight decay) and AdamW (decoupled weight
// decay). State (velocity; first and second moments) is kept per parameter name so it
// can be saved in a model file and restored.
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
  bool operator==(const OptimizerOptions&) const = default;
};

// Checks ranges and the kind; throws InvalidArgument naming the bad field.
void validate(const OptimizerOptions& o);

class Optimizer {
 public:
  Optimizer(Backend& backend, const OptimizerOptions& options);

  const OptimizerOptions& options() const { return options_; }
  int64_t steps() const { return steps_; }
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
