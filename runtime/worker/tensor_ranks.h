// A tensor-split stage's ranks inside its worker's process (Assign::slice.tensor > 1;
// core/pipeline/tensor_stage.h): the worker's own model is rank 0, and ranks 1.. each get
// a backend of the stage's device with the stage's threads, the stage's layers split by
// the slice's shares, and an optimizer; all share an in-process group. What the worker
// reports as its slice (checkpoints, the trained model) is the ranks' parts merged, so
// the coordinator sees an ordinary stage.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/model_file.h"
#include "core/optimizer.h"
#include "core/pipeline/tensor_stage.h"
#include "runtime/control/messages.h"

namespace tandem::runtime {

class TensorRanks {
 public:
  // Makes `rank0` (the worker's model of `spec`, not yet built) rank 0 of the stage's
  // tensor group and builds ranks 1..; InvalidArgument naming `who` when the stage's
  // layers do not split that many ways.
  TensorRanks(const ModelSpec& spec, const Assign& a, int threads, Model& rank0,
              const std::string& who);
  ~TensorRanks();

  // Once rank 0 is built, with its optimizer.
  void setRank0(Optimizer& optimizer);
  // Every rank's parameters, and with `restore_optimizer` its optimizer state, from a
  // model file of the whole model (its parts of them).
  void startFrom(const ModelFile& file, bool restore_optimizer, const std::string& who);
  // The ranks as TensorStage takes them.
  std::vector<TensorStage::Rank> parts() const;
  // The stage's layers whole, merged from the ranks (with the optimizer state): the bytes
  // of serializeModel, as an unsplit stage sends them.
  std::vector<uint8_t> mergedSlice() const;
  // The most tensor memory ranks 1.. have held, summed (-1 where a backend does not count).
  int64_t peakTensorBytes() const;
  // "2 ranks (shares 1 : 1): 1 pair, ..." for the log.
  std::string describe() const;

 private:
  ModelSpec spec_;
  std::vector<LayerRange> layers_;
  OptimizerOptions optimizer_options_;
  std::vector<double> shares_;
  std::vector<TensorRole> roles_;
  Model* rank0_;
  Optimizer* optimizer0_ = nullptr;
  // Declared so that they go in reverse: optimizers and models before their backends,
  // and the group (which the models' parts point to) last.
  std::vector<std::unique_ptr<Group>> groups_;
  std::vector<std::unique_ptr<Backend>> backends_;  // ranks 1..
  std::vector<std::unique_ptr<Model>> models_;
  std::vector<std::unique_ptr<Optimizer>> optimizers_;
};

}  // namespace tandem::runtime
