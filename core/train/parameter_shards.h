// Parameter shards (ZeRO stage 3, `tandem train --zero 3`): each replica keeps the values
// of its own shards' rows only (state_shards.h: the cut its optimizer state and summed
// gradients follow), the masters its optimizer steps. A layer's parameters are made whole
// before its forward and again before its backward — every run of rows broadcast from its
// owner, in shard order — and given up after, so that a replica holds its shards plus the
// layer it computes. The values gathered are the owners' bits, so the layers compute what
// they would on whole parameters, bitwise.
//
// Every replica calls gather() for the same layers in the same order (a replica without
// samples too: the broadcasts are collectives). Parameters without a gradient (batch norm's
// running statistics) are not sharded. One thread calls a ParameterShards.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "core/comm/group.h"
#include "core/model.h"
#include "core/train/state_shards.h"

namespace tandem {

// Where the gathers' broadcasts are tagged from, apart from the gradient reduces and the
// stage-1 broadcasts (numbered from 0).
inline constexpr uint64_t kGatherTags = uint64_t{1} << 40;

class ParameterShards {
 public:
  // `model` built, every replica's the same values (one seed); afterwards it holds its
  // own rows and whole parameters it owns whole. `shards` cover every trainable
  // parameter's rows (modelStateShards), owners the group's ranks.
  ParameterShards(Model& model, Group& group, const std::vector<StateShard>& shards,
                  std::chrono::milliseconds timeout);

  // `layer`'s sharded parameters whole: each run of rows broadcast from its owner.
  void gather(size_t layer);
  // `layer`'s parameters back to this replica's own rows (no collective).
  void release(size_t layer);
  // Every parameter whole from `owners`' masters (the ParameterShards of every replica of
  // one process, in rank order; no collective): what evaluating or saving this replica's
  // model reads. The next gather() and release() go on from there.
  void makeWhole(const std::vector<const ParameterShards*>& owners);

  // This replica's shards, in shard order, each as a parameter of its own: its name and
  // its rows' values (the master), without a gradient.
  std::vector<Param> owned() const;
  // Bytes of parameter values held now (the model's, gathered or kept, and the masters),
  // and the most held at once by the gathers since construction gave up what was not
  // this replica's (makeWhole's whole model is not counted).
  int64_t parameterBytes() const;
  int64_t peakParameterBytes() const { return peak_bytes_; }
  // Bytes of the values this replica keeps between layers: its masters, the parameters it
  // owns whole and those not sharded.
  int64_t keptBytes() const;

 private:
  struct Mine {
    StateShard shard;
    Tensor master;  // its rows; undefined where it is a whole parameter (kept as it is)
  };
  Tensor shapedLike(size_t param);
  void notePeak();

  Model& model_;
  Backend& backend_;
  Group& group_;
  std::chrono::milliseconds timeout_;
  std::vector<StateShard> shards_;
  std::vector<Mine> mine_;
  std::vector<Shape> shapes_;                      // by Model::params() index
  std::vector<bool> sharded_;                      // by index: trainable (its rows cut)
  std::vector<bool> kept_;                         // by index: owned whole here
  std::vector<std::vector<size_t>> layer_params_;  // by layer: its sharded params' indices
  uint64_t next_tag_ = 0;
  int64_t peak_bytes_ = 0;
};

}  // namespace tandem
