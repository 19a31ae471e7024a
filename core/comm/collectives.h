// The collectives over Pairs (core/comm/pairs.h), as free functions over an options
// struct (group.h's) with an explicit tag and timeout, Gloo's way. Every rank of the
// pairs calls the same collectives in the same order with the same tag and count; the
// contracts are the Group functions' of the same names (group.h).
//
//   allreduce, ring (large): reduce-scatter then all-gather around the ring of ranks,
//     2(n-1) transfers each moving one slice; slice k is accumulated starting at rank
//     k+1 and ending at rank k, the same order on every run, each partial sum kept in
//     the slice of the buffer that the all-gather overwrites later.
//   allreduce, direct (small): every rank sends its buffer to every other and reduces all
//     of them in rank order (one transfer; the in-process group's order).
//   reduce-scatter / all-gather: the ring's halves. broadcast, scatter: the root sends to
//     each rank; reduce, gather: each rank sends to the root, which reduces in rank order.
//
// With a reduced-precision wire every rank uses the values as the wire carries them
// (Pairs::asSent) — its own contribution and the root's broadcast data too — so that
// ranks stay identical.
#pragma once

#include <memory>
#include <span>

#include "core/comm/group.h"
#include "core/comm/pairs.h"

namespace tandem {

void allreduce(Pairs& p, std::span<float> data, const AllreduceOptions& o = {});
void reduceScatter(Pairs& p, std::span<float> data, const AllreduceOptions& o = {});
void allGather(Pairs& p, std::span<float> data, const CollectiveOptions& o = {});
void broadcast(Pairs& p, std::span<float> data, const RootOptions& o = {});
void reduce(Pairs& p, std::span<float> data, const ReduceOptions& o = {});
void gather(Pairs& p, std::span<const float> in, std::span<float> out, const RootOptions& o = {});
void scatter(Pairs& p, std::span<const float> in, std::span<float> out,
             const RootOptions& o = {});
void barrier(Pairs& p, const CollectiveOptions& o = {});

// A Group whose collectives are the functions above over `pairs` (which it owns).
std::unique_ptr<Group> makePairGroup(std::unique_ptr<Pairs> pairs);
// The pairs under a group made by makePairGroup; null for a group of another kind.
Pairs* pairsOf(Group& group);
const Pairs* pairsOf(const Group& group);

}  // namespace tandem
