#include "runtime/worker/tensor_ranks.h"

#include <fmt/format.h>

#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"
#include "core/error.h"
#include "core/layers/tensor_split.h"
#include "core/train/tensor_parallel.h"
#include "transport/local_group.h"

namespace tandem::runtime {

TensorRanks::TensorRanks(const ModelSpec& spec, const Assign& a, int threads, Model& rank0,
                         const std::string& who)
    : spec_(spec),
      layers_{a.slice.layers},
      optimizer_options_(a.train.optimizer),
      shares_(a.slice.tensor_shares),
      rank0_(&rank0) {
  const int ranks = a.slice.tensor;
  if (shares_.empty()) shares_.assign(static_cast<size_t>(ranks), 1.0);
  groups_ = transport::makeLocalGroup(ranks);
  const auto [begin, end] = a.slice.layers;
  try {
    roles_ = rank0.splitForTensor(begin, end, *groups_[0], shares_);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(who + ", split over " + std::to_string(ranks) +
                          " tensor ranks: " + e.what());
  }
  for (int r = 1; r < ranks; ++r) {
    const std::string& device = a.slice.tensor_devices.empty()
                                    ? a.slice.device
                                    : a.slice.tensor_devices.at(static_cast<size_t>(r));
    backends_.push_back(makeBackend(device, BackendOptions{threads}));
    models_.push_back(std::make_unique<Model>(spec));
    models_.back()->splitForTensor(begin, end, *groups_[static_cast<size_t>(r)], shares_);
    models_.back()->build(*backends_.back(), a.train.seed, layers_);
    optimizers_.push_back(std::make_unique<Optimizer>(*backends_.back(), a.train.optimizer));
  }
}

TensorRanks::~TensorRanks() = default;

void TensorRanks::setRank0(Optimizer& optimizer) { optimizer0_ = &optimizer; }

void TensorRanks::startFrom(const ModelFile& file, bool restore_optimizer, const std::string& who) {
  cpu::CpuBackend host(cpu::CpuOptions{1});
  Model whole(spec_);
  whole.build(host, 0, layers_);
  loadWeights(whole, file, false);
  std::optional<Optimizer> whole_optimizer;
  if (restore_optimizer) {
    whole_optimizer.emplace(host, optimizer_options_);
    restoreOptimizerState(*whole_optimizer, whole, file, who);
  }
  for (const TensorStage::Rank& r : parts()) {
    copyIntoPart(whole, *r.model);
    if (whole_optimizer)
      r.optimizer->restore(partOfState(*r.model, whole_optimizer->state()),
                           whole_optimizer->steps());
  }
}

std::vector<TensorStage::Rank> TensorRanks::parts() const {
  TANDEM_CHECK_MSG(optimizer0_ != nullptr, InvalidArgument, "tensor ranks: rank 0 not set");
  std::vector<TensorStage::Rank> out{{rank0_, optimizer0_, groups_[0].get()}};
  for (size_t r = 0; r < models_.size(); ++r)
    out.push_back({models_[r].get(), optimizers_[r].get(), groups_[r + 1].get()});
  return out;
}

std::vector<uint8_t> TensorRanks::mergedSlice() const {
  std::vector<const Model*> models;
  std::vector<const Optimizer*> optimizers;
  for (const TensorStage::Rank& r : parts()) {
    models.push_back(r.model);
    optimizers.push_back(r.optimizer);
  }
  cpu::CpuBackend host(cpu::CpuOptions{1});
  const TensorParts merged =
      mergeTensorParts(spec_, layers_, models, optimizers, host, optimizer_options_);
  return serializeModel(*merged.model, merged.optimizer.get(), {});
}

int64_t TensorRanks::peakTensorBytes() const {
  int64_t sum = 0;
  for (const auto& b : backends_) {
    const int64_t peak = b->memoryUse().peak;
    if (peak < 0) return -1;
    sum += peak;
  }
  return sum;
}

std::string TensorRanks::describe() const {
  return fmt::format("{} tensor ranks (feature shares {:.3g}): {}", groups_.size(),
                     fmt::join(shares_, " : "), tandem::describe(Sequence(spec_.layers), roles_));
}

}  // namespace tandem::runtime
