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
#include <vector>

#include "core/comm/group.h"
#include "core/model.h"
#include "core/train/job_thread.h"

namespace tandem {

struct BucketOptions {
  size_t bucket_bytes = size_t{1} << 20;
  std::chrono::milliseconds timeout{60000};  // each bucket's allreduce
  bool comm_thread = false;
  bool in_place = false;
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
  void layerDone(size_t layer);
  void finish();
  void abandon() noexcept;

  size_t size() const { return buckets_.size(); }
  // Seconds the caller's thread has spent in allreduces, waiting for the other replicas
  // included (buckets summed without a communication thread), since construction.
  double callerSumSeconds() const { return caller_sum_s_; }

 private:
  struct Bucket {
    size_t lowest_layer = 0;
    std::vector<Param*> params;
    std::vector<float> host;    // the gradients, flattened (not in place)
    std::span<float> in_place;  // or one parameter's gradient itself
    std::span<float> data() { return in_place.empty() ? std::span<float>(host) : in_place; }
  };

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
  // The communication queue: how many buckets are handed over, in order.
  std::mutex mutex_;
  std::condition_variable cv_;
  size_t handed_ = 0;
  bool abandoned_ = false;
  std::unique_ptr<JobThread> comm_;
};

}  // namespace tandem
