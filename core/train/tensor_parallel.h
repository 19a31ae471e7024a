// Tensor-parallel training on one node: R ranks, each a thread driving its own backend
// with its slice of every split layer (core/layers/tensor_split.h: linear and convolution
// pairs, attention heads and MLP features cut by shares, e.g. in proportion to the
// devices' speeds), the rest of the model whole on every rank. Every rank trains on the same
// batches in the same order (a Trainer each, same seed): the split layers' all-reduces keep them in
// step, so their losses agree and the replicated parameters take the same updates (bitwise on alike
// devices). Ranks on unlike devices (a CPU and an OpenCL device) compute the layers after an
// all-reduce with their own kernels, so there every step ends with rank 0's replicated parameters
// broadcast to the others, which would otherwise drift apart by rounding. Rank 0 runs on
// the caller's thread and reports progress.
//
// merged() gives the whole model back (each split parameter and its optimizer state
// assembled from the ranks' slices), for saving, evaluation elsewhere and export.
#pragma once

#include <memory>
#include <vector>

#include "core/comm/group.h"
#include "core/model.h"
#include "core/optimizer.h"
#include "core/train/job_thread.h"
#include "core/train/trainer.h"

namespace tandem {

// Sets every parameter of `part` (a tensor rank's model, built) from `whole` (the same
// spec, unsplit, built anywhere): its slice (Param::slice) of a split parameter, the whole
// of the rest. InvalidArgument naming a parameter the two do not share.
void copyIntoPart(const Model& whole, Model& part);

// A whole model (of some layers) with its optimizer: what the ranks' parts merge into.
struct TensorParts {
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;  // null when merged without optimizers
};
// The model of `spec` built over `layers` (empty: all) on `backend`, each parameter and
// optimizer slot assembled from the ranks' parts (parts[r] rank r's model, split and
// built over the same layers; each part where its Param::slice puts it, rank 0's of what
// every rank holds whole); optimizers empty: parameters only. InvalidArgument when the
// parts do not fill a parameter.
TensorParts mergeTensorParts(const ModelSpec& spec, const std::vector<LayerRange>& layers,
                             const std::vector<const Model*>& parts,
                             const std::vector<const Optimizer*>& optimizers, Backend& backend,
                             const OptimizerOptions& optimizer);
// `part`'s share of a whole model's optimizer state (Optimizer::state of the same layers
// unsplit): each slot's slice where its parameter is split, the whole elsewhere, on the
// part's backend. InvalidArgument naming a slot that does not fit its parameter's part.
std::vector<std::pair<std::string, Tensor>> partOfState(
    const Model& part, const std::vector<std::pair<std::string, Tensor>>& whole);

// Sets `m`'s replicated parameters (those without a Param::slice; f32) to rank 0's of
// `group`, one broadcast each, tagged from o.tag + 1 on: ranks on unlike devices compute
// the layers after an all-reduce with their own kernels, so their copies would otherwise
// drift apart by rounding.
void broadcastReplicated(Model& m, Group& group, RootOptions o);

class TensorParallelTrainer {
 public:
  // One rank per backend and group (groups[r] is rank r of one group of backends.size()
  // ranks); `shares` the ranks' relative shares of each split layer's features (empty:
  // equal). The model is split over all its layers and built from `seed` on every rank.
  TensorParallelTrainer(const ModelSpec& spec, const std::vector<Backend*>& backends,
                        const std::vector<Group*>& groups, std::vector<double> shares,
                        const OptimizerOptions& optimizer, const TrainOptions& options);
  ~TensorParallelTrainer();

  int ranks() const { return static_cast<int>(models_.size()); }
  Model& model(int rank) { return *models_.at(static_cast<size_t>(rank)); }
  const std::vector<TensorRole>& roles() const { return roles_; }
  const std::vector<double>& shares() const { return shares_; }
  // Whether each step ends with rank 0's replicated parameters sent to the others (the
  // ranks' devices are not all alike).
  bool resyncs() const { return resync_; }

  // Every rank's parameters from `whole` (copyIntoPart), before training: a model file's
  // weights to continue from.
  void startFrom(const Model& whole);

  // One step on a host batch of n samples, every rank on its thread (Trainer::step);
  // returns the batch's mean loss (rank 0's).
  double step(const float* x, const int32_t* labels, int64_t n);
  EpochReport trainEpoch(const Dataset& data, int64_t epoch,
                         const std::function<void(const StepReport&)>& progress);
  // Forward-only pass on every rank (the split layers meet in their all-reduces); rank 0's.
  EvalResult evaluate(const Dataset& data, int64_t batch);

  // The whole model on `backend`, its parameters and optimizer state assembled from the
  // ranks' slices (each where its Param::slice puts it; rank 0's of what every rank holds whole).
  TensorParts merged(Backend& backend) const;

 private:
  // Rank r's replicated parameters (those without a Param::slice) set to rank 0's.
  void resync(int r);

  ModelSpec spec_;
  std::vector<double> shares_;
  OptimizerOptions optimizer_options_;
  std::vector<std::unique_ptr<Model>> models_;
  std::vector<std::unique_ptr<Optimizer>> optimizers_;
  std::vector<std::unique_ptr<Trainer>> trainers_;
  std::vector<TensorRole> roles_;
  std::vector<Group*> groups_;
  bool resync_ = false;
  std::vector<std::unique_ptr<JobThread>> threads_;  // ranks 1.. (rank 0: the caller's)
};

}  // namespace tandem
