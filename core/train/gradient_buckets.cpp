#include "core/train/gradient_buckets.h"

#include <utility>

#include "core/error.h"
#include "core/spin.h"

namespace tandem {

GradientBuckets::GradientBuckets(Model& model, size_t begin, size_t end, Group& group,
                                 const BucketOptions& options)
    : model_(model), backend_(model.backend()), group_(group), begin_(begin), options_(options) {
  TANDEM_CHECK_MSG(
      begin < end && end <= model.size(), InvalidArgument,
      "gradient buckets: layers [" << begin << ", " << end << ") of a model with " << model.size());
  TANDEM_CHECK_MSG(options.bucket_bytes >= 4, InvalidArgument,
                   "bucket size " << options.bucket_bytes << " bytes is below one gradient");
  TANDEM_CHECK_MSG(!options.in_place || backend_.hostData(backend_.empty({1})) != nullptr,
                   InvalidArgument,
                   "gradient buckets: backend '" << backend_.info().name
                                                 << "' does not hold its gradients in host "
                                                    "memory, so they cannot be summed in place");
  ready_at_.resize(end - begin);
  Bucket current;
  size_t bytes = 0;
  auto close = [&] {
    if (current.params.empty()) return;
    size_t count = 0;
    for (Param* p : current.params) count += static_cast<size_t>(p->grad.numel());
    if (options.in_place) {
      const void* grad = backend_.hostData(current.params[0]->grad);
      current.in_place = {const_cast<float*>(static_cast<const float*>(grad)), count};
    } else {
      current.host.resize(count);
    }
    ready_at_[current.lowest_layer - begin].push_back(buckets_.size());
    buckets_.push_back(std::move(current));
    current = Bucket{};
    bytes = 0;
  };
  for (size_t l = end; l-- > begin;) {
    for (Param* p : model.layer(l).params()) {
      if (!p->grad.defined()) continue;  // batch norm's running statistics
      current.params.push_back(p);
      current.lowest_layer = l;
      bytes += p->grad.bytes();
      if (options.in_place) close();
    }
    if (bytes >= options.bucket_bytes || l == begin) close();
  }
  if (options.comm_thread)
    comm_ = std::make_unique<JobThread>(waitBeforeSleeping(group.size() + 1));
}

GradientBuckets::~GradientBuckets() { abandon(); }

void GradientBuckets::start(uint64_t tag) {
  if (running_) abandon();  // the last step failed before its finish
  tag_ = tag;
  next_ = 0;
  handed_ = 0;
  abandoned_ = false;
  running_ = true;
  if (comm_) comm_->run([this] { communicate(); });
}

void GradientBuckets::layerDone(size_t layer) {
  TANDEM_CHECK_MSG(running_, InvalidArgument, "gradient buckets: a layer done outside a step");
  if (layer < begin_ || layer - begin_ >= ready_at_.size()) return;
  for (size_t b : ready_at_[layer - begin_]) handOver(b);
}

void GradientBuckets::finish() {
  TANDEM_CHECK_MSG(running_, InvalidArgument, "gradient buckets: finish outside a step");
  // Buckets whose layers were never reported (a replica with no samples this step) go
  // as they are, in order.
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (b >= next_) handOver(b);
  running_ = false;
  if (comm_) comm_->wait();  // rethrows the communication's error
  for (Bucket& bucket : buckets_) {
    if (!bucket.in_place.empty()) continue;
    size_t at = 0;
    for (Param* p : bucket.params) {
      backend_.upload(p->grad, bucket.host.data() + at);
      at += static_cast<size_t>(p->grad.numel());
    }
  }
}

void GradientBuckets::abandon() noexcept {
  if (!running_) return;
  running_ = false;
  if (!comm_) return;
  {
    std::lock_guard lock(mutex_);
    abandoned_ = true;
  }
  cv_.notify_all();
  try {
    comm_->wait();
  } catch (...) {  // the step has failed already; its first error is the caller's
  }
}

// Buckets are handed over in order: b is the next one (ready_at_ lists them so, and a
// bucket's lowest layer is never below a later bucket's).
void GradientBuckets::handOver(size_t b) {
  TANDEM_CHECK_MSG(b == next_, InvalidArgument,
                   "gradient buckets: bucket " << b << " is ready before bucket " << next_);
  ++next_;
  Bucket& bucket = buckets_[b];
  if (bucket.in_place.empty()) {  // to the host first
    size_t at = 0;
    for (Param* p : bucket.params) {
      backend_.download(p->grad, bucket.host.data() + at);
      at += static_cast<size_t>(p->grad.numel());
    }
  }
  if (!comm_) {
    const auto t0 = std::chrono::steady_clock::now();
    sum(b);
    caller_sum_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return;
  }
  {
    std::lock_guard lock(mutex_);
    handed_ = b + 1;
  }
  cv_.notify_all();
}

void GradientBuckets::sum(size_t b) {
  AllreduceOptions o;
  o.timeout = options_.timeout;
  o.tag = tag_ + b;
  allreduce(group_, buckets_[b].data(), o);
}

// The communication thread's step: each bucket as it is handed over, in order.
void GradientBuckets::communicate() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return handed_ > b || abandoned_; });
      if (handed_ <= b) return;  // the caller gave up on this step
    }
    sum(b);
  }
}

}  // namespace tandem
