// The splits tandem is judged against (search.h), and the up-front check that every
// layer fits somewhere.
#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "partitioner/search.h"

namespace tandem::partitioner {

namespace {

// Stage ends from per-stage weights: stage s ends where the cumulative weight of the
// layers reaches the cumulative share of stages 0..s, each stage keeping at least one
// layer and leaving one for every later stage.
std::vector<size_t> endsByShare(const std::vector<double>& layer_weight,
                                const std::vector<double>& stage_share) {
  const size_t L = layer_weight.size(), p = stage_share.size();
  double total_w = 0, total_s = 0;
  for (double w : layer_weight) total_w += w;
  for (double s : stage_share) total_s += s;
  std::vector<size_t> ends;
  size_t l = 0;
  double acc_w = 0, acc_s = 0;
  for (size_t s = 0; s + 1 < p; ++s) {
    acc_s += stage_share[s];
    const double target = total_w * acc_s / total_s;
    size_t end = l + 1;
    acc_w += layer_weight[l];
    // Take the next layer while that brings the cumulative weight closer to the target.
    while (end < L - (p - s - 1) &&
           std::abs(acc_w + layer_weight[end] - target) < std::abs(acc_w - target)) {
      acc_w += layer_weight[end];
      ++end;
    }
    ends.push_back(end);
    l = end;
  }
  ends.push_back(L);
  return ends;
}

Plan fromEnds(const CostModel& cost, const std::vector<size_t>& ends, const std::string& name) {
  std::vector<Assignment> stages;
  size_t begin = 0;
  for (size_t s = 0; s < ends.size(); ++s) {
    stages.push_back({begin, ends[s], {static_cast<int>(s)}});
    begin = ends[s];
  }
  return evaluate(cost, stages, name);
}

}  // namespace

std::vector<Plan> baselinePlans(const CostModel& cost) {
  const Problem& problem = cost.problem();
  const size_t L = cost.layers(), p = std::min(problem.devices.size(), L);
  std::vector<double> ones(L, 1.0), params, equal(p, 1.0), memory;
  for (const LayerBytes& l : problem.layers) params.push_back(static_cast<double>(l.param_bytes));
  for (size_t d = 0; d < p; ++d)
    memory.push_back(static_cast<double>(problem.devices[d].memory_bytes));
  return {fromEnds(cost, endsByShare(ones, equal), "equal-layers"),
          fromEnds(cost, endsByShare(params, equal), "equal-params"),
          fromEnds(cost, endsByShare(ones, memory), "memory-proportional")};
}

void checkEveryLayerFits(const CostModel& cost) {
  const Problem& problem = cost.problem();
  int64_t largest = 0;
  std::string largest_name;
  for (const DeviceCosts& d : problem.devices)
    if (d.memory_bytes > largest) {
      largest = d.memory_bytes;
      largest_name = d.name;
    }
  for (size_t l = 0; l < cost.layers(); ++l) {
    bool somewhere = false;
    for (size_t t = 0; t < cost.types().size() && !somewhere; ++t)
      somewhere = cost.runs(static_cast<int>(t), l, l + 1);
    if (!somewhere) {
      std::ostringstream os;
      os << "no device can run layer " << l << " (" << problem.layers[l].type << "):";
      for (const DeviceCosts& d : problem.devices)
        os << (&d == &problem.devices.front() ? " " : "; ") << d.name << " "
           << (d.lacks.empty() ? std::string("runs it") : d.lacks[l]);
      throw InvalidArgument(os.str());
    }
    const int64_t need = cost.stateBytes(l, l + 1);
    if (need <= largest) continue;
    std::ostringstream os;
    os << "layer " << l << " (" << problem.layers[l].type << ") has "
       << problem.layers[l].param_bytes << " bytes of weights";
    if (cost.training()) os << ", " << need << " bytes with its gradients and optimizer state";
    os << ", but the largest device, " << largest_name << ", has " << largest << " bytes";
    throw InvalidArgument(os.str());
  }
}

std::string noSplitFits(const CostModel& cost, const std::string& algorithm) {
  const Problem& problem = cost.problem();
  int64_t have = 0;
  for (const DeviceCosts& d : problem.devices) have += d.memory_bytes;
  const size_t layers = cost.layers();
  std::ostringstream os;
  os << "the " << algorithm << " search found no split of the " << layers << " layers over the "
     << problem.devices.size() << " devices that fits in memory: the model needs more than "
     << cost.stateBytes(0, layers) << " bytes (its weights, " << cost.paramBytes(0, layers)
     << " bytes" << (cost.training() ? ", with their gradients and optimizer state" : "")
     << ", and each stage's activations), the devices have " << have << " in all";
  // Or the layers each device can run leave no contiguous split.
  for (const DeviceCosts& d : problem.devices) {
    std::string lacked;
    for (size_t l = 0; l < d.lacks.size(); ++l)
      if (!d.lacks[l].empty()) lacked += (lacked.empty() ? "" : ", ") + std::to_string(l);
    if (!lacked.empty()) os << "; " << d.name << " cannot run layers " << lacked;
  }
  return os.str();
}

}  // namespace tandem::partitioner
