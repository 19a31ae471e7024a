// State shards: which replica owns which rows of a model's parameters, for sharded
// training state (ZeRO, `tandem train --zero`). The owner of a run of rows keeps those
// rows' optimizer state and steps them (stage 1); at stage 2 it alone also keeps their
// summed gradient (GradientBuckets reduces each run into its owner). One cut for the
// optimizer and the gradients, so each owner steps exactly the rows it was given.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/group.h"
#include "core/model.h"
#include "core/optimizer.h"

namespace tandem {

// A run of rows [begin, end) of parameter `param` (its index in Model::params();
// dimension 0, a 1-d parameter's values) whose training state replica `owner` keeps.
struct StateShard {
  size_t param = 0;
  int64_t begin = 0, end = 0;
  int owner = 0;
  bool operator==(const StateShard&) const = default;
};

// The parameters' rows, in order (parameter i has rows[i] rows of row_bytes[i] bytes),
// cut into one contiguous run per replica in rank order, each run as near its share of
// all the bytes (`shares`, relative; empty: equal) as whole rows allow, as DeepSpeed cuts
// its flat buffer; the runs' pieces in parameter order, none empty. InvalidArgument for a
// share that is not positive or a count that does not match.
std::vector<StateShard> stateShards(const std::vector<int64_t>& rows,
                                    const std::vector<int64_t>& row_bytes, size_t replicas,
                                    const std::vector<double>& shares);

// The cut of `model`'s trainable parameters (those with a gradient) over `replicas`:
// stateShards of their rows, an f32 parameter by its dimension 0, any other whole.
std::vector<StateShard> modelStateShards(const Model& model, size_t replicas,
                                         const std::vector<double>& shares);

// The rows of `shard`'s parameter in `params` as a parameter of their own (its name, its
// value's and gradient's rows); the parameter itself when the shard holds all its rows.
Param shardRows(const std::vector<Param*>& params, const StateShard& shard);
// Whether `shard` holds every row of its parameter.
bool wholeParam(const std::vector<Param*>& params, const StateShard& shard);
// The shard's rows of `t`, a tensor shaped as its parameter (a view; `t` itself when the
// shard holds every row).
Tensor shardOf(const Tensor& t, const std::vector<Param*>& params, const StateShard& shard);
// Rank `rank`'s shards, in order, as parameters of their own (shardRows).
std::vector<Param> ownedRows(const std::vector<Param*>& params,
                             const std::vector<StateShard>& shards, int rank);

// `t`'s values (on `backend`) broadcast from o.root to the group: host memory where it
// lies, device memory through `scratch` on the host.
void broadcastTensor(Backend& backend, Group& group, const Tensor& t, const RootOptions& o,
                     std::vector<float>& scratch);

// The end of a sharded step (stages 1 and 2): every shard's owner broadcasts its rows'
// values, just stepped, to the group, in shard order (tags from `tag`, one a shard). Every
// rank calls it. Host memory is broadcast where it lies; device memory through the host.
void shareSteppedRows(Model& model, Group& group, const std::vector<StateShard>& shards,
                      uint64_t tag, std::chrono::milliseconds timeout);

// The whole optimizer state of the sharded parameters, on `root` (the others: empty),
// from the rows each rank's `optimizer` holds: every slot of every shard broadcast from
// its owner, in shard order (tags from `tag`, one a shard and slot; rows an owner has not
// stepped yet are zeros, as a fresh optimizer's). Every rank calls it; each parameter's
// slots are named "<param>.<slot>", shaped as the parameter, on the root's model's backend.
std::vector<std::pair<std::string, Tensor>> gatherShardedState(
    const Optimizer& optimizer, const Model& model, Group& group,
    const std::vector<StateShard>& shards, uint64_t tag, std::chrono::milliseconds timeout);
// Of a whole state (Optimizer::state()'s names), the rows `rank`'s shards hold, copied:
// what a sharded optimizer restored from a checkpoint keeps.
std::vector<std::pair<std::string, Tensor>> stateOfShards(
    const std::vector<std::pair<std::string, Tensor>>& whole, const Model& model,
    const std::vector<StateShard>& shards, int rank);
// Whether `key` ("3.weight.m") names a slot of parameter `param` ("3.weight").
bool isSlotOf(const std::string& key, const std::string& param);
// The slot suffixes of an optimizer's state ("m", "v"; "velocity"; none).
std::vector<std::string> stateSlots(const OptimizerOptions& options);

}  // namespace tandem
