// What a JobRun writes — checkpoints (merged from the stages' slices) and the saved model
// — and what a checkpoint's replicas' shares carry into a resumed placement.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "backends/cpu/cpu_backend.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "runtime/control/files.h"
#include "runtime/job/job_run.h"

namespace tandem::runtime {

std::vector<std::string> JobRun::replicaNodes() const {
  std::vector<std::string> nodes;
  if (stages_.size() != 1 || stages_[0].replicas < 2 || node_of_.size() != assignments_.size())
    return nodes;
  for (const Assign& a : assignments_)  // (one stage: slot = replica)
    nodes.push_back(
        cluster_.nodes.at(static_cast<size_t>(node_of_.at(static_cast<size_t>(a.replica)))).name);
  return nodes;
}

void JobRun::carryShares() {
  const CheckpointShares& c = resume_replicas_;
  if (c.shares.empty() || start_step_ == 0 || options_.mode != RunMode::kTrain) return;
  const std::vector<std::string> nodes = replicaNodes();
  auto list = [](const auto& v) {
    std::string out;
    for (const auto& x : v) out += (out.empty() ? "" : ", ") + fmt::format("{}", x);
    return out;
  };
  if (nodes != c.nodes) {
    spdlog::info("the checkpoint at step {} carries the shares of replicas on {}; {}", start_step_,
                 list(c.nodes),
                 nodes.empty() ? "this run has no replicas of the whole model"
                               : "this run's are on " + list(nodes) + ": the plan's shares");
    return;
  }
  for (Assign& a : assignments_) {
    a.train.microbatch_shares = c.shares;
    a.train.rebalance_steps = 0;
  }
  shares_carried_ = true;
  spdlog::info("replicas' shares from the checkpoint at step {}: {} (on {})", start_step_,
               list(c.shares), list(c.nodes));
}

void JobRun::checkpoint(int64_t step, const std::vector<std::vector<uint8_t>>& slices,
                        const std::vector<double>& shares) {
  const auto t0 = std::chrono::steady_clock::now();
  auto model = std::make_shared<const std::vector<uint8_t>>(merge(slices));
  CheckpointShares replicas;
  if (!shares.empty()) {
    replicas.nodes = replicaNodes();
    if (replicas.nodes.size() == shares.size())
      replicas.shares = shares;
    else
      replicas.nodes.clear();  // (forked workers: no nodes to name)
  }
  writeCheckpoint(job_.checkpoint.dir, step, *model, checkpointJob(job_, model_spec_),
                  job_.checkpoint.keep, replicas);
  resume_weights_ = model;
  resume_step_ = step;
  resume_replicas_ = std::move(replicas);
  char name[32];
  std::snprintf(name, sizeof name, "step-%012lld.tdm", static_cast<long long>(step));
  last_checkpoint_ = (std::filesystem::path(job_.checkpoint.dir) / name).string();
  spdlog::info("checkpoint at step {}: {} ({:.1f} MB, {:.3f} s)", step, last_checkpoint_,
               static_cast<double>(model->size()) / 1e6,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  offerRejoin(step);
}

std::vector<uint8_t> JobRun::merge(const std::vector<std::vector<uint8_t>>& slices) const {
  cpu::CpuBackend be;
  Model model(parseModelSpec(model_spec_, job_.model));
  model.build(be, job_.train.seed);
  std::vector<std::pair<std::string, Tensor>> state;
  int64_t steps = 0;
  ModelFile all;
  for (size_t i = 0; i < slices.size(); ++i) {
    if (slices[i].empty()) continue;
    const ModelFile f = parseModelFile(slices[i], names_[i] + "'s trained slice");
    all.params.insert(all.params.end(), f.params.begin(), f.params.end());
    if (f.optimizer) {
      steps = f.optimizer->steps;
      for (const HostTensor& t : f.optimizer->tensors)
        state.push_back({t.name, toDevice(be, t.shape, t.data)});
    }
  }
  loadWeights(model, all, true);  // every parameter, from exactly one stage
  Optimizer optimizer(be, job_.train.optimizer);
  optimizer.restore(state, steps);
  return serializeModel(model, &optimizer, {{"seed", static_cast<int64_t>(job_.train.seed)}});
}

void JobRun::save(const RunResult& result) const {
  writeFileAtomically(job_.save, merge(result.slices), 0666);
}

}  // namespace tandem::runtime
