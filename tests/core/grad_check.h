// GradCheck: the finite-difference gradient check of one layer (layers_test.cpp and
// block_layers_test.cpp), and inputs that keep it away from kinks.
//
// Method: L = sum_i w_i * y_i with fixed random w, accumulated in double from the f32
// forward output; the numerical derivative is (L(v + h) - L(v - h)) / 2h in double with
// h = 1e-2. Bound: |analytic - numeric| <= 2e-3 * max(1, |numeric|). The f32 forward
// rounding contributes about 1e-6 / h = 1e-4 and the O(h^2) truncation about 1e-4 for
// these smooth, O(1) inputs, so the bound has ~10x headroom while any real mistake in a
// backward (a missing term, a wrong index) is off by O(1).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/layers/registry.h"
#include "core/model_spec.h"
#include "tests/test_util.h"

namespace tandem::testing {

inline constexpr double kStep = 1e-2;
inline constexpr double kTolerance = 2e-3;

class GradCheck {
 public:
  GradCheck(const std::string& yaml_layer, const Shape& input, uint64_t seed = 1)
      : be_(cpu::CpuOptions{2}) {
    LayerSpec spec = parseModelSpec("input: [1]\nlayers:\n  - " + yaml_layer + "\n").layers.at(0);
    layer_ = makeLayer(spec);
    layer_->setup(input.dropFirst());
    Rng rng(seed);
    layer_->build(be_, rng);
    input_shape_ = input;
  }

  // Checks d L / d input (inputs from `x`) and d L / d every parameter.
  void run(const std::vector<float>& x, bool check_input = true) {
    const Shape out = layer_->outputShape().withBatch(input_shape_[0]);
    weights_ = randomVector(99, out.numel());
    // Analytic gradients.
    for (Param* p : layer_->params())
      if (p->grad.defined()) be_.fill(p->grad, 0.0f);  // (running statistics have none)
    Stash stash;
    Tensor y = layer_->forward(toDevice(be_, input_shape_, x), stash, ctx_);
    ASSERT_EQ(y.shape(), out);
    Tensor dx = layer_->backward(toDevice(be_, out, weights_), stash, check_input);
    if (check_input) {
      const auto analytic = toHost(dx);
      std::vector<float> probe = x;
      compare("input", analytic, [&](size_t i, double delta) {
        probe[i] = static_cast<float>(x[i] + delta);
        const double l = loss(toDevice(be_, input_shape_, probe));
        probe[i] = x[i];
        return l;
      });
    }
    for (Param* p : layer_->params()) {
      if (!p->grad.defined()) continue;
      const auto analytic = toHost(p->grad);
      const auto original = toHost(p->value);
      std::vector<float> probe = original;
      compare(p->name, analytic, [&](size_t i, double delta) {
        probe[i] = static_cast<float>(original[i] + delta);
        be_.upload(p->value, probe.data());
        const double l = loss(toDevice(be_, input_shape_, x));
        probe[i] = original[i];
        be_.upload(p->value, probe.data());
        return l;
      });
    }
  }

  Layer& layer() { return *layer_; }
  cpu::CpuBackend& backend() { return be_; }

 private:
  double loss(const Tensor& x) {
    Stash stash;
    const auto y = toHost(layer_->forward(x, stash, ctx_));
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += static_cast<double>(weights_[i]) * y[i];
    return l;
  }

  // Checks up to ~40 evenly spread elements so large parameters stay fast.
  void compare(const std::string& what, const std::vector<float>& analytic,
               const std::function<double(size_t, double)>& loss_at) {
    ASSERT_FALSE(analytic.empty()) << what;
    const size_t stride = std::max<size_t>(1, analytic.size() / 40);
    for (size_t i = 0; i < analytic.size(); i += stride) {
      const double numeric = (loss_at(i, kStep) - loss_at(i, -kStep)) / (2 * kStep);
      EXPECT_NEAR(analytic[i], numeric, kTolerance * std::max(1.0, std::abs(numeric)))
          << layer_->type() << " d/d " << what << "[" << i << "]";
    }
  }

  cpu::CpuBackend be_;
  std::unique_ptr<Layer> layer_;
  Shape input_shape_;
  std::vector<float> weights_;
  ForwardContext ctx_{true, 77};
};

// Values whose magnitude stays >= 0.1 (> h) so kinks at zero are never straddled.
inline std::vector<float> awayFromZero(uint64_t seed, int64_t n) {
  auto v = randomVector(seed, n, 0.1f, 1.0f);
  Rng rng(seed + 1);
  for (float& x : v)
    if (rng.below(2)) x = -x;
  return v;
}

// Distinct values spaced 0.05 apart (> 2h) in random order, so a max never changes winner.
inline std::vector<float> distinctValues(uint64_t seed, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = -1.0f + 0.05f * static_cast<float>(i);
  Rng rng(seed);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(v[static_cast<size_t>(i)], v[rng.below(static_cast<uint64_t>(i + 1))]);
  return v;
}

}  // namespace tandem::testing
