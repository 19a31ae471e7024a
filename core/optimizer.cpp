#include "core/optimizer.h"

#include <cmath>

#include "core/error.h"

namespace tandem {

void validate(const OptimizerOptions& o) {
  TANDEM_CHECK_MSG(o.kind == "sgd" || o.kind == "adamw", InvalidArgument,
                   "optimizer '" << o.kind << "' is not one of sgd, adamw");
  TANDEM_CHECK_MSG(o.lr > 0.0f && std::isfinite(o.lr), InvalidArgument,
                   "learning rate " << o.lr << " must be a positive number");
  TANDEM_CHECK_MSG(o.momentum >= 0.0f && o.momentum < 1.0f, InvalidArgument,
                   "momentum " << o.momentum << " must be in [0, 1)");
  TANDEM_CHECK_MSG(!o.nesterov || o.momentum > 0.0f, InvalidArgument,
                   "nesterov needs a positive momentum");
  TANDEM_CHECK_MSG(o.weight_decay >= 0.0f && std::isfinite(o.weight_decay), InvalidArgument,
                   "weight decay " << o.weight_decay << " must be a number >= 0");
  TANDEM_CHECK_MSG(o.beta1 >= 0.0f && o.beta1 < 1.0f && o.beta2 >= 0.0f && o.beta2 < 1.0f,
                   InvalidArgument, "adamw betas must be in [0, 1)");
  TANDEM_CHECK_MSG(o.eps > 0.0f && std::isfinite(o.eps), InvalidArgument,
                   "adamw eps must be a positive number");
  TANDEM_CHECK_MSG(
      o.lr_schedule == "constant" || o.lr_schedule == "step" || o.lr_schedule == "cosine",
      InvalidArgument,
      "lr_schedule '" << o.lr_schedule << "' is not one of constant, step, cosine");
  TANDEM_CHECK_MSG(o.warmup_steps >= 0, InvalidArgument,
                   "warmup_steps " << o.warmup_steps << " must be >= 0");
  TANDEM_CHECK_MSG(o.lr_schedule == "constant" || o.decay_steps > 0, InvalidArgument,
                   "lr_schedule " << o.lr_schedule << " needs decay_steps > 0");
  TANDEM_CHECK_MSG(o.decay_steps >= 0, InvalidArgument,
                   "decay_steps " << o.decay_steps << " must be >= 0");
  TANDEM_CHECK_MSG(o.decay_factor > 0.0f && o.decay_factor <= 1.0f, InvalidArgument,
                   "decay_factor " << o.decay_factor << " must be in (0, 1]");
  TANDEM_CHECK_MSG(o.min_lr >= 0.0f && o.min_lr <= o.lr, InvalidArgument,
                   "min_lr " << o.min_lr << " must be in [0, lr]");
}

float learningRate(const OptimizerOptions& o, int64_t step) {
  if (step < o.warmup_steps)
    return static_cast<float>(double(o.lr) * double(step + 1) / double(o.warmup_steps));
  const int64_t t = step - o.warmup_steps;
  if (o.lr_schedule == "step")
    return static_cast<float>(double(o.lr) *
                              std::pow(double(o.decay_factor), double(t / o.decay_steps)));
  if (o.lr_schedule == "cosine") {
    const double done = double(std::min(t, o.decay_steps)) / double(o.decay_steps);
    return static_cast<float>(double(o.min_lr) + (double(o.lr) - double(o.min_lr)) * 0.5 *
                                                     (1.0 + std::cos(M_PI * done)));
  }
  return o.lr;
}

float linearlyScaledLr(float lr, int64_t batch, int64_t reference_batch) {
  TANDEM_CHECK_MSG(batch > 0 && reference_batch > 0, InvalidArgument,
                   "the linear scaling rule needs positive batches (batch "
                       << batch << ", reference " << reference_batch << ")");
  return static_cast<float>(double(lr) * double(batch) / double(reference_batch));
}

Optimizer::Optimizer(Backend& backend, const OptimizerOptions& options)
    : backend_(backend), options_(options) {
  validate(options_);
}

std::vector<Tensor>& Optimizer::slots(const Param& p) {
  auto& s = state_[p.name];
  if (s.empty()) {
    const int n = options_.kind == "adamw" ? 2 : (options_.momentum > 0.0f ? 1 : 0);
    for (int i = 0; i < n; ++i) s.push_back(backend_.zeros(p.value.shape()));
  }
  return s;
}

void Optimizer::step(const std::vector<Param*>& params) {
  const float lr = learningRate(options_, steps_);
  ++steps_;
  for (Param* p : params) {
    if (!p->grad.defined()) continue;  // int8 weights do not train
    auto& s = slots(*p);
    if (options_.kind == "adamw") {
      AdamWStep a{lr, options_.beta1, options_.beta2, options_.eps, options_.weight_decay, steps_};
      backend_.adamwStep(p->value, p->grad, s[0], s[1], a);
    } else {
      SgdStep g{lr, options_.momentum, options_.weight_decay, options_.nesterov};
      backend_.sgdStep(p->value, p->grad, s.empty() ? Tensor() : s[0], g);
    }
  }
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, slots] : state_) {
    if (options_.kind == "adamw") {
      out.emplace_back(name + ".m", slots[0]);
      out.emplace_back(name + ".v", slots[1]);
    } else if (!slots.empty()) {
      out.emplace_back(name + ".velocity", slots[0]);
    }
  }
  return out;
}

void Optimizer::restore(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) {
  TANDEM_CHECK_MSG(steps >= 0, InvalidArgument, "optimizer step count " << steps << " < 0");
  state_.clear();
  const std::vector<std::string> names = options_.kind == "adamw"
                                             ? std::vector<std::string>{".m", ".v"}
                                             : std::vector<std::string>{".velocity"};
  for (const auto& [key, tensor] : state) {
    bool matched = false;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& suffix = names[i];
      if (key.size() > suffix.size() &&
          key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) {
        auto& s = state_[key.substr(0, key.size() - suffix.size())];
        if (s.size() <= i) s.resize(names.size());
        s[i] = tensor;
        matched = true;
      }
    }
    TANDEM_CHECK_MSG(
        matched, FormatError,
        "optimizer state '" << key << "' does not belong to a " << options_.kind << " optimizer");
  }
  for (const auto& [name, s] : state_)
    for (const Tensor& t : s)
      TANDEM_CHECK_MSG(t.defined(), FormatError,
                       "optimizer state for '" << name << "' is incomplete");
  steps_ = steps;
}

}  // namespace tandem
