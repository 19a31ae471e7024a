// The cost model's tensor-split stages (cost_model.h, "A tensor-split stage"): what a split
// makes of a range's layers, the group's all-reduces, a split stage's ranks' parts.
#include "partitioner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace tandem::partitioner {

std::vector<TensorKind> CostModel::tensorRoles(size_t begin, size_t end) const {
  const auto& all = problem_.tensor_roles;
  if (all.empty()) return std::vector<TensorKind>(end - begin, TensorKind::kWhole);
  const std::vector<TensorKind>& from = all[begin];
  std::vector<TensorKind> roles(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(end - begin));
  // A pair whose row layer lies past the range stays whole, with what lies between.
  for (size_t i = 0; i < roles.size(); ++i) {
    if (roles[i] != TensorKind::kColumn) continue;
    size_t j = i + 1;
    while (j < from.size() && from[j] != TensorKind::kRow) ++j;
    if (j < roles.size()) {
      i = j;
      continue;
    }
    for (size_t k = i; k < roles.size(); ++k) roles[k] = TensorKind::kWhole;
    break;
  }
  return roles;
}

bool CostModel::tensorSplits(size_t begin, size_t end) const {
  const std::vector<TensorKind> roles = tensorRoles(begin, end);
  return std::any_of(roles.begin(), roles.end(),
                     [](TensorKind k) { return k != TensorKind::kWhole; });
}

double CostModel::groupAllreduce(int node, double bytes, int ranks) const {
  const auto& m = problem_.node_group_allreduce;
  const double k = ranks;
  if (!m.empty() && m[static_cast<size_t>(node)].measured()) {
    const GroupAllreduceCost& g = m[static_cast<size_t>(node)];
    return g.fixed_s * (k - 1) + g.per_byte_s * bytes;
  }
  const LinkCosts& l = problem_.links[static_cast<size_t>(node)][static_cast<size_t>(node)];
  return 2 * (k - 1) / k * bytes / l.bandwidth + 2 * (k - 1) * l.latency_s;
}

CostModel::TensorStage CostModel::tensorStage(const std::vector<int>& types,
                                              const std::vector<double>& shares, size_t begin,
                                              size_t end) const {
  const auto k = static_cast<int>(types.size());
  std::vector<double> part(types.size(), 1.0 / k);  // each rank's share of the features
  if (!shares.empty()) {
    double total = 0;
    for (const double x : shares) total += x;
    for (size_t r = 0; r < types.size(); ++r) part[r] = total > 0 ? shares[r] / total : 0;
  }
  const int node = types_[static_cast<size_t>(types.front())].node;
  const std::vector<TensorKind> roles = tensorRoles(begin, end);
  // The first stage runs no backward below its first layer with parameters and that one
  // without the input gradient (CostModel::backward).
  const bool first = begin == 0 && first_param_ < layers();
  TensorStage t;
  int64_t split_params = 0, whole_params = 0;
  for (size_t l = begin; l < end; ++l) {
    const TensorKind kind = roles[l - begin];
    const LayerBytes& bytes = problem_.layers[l];
    const bool split = kind != TensorKind::kWhole;
    const bool below = first && l < first_param_, lowest = first && l == first_param_;
    // The layer's slowest rank: its part of the layer (whole, or its share) on its device.
    double forward = 0, backward = 0, weight = 0;
    for (size_t r = 0; r < types.size(); ++r) {
      const DeviceCosts& d = deviceOf(types[r]);
      const double share = split ? part[r] : 1.0;
      const double back = below    ? 0
                          : lowest ? first_backward_[static_cast<size_t>(types[r])]
                                   : d.backward_s[l];
      const double of_weights = lowest ? 1.0 : bytes.param_bytes > 0 ? 0.5 : 0.0;
      forward = std::max(forward, d.forward_s[l] * share);
      backward = std::max(backward, back * share);
      weight = std::max(weight, of_weights * back * share);
    }
    t.forward += forward;
    t.backward += backward;
    t.weight += weight;
    if (lowest) t.first_weight = weight;
    const bool input_gradient = !(below || lowest);
    const auto out = static_cast<double>(bytes.output_bytes);
    if (kind == TensorKind::kRow) t.allreduce_forward += groupAllreduce(node, out, k);
    if (kind == TensorKind::kColumn && input_gradient)
      t.allreduce_backward += groupAllreduce(node, static_cast<double>(inputBytes(l)), k);
    if (kind == TensorKind::kBlock) {
      const double each = bytes.tensor_allreduces * groupAllreduce(node, out, k);
      t.allreduce_forward += each;
      if (input_gradient) t.allreduce_backward += each;
    }
    (split ? split_params : whole_params) += bytes.param_bytes;
    t.splits = t.splits || split;
  }
  t.forward += t.allreduce_forward;
  t.backward += t.allreduce_backward;
  t.split_state = stateBytesOf(split_params);
  if (training())
    for (size_t r = 0; r < types.size(); ++r)
      t.update = std::max(t.update, (static_cast<double>(whole_params) +
                                     part[r] * static_cast<double>(split_params)) *
                                        deviceOf(types[r]).update_s_per_param_byte);
  return t;
}

CostModel::TensorStage CostModel::equalTensor(int type, size_t begin, size_t end,
                                              int tensor) const {
  return tensorStage(std::vector<int>(static_cast<size_t>(tensor), type), {}, begin, end);
}

std::vector<double> CostModel::balancedTensorShares(const std::vector<int>& types, size_t begin,
                                                    size_t end) const {
  const std::vector<TensorKind> roles = tensorRoles(begin, end);
  std::vector<double> shares;
  for (const int type : types) {
    const DeviceCosts& d = deviceOf(type);
    double split = 0;
    for (size_t l = begin; l < end; ++l)
      if (roles[l - begin] != TensorKind::kWhole)
        split += d.forward_s[l] + (training() ? d.backward_s[l] : 0);
    shares.push_back(split > 0 && std::isfinite(split) ? 1 / split : 0);
  }
  const double largest = *std::max_element(shares.begin(), shares.end());
  for (double& x : shares) x = largest > 0 ? x / largest : 1;  // the fastest's is 1
  return shares;
}

double CostModel::tensorAllreduce(int type, size_t begin, size_t end, int tensor) const {
  const TensorStage t = equalTensor(type, begin, end, tensor);
  return t.allreduce_forward + (training() ? t.allreduce_backward : 0);
}

}  // namespace tandem::partitioner
