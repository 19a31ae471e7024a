// Gradient buckets: the parameter gradients of a model's layers [begin, end), summed
// across the replicas of a Group as backward makes them final, DDP's way. One mechanism
// for data-parallel replicas (DataParallelTrainer) and replicated pipeline stages
// (StageExecutor).
//
// Buckets are cut once, from the last layer down, of whole parameters, about
// bucket_bytes each, in the same order on every replica; a bucket is ready once the
// lowest layer it holds is done. A step: start(tag), then layerDone(l) as each layer's
// gradients become final (Model::backward's LayerDone; layers may also be reported all at
// once), then finish(), which hands over whatever is left, waits for every sum and puts
// the sums back into the gradients. Bucket b's allreduce has tag `tag + b`.
//
// Where the summing runs (BucketOptions):
//   comm_thread: a ready bucket is copied to the host and summed on a communication
//     thread of its own while backward goes on (the overlap); finish() waits for it.
//   otherwise: summed on the caller's thread inside layerDone, before backward goes on.
//   in_place: each parameter is its own bucket and is summed where it lies, with no copy
//     (gradients in host memory only: the CPU backend).
//
// Sharded (BucketOptions::shards, ZeRO stage 2): each bucket's runs of rows are reduced
// into their owners (state_shards.h) instead of summed on every replica; the owner keeps
// its rows' sum (ownedParams), and a replica keeps no other gradient once its bucket is
// reduced: a parameter it does not own whole gets its gradient back, zeros, from
// layerStarts before its layer's backward, and gives it up after the reduce (device
// replicas' host copies likewise live from hand-over to finish). Every reduce adds in
// rank order, as the allreduce does, so the owners' sums are bitwise the unsharded ones.
//
// Errors: an allreduce's error is raised by finish() (or by layerDone on the caller's
// thread). A caller whose backward fails calls abandon(), so that the communication
// thread stops waiting for buckets that will not come.
//
// Threading: one thread calls a GradientBuckets; the communication thread is its own.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "core/comm/group.h"
#include "core/model.h"
#include "core/train/job_thread.h"
#include "core/train/state_shards.h"

namespace tandem {

struct BucketOptions {
  size_t bucket_bytes = size_t{1} << 20;
  std::chrono::milliseconds timeout{60000};  // each bucket's allreduce
  bool comm_thread = false;
  bool in_place = false;
  // Empty: every replica gets every sum (an allreduce per bucket). Else the cut of the
  // model's parameters (indices into Model::params(), owners the group's ranks) that the
  // gradients are reduced into (not with in_place on a comm_thread).
  std::vector<StateShard> shards;
};

class GradientBuckets {
 public:
  // `model`'s layers [begin, end) must be built; the model and the group must outlive
  // the buckets. InvalidArgument for in_place on gradients that are not in host memory.
  GradientBuckets(Model& model, size_t begin, size_t end, Group& group,
                  const BucketOptions& options);
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  void start(uint64_t tag);
  // Before `layer`'s backward: sharded, its parameters' gradients, given up after the last
  // step's reduce, are zeros again; unsharded nothing.
  void layerStarts(size_t layer);
  void layerDone(size_t layer);
  void finish();
  void abandon() noexcept;

  size_t size() const { return buckets_.size(); }
  // The tags a step's collectives take from start()'s: one a bucket, sharded one a run.
  uint64_t tags() const { return sharded_ ? tags_ : buckets_.size(); }
  // Sharded: this rank's shards, in shard order, each as a parameter of its own (its
  // name, its rows' values and, after finish(), their summed gradient).
  std::vector<Param> ownedParams() const;
  // Bytes of gradient this replica holds now (on its backend and the host copies), and
  // the most it has held at once since construction.
  int64_t gradientBytes() const;
  int64_t peakGradientBytes() const { return peak_bytes_; }
  // Seconds the caller's thread has spent in allreduces, waiting for the other replicas
  // included (buckets summed without a communication thread), since construction.
  double callerSumSeconds() const { return caller_sum_s_; }

 private:
  // Sharded: a run of a bucket's values and the rank it is reduced into.
  struct Piece {
    size_t offset = 0, count = 0;  // in the bucket's values
    int owner = 0;
    uint64_t tag = 0;         // added to the step's tag
    size_t param = 0;         // index in the bucket's params
    int64_t row_begin = 0;    // the run's first row of that parameter
    size_t owned = SIZE_MAX;  // this rank's run of part of a parameter: its index in owned_
  };
  struct Bucket {
    size_t lowest_layer = 0;
    std::vector<Param*> params;
    std::vector<size_t> indices;  // the params' indices in Model::params()
    std::vector<Shape> shapes;    // and their gradients' shapes
    size_t count = 0;             // values
    std::vector<float> host;      // the gradients, flattened (not in place)
    std::span<float> in_place;    // or one parameter's gradient itself, from hand-over
    std::vector<Piece> pieces;    // sharded
  };
  // Sharded: one of this rank's shards. Part of a parameter: `grad` its rows' sum, made at
  // the reduce and given up when the next step starts (its optimizer step has taken it);
  // a whole parameter's own gradient is kept instead.
  struct Owned {
    Param* param = nullptr;
    StateShard shard;
    bool whole = false;
    Shape rows;  // a part's shape
    Tensor grad;
  };
  Tensor& sumOf(Owned& part);  // a part's buffer, made if the step has none yet

  std::span<float> values(Bucket& bucket);
  void cutPieces(const std::vector<StateShard>& shards);
  void release(Bucket& bucket);  // sharded: the gradients this rank does not keep
  void notePeak();
  void handOver(size_t b);
  void sum(size_t b);
  void communicate();

  Model& model_;
  Backend& backend_;
  Group& group_;
  const size_t begin_;
  const BucketOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> ready_at_;  // by layer - begin_: buckets complete after it
  uint64_t tag_ = 0;
  size_t next_ = 0;  // buckets handed over this step
  bool running_ = false;
  double caller_sum_s_ = 0;  // callerSumSeconds
  const bool sharded_;
  uint64_t tags_ = 0;  // sharded: the runs
  std::vector<Owned> owned_;
  std::vector<bool> kept_;  // by index in Model::params(): owned whole here (sharded)
  // By layer - begin_: its params with gradients, and the gradients' shapes.
  std::vector<std::vector<std::pair<Param*, Shape>>> trainable_;
  int64_t peak_bytes_ = 0;
  // The communication queue: how many buckets are handed over, in order.
  std::mutex mutex_;
  std::condition_variable cv_;
  size_t handed_ = 0;
  bool abandoned_ = false;
  std::unique_ptr<JobThread> comm_;
};

}  // namespace tandem
