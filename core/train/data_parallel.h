// Data-parallel training: R replicas of one model, each on its own backend and thread,
// each computing the gradients of its share of every batch; the gradients are summed
// through a Group (one rank per replica) and every replica takes the same optimizer step.
//
// A step: the batch of n samples is cut into the replicas' shares (equal, or in
// proportion to `shares`, e.g. from profiled speeds); in trainEpoch each replica gathers
// its own share from the dataset on its own thread (DDP's per-replica loaders), so that
// no replica waits while one thread loads the whole batch; replica r runs forward, the loss
// scaled by 1/n (the whole batch's mean, so each sample's gradient counts once wherever
// it was computed) and backward layer by layer from the last, its gradients summed in
// buckets as they become final (GradientBuckets, core/train/gradient_buckets.h): device
// replicas copy each full bucket to the host and sum it on a communication thread while
// backward goes on (DDP-style overlap); CPU replicas (host memory) sum each parameter on
// their compute thread, where it lies — the summing is CPU work that would compete with
// backward anyway, and the in-process group's collectives cost no wire time to hide.
// Replica 0 computes on the caller's thread. When backward is done and every bucket is
// summed, each replica's optimizer steps.
//
// With equal shares on CPU replicas and the in-process group, the weights are bitwise
// those of one device computing the R microbatches' gradients apart and adding them in
// replica order (tests/core/data_parallel_test.cpp), and the replicas stay identical.
// With `zero` 1 each row's optimizer state lives on one replica only (about 1/R of it on
// each, or as `state_shares` say), with `zero` 2 its summed gradient too, the weights
// bitwise the same.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/group.h"
#include "core/data/dataset.h"
#include "core/model.h"
#include "core/model_spec.h"
#include "core/optimizer.h"
#include "core/profile/profile.h"
#include "core/train/microbatch.h"
#include "core/train/parameter_shards.h"
#include "core/train/state_shards.h"
#include "core/train/trainer.h"

namespace tandem {

struct DataParallelOptions {
  int64_t batch = 64;
  uint64_t seed = 1;
  bool shuffle = true;
  std::vector<double> shares;                // per replica, relative; empty: equal
  size_t bucket_bytes = size_t{1} << 20;     // gradient bytes per allreduce
  std::chrono::milliseconds timeout{60000};  // each bucket's allreduce
  // ZeRO stage (`tandem train --zero`): 0, every replica keeps every parameter's optimizer
  // state and steps it; 1, the state is cut into one shard per replica (stateShards),
  // whose rows only that replica steps after the gradients are summed and then broadcasts
  // to the others; 2, the summed gradients too: each run of rows is reduced into its owner
  // alone (GradientBuckets), which keeps that sum and no other gradient after backward;
  // 3, the parameters too: a replica keeps its rows' values, and each layer's are made
  // whole before its forward and its backward and given up after (ParameterShards).
  // The weights are bitwise those of stage 0: each value's update is the same of the same
  // summed gradient, summed in the same order.
  int zero = 0;
  // Per replica, its relative room for optimizer state (e.g. each device's memory): each
  // replica's shard of the state's bytes follows it. Empty: equal.
  std::vector<double> state_shares;
};

// Shares for replicas on `devices` (backend names: "cpu", "opencl:0") in proportion to
// each device's training speed in `profile` (`tandem profile` of this model): one over
// its time per sample for forward and backward of every layer plus the loss (medians).
// A device that appears twice gets its share twice. `where` names the profile in errors:
// another model, other layers, no batch, a device it does not hold, or one with no time
// measured.
std::vector<double> sharesFromProfile(const Profile& profile, const Model& model,
                                      const std::vector<std::string>& devices,
                                      const std::string& where);

class DataParallelTrainer {
 public:
  // One replica per backend, groups[r] its rank (groups[r]->rank() == r). Every replica
  // builds the model with the same seed, so they start identical.
  DataParallelTrainer(const ModelSpec& spec, const std::vector<Backend*>& backends,
                      const std::vector<Group*>& groups, const OptimizerOptions& optimizer,
                      const DataParallelOptions& options);
  ~DataParallelTrainer();
  DataParallelTrainer(const DataParallelTrainer&) = delete;
  DataParallelTrainer& operator=(const DataParallelTrainer&) = delete;

  // One step on a host batch of n samples; returns the batch's mean loss.
  double step(const float* x, const int32_t* labels, int64_t n);
  // The same step on samples order[begin, begin + n) of `data`, each replica gathering
  // its own share on its own thread (as DDP's per-replica loaders do), so that loading
  // runs in parallel too. trainEpoch's steps.
  double step(const Dataset& data, const std::vector<int64_t>& order, int64_t begin, int64_t n);
  EpochReport trainEpoch(const Dataset& data, int64_t epoch,
                         const std::function<void(const StepReport&)>& progress);

  size_t replicas() const { return replicas_.size(); }
  // The replica's model; at ZeRO 3 made whole first from the replicas' shards (until its
  // next step gives up what is not its own), for evaluating or saving it.
  Model& model(size_t replica);
  // The replica's optimizer: with `zero` 1 it holds only the state of its shard's rows
  // (under the parameters' names, shaped as those rows).
  Optimizer& optimizer(size_t replica);
  // The state's shards (zero 1 and 2; empty otherwise).
  const std::vector<StateShard>& shards() const { return shards_; }
  // Bytes of optimizer state the replica holds.
  int64_t stateBytes(size_t replica) const;
  // Bytes of gradient the replica holds now (between steps: zero 2 its shard's sums
  // only), and the most it held at once (GradientBuckets::peakGradientBytes).
  int64_t gradientBytes(size_t replica) const;
  int64_t peakGradientBytes(size_t replica) const;
  // Bytes of parameter values the replica keeps between steps and the most it held at
  // once: every parameter's but at ZeRO 3 (ParameterShards::keptBytes).
  int64_t parameterBytes(size_t replica) const;
  int64_t peakParameterBytes(size_t replica) const;
  // An optimizer holding every replica's state (its tensors shared with theirs), what a
  // saved model file takes: replica 0's own at stage 0.
  std::unique_ptr<Optimizer> mergedOptimizer() const;
  int64_t globalStep() const { return global_step_; }

 private:
  struct Replica;
  // Replica r's share: samples [first, first + count) of the batch as host arrays.
  using Share = std::function<std::pair<const float*, const int32_t*>(size_t r, int64_t first,
                                                                      int64_t count)>;
  double run(int64_t n, const Share& share);
  // Replica r's forward and backward of its `count` samples (x and labels; none: it adds
  // zeros), its gradients summed with the others' (its loss in rep.loss_sum).
  void replicaStep(Replica& rep, size_t r, int64_t n, const float* x, const int32_t* labels,
                   int64_t count, uint64_t global_step);
  std::vector<const ParameterShards*> parameterShards() const;
  // Stages 1 and 2: replica r steps the rows of its shard, then every shard's owner
  // broadcasts them to the others (in shard order, on every replica's thread).
  void stepOwned(Replica& rep, size_t r);
  std::vector<std::unique_ptr<Replica>> replicas_;
  DataParallelOptions options_;
  std::vector<StateShard> shards_;
  int64_t global_step_ = 0;
};

}  // namespace tandem
