#include "partitioner/random_problem.h"

#include <algorithm>
#include <random>

#include "partitioner/cost_model.h"

namespace tandem::partitioner {

Problem randomProblem(const RandomProblemOptions& o) {
  std::mt19937_64 rng(o.seed);
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  Problem p;
  p.options = o.cost;
  const auto L = static_cast<size_t>(o.layers);
  p.input_bytes = static_cast<int64_t>(uniform(1e3, 1e6));
  std::vector<double> work(L);  // forward seconds on a unit-speed device
  for (size_t l = 0; l < L; ++l) {
    LayerBytes b;
    b.type = "layer" + std::to_string(l);
    // Some layers are all weights (classifiers), some all activations (convolutions).
    b.param_bytes = static_cast<int64_t>(uniform(0, 1) < 0.3 ? 0 : uniform(1e3, 4e6));
    b.output_bytes = static_cast<int64_t>(uniform(1e3, 2e6));
    b.stash_bytes =
        l == 0 ? p.input_bytes : p.layers[l - 1].output_bytes;  // its input, as a linear layer
    work[l] = uniform(1e-4, 5e-3);
    p.layers.push_back(b);
  }

  struct Kind {
    double speed, memory;
    std::vector<double> skew;  // per layer: devices differ in what they are good at
  };
  std::vector<Kind> kinds;
  for (int k = 0; k < o.kinds; ++k) {
    Kind kind{uniform(0.25, 4.0), uniform(o.memory_min, o.memory_max), {}};
    for (size_t l = 0; l < L; ++l) kind.skew.push_back(uniform(0.7, 1.4));
    kinds.push_back(std::move(kind));
  }
  for (int n = 0; n < o.nodes; ++n) p.node_names.push_back("node" + std::to_string(n));
  p.links.assign(static_cast<size_t>(o.nodes),
                 std::vector<LinkCosts>(static_cast<size_t>(o.nodes)));
  for (int a = 0; a < o.nodes; ++a)
    for (int b = 0; b < o.nodes; ++b)
      p.links[static_cast<size_t>(a)][static_cast<size_t>(b)] =
          a == b ? LinkCosts{uniform(2e9, 1e10), uniform(1e-6, 2e-5)}
                 : LinkCosts{uniform(1e7, 2e9), uniform(5e-5, 3e-3)};
  // What the whole model needs alone on one device: the unit for device memory.
  Problem one = p;
  one.devices.push_back(
      {"probe", 0, int64_t{1} << 60, std::vector<double>(L, 0), std::vector<double>(L, 0)});
  const auto whole = static_cast<double>(CostModel(one).memory(0, L, 1, 1));
  for (int d = 0; d < o.devices; ++d) {
    const Kind& k = kinds[static_cast<size_t>(d % o.kinds)];
    DeviceCosts dev;
    dev.node = d % o.nodes;
    dev.name = p.node_names[static_cast<size_t>(dev.node)] + "/dev" + std::to_string(d);
    dev.memory_bytes = std::max<int64_t>(1, static_cast<int64_t>(k.memory * whole));
    for (size_t l = 0; l < L; ++l) {
      dev.forward_s.push_back(work[l] * k.skew[l] / k.speed);
      dev.backward_s.push_back(2 * work[l] * k.skew[l] / k.speed);
    }
    p.devices.push_back(std::move(dev));
  }
  return p;
}

}  // namespace tandem::partitioner
