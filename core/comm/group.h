// Group: collectives among the ranks of a data-parallel set (replicas of a stage, or of
// a whole model). Implementations live in transport/ (in-process: ranks are threads
// sharing memory; cross-process: over links); callers use the free functions below,
// each taking an options struct with an explicit tag and a timeout, so that no call can
// match another's messages or wait forever.
//
// Every rank of a group calls the same collectives in the same order with the same tag
// and element count; a mismatch is an InvalidArgument naming the ranks. A rank that does
// not arrive within the timeout makes the others raise Timeout naming it. Data are fp32
// on the host. Reductions add in one fixed order on every rank, so results are
// deterministic and bitwise identical across ranks and runs: rank order
// (((r0 + r1) + r2) + ...), but for the ring allreduce of the groups over links, which
// adds slice j around the ring from rank j + 1 to rank j (a reduce can be told to follow
// it: ReduceOptions::allreduce_count).
//
// Slices: reduce-scatter and all-gather cut `count` elements into size() contiguous
// slices, rank r owning slice(count, size, r) (the first count % size slices one longer).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "core/error.h"

namespace tandem {

enum class ReduceOp { kSum, kMean, kMax };
std::string_view reduceOpName(ReduceOp op);

struct CollectiveOptions {
  uint64_t tag = 0;
  std::chrono::milliseconds timeout{30000};
};

enum class AllreduceAlgorithm {
  kAuto,    // by size: kDirect up to small_bytes, kRing above
  kDirect,  // latency-friendly: every rank reduces the whole buffer from everyone's copy
  kRing,    // bandwidth-friendly: reduce-scatter, then all-gather
};

struct AllreduceOptions : CollectiveOptions {
  ReduceOp op = ReduceOp::kSum;
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  size_t small_bytes = size_t{64} << 10;
};

struct ReduceOptions : CollectiveOptions {
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  // A part of an allreduce's buffer (allreduce_count > 0 elements, `algorithm` and
  // `small_bytes` as its AllreduceOptions): the elements reduce in the order that
  // allreduce reduces the ones at allreduce_offset, so that reducing each part of a buffer
  // into its owner gives the owner the allreduce's bits (ZeRO's gradients). 0: rank order.
  size_t allreduce_count = 0, allreduce_offset = 0;
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  size_t small_bytes = size_t{64} << 10;
};

struct RootOptions : CollectiveOptions {
  int root = 0;
};

struct Slice {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};
Slice sliceOf(size_t count, int size, int rank);

class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // See the free functions.
  virtual void allreduce(std::span<float> data, const AllreduceOptions& o) = 0;
  virtual void reduceScatter(std::span<float> data, const AllreduceOptions& o) = 0;
  virtual void allGather(std::span<float> data, const CollectiveOptions& o) = 0;
  virtual void broadcast(std::span<float> data, const RootOptions& o) = 0;
  virtual void reduce(std::span<float> data, const ReduceOptions& o) = 0;
  virtual void gather(std::span<const float> in, std::span<float> out, const RootOptions& o) = 0;
  virtual void scatter(std::span<const float> in, std::span<float> out, const RootOptions& o) = 0;
  virtual void barrier(const CollectiveOptions& o) = 0;
};

// Every rank's `data` becomes the reduction of all ranks' `data`.
inline void allreduce(Group& g, std::span<float> data, const AllreduceOptions& o = {}) {
  g.allreduce(data, o);
}
// Rank r's slice of `data` becomes the reduction of all ranks' slice r; the rest of
// `data` is left as it was.
inline void reduceScatter(Group& g, std::span<float> data, const AllreduceOptions& o = {}) {
  g.reduceScatter(data, o);
}
// Every rank contributes its slice of `data`; afterwards every slice holds its owner's.
inline void allGather(Group& g, std::span<float> data, const CollectiveOptions& o = {}) {
  g.allGather(data, o);
}
// Every rank's `data` becomes the root's.
inline void broadcast(Group& g, std::span<float> data, const RootOptions& o = {}) {
  g.broadcast(data, o);
}
// The root's `data` becomes the reduction of all ranks' `data`; the others' is unchanged.
inline void reduce(Group& g, std::span<float> data, const ReduceOptions& o = {}) {
  g.reduce(data, o);
}
// The root's `out` (size() x in.size()) becomes every rank's `in`, in rank order; `out`
// is unused elsewhere.
inline void gather(Group& g, std::span<const float> in, std::span<float> out,
                   const RootOptions& o = {}) {
  g.gather(in, out, o);
}
// Every rank's `out` becomes its part of the root's `in` (size() x out.size()); `in` is
// unused elsewhere.
inline void scatter(Group& g, std::span<const float> in, std::span<float> out,
                    const RootOptions& o = {}) {
  g.scatter(in, out, o);
}
// Returns once every rank has called it.
inline void barrier(Group& g, const CollectiveOptions& o = {}) { g.barrier(o); }

}  // namespace tandem
