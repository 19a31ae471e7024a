#include "core/train/gradient_buckets.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/spin.h"

namespace tandem {

GradientBuckets::GradientBuckets(Model& model, size_t begin, size_t end, Group& group,
                                 const BucketOptions& options)
    : model_(model),
      backend_(model.backend()),
      group_(group),
      begin_(begin),
      options_(options),
      sharded_(!options.shards.empty()) {
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
  TANDEM_CHECK_MSG(!sharded_ || !(options.in_place && options.comm_thread), InvalidArgument,
                   "gradient buckets: sharded gradients summed in place are reduced on the "
                   "caller's thread, not a communication thread");
  const std::vector<Param*>& all = model.params();
  auto indexOf = [&](const Param* p) {
    return static_cast<size_t>(std::find(all.begin(), all.end(), p) - all.begin());
  };
  ready_at_.resize(end - begin);
  trainable_.resize(end - begin);
  Bucket current;
  size_t bytes = 0;
  auto close = [&] {
    if (current.params.empty()) return;
    for (Param* p : current.params) {
      current.count += static_cast<size_t>(p->grad.numel());
      current.indices.push_back(indexOf(p));
      current.shapes.push_back(p->grad.shape());
    }
    if (!options.in_place && !sharded_) current.host.resize(current.count);  // (sharded: per step)
    ready_at_[current.lowest_layer - begin].push_back(buckets_.size());
    buckets_.push_back(std::move(current));
    current = Bucket{};
    bytes = 0;
  };
  for (size_t l = end; l-- > begin;) {
    for (Param* p : model.layer(l).params()) {
      if (!p->grad.defined()) continue;  // batch norm's running statistics
      current.params.push_back(p);
      trainable_[l - begin].emplace_back(p, p->grad.shape());
      current.lowest_layer = l;
      bytes += p->grad.bytes();
      if (options.in_place) close();
    }
    if (bytes >= options.bucket_bytes || l == begin) close();
  }
  if (sharded_) {  // from here on a gradient lives from its layer's backward to its reduce
    cutPieces(options.shards);
    for (Bucket& bucket : buckets_) release(bucket);
  }
  if (options.comm_thread)
    comm_ = std::make_unique<JobThread>(waitBeforeSleeping(group.size() + 1));
  notePeak();
}

// Each bucket's values cut at its parameters' shards; this rank's shards noted, in shard
// order, a part of a parameter with a buffer of its own for its rows' sum.
void GradientBuckets::cutPieces(const std::vector<StateShard>& shards) {
  const std::vector<Param*>& all = model_.params();
  kept_.assign(all.size(), false);
  for (const StateShard& s : shards) {
    TANDEM_CHECK_MSG(
        s.param < all.size() && s.owner >= 0 && s.owner < group_.size() && s.begin < s.end,
        InvalidArgument,
        "gradient buckets: a shard of parameter " << s.param << " of " << all.size() << ", rows ["
                                                  << s.begin << ", " << s.end << ") owned by rank "
                                                  << s.owner << " of " << group_.size());
    if (s.owner != group_.rank()) continue;
    if (wholeParam(all, s)) {
      kept_[s.param] = true;
      owned_.push_back({all[s.param], s, true, {}, {}});
    } else {
      const Tensor rows = all[s.param]->value.slice(s.begin, s.end - s.begin);
      owned_.push_back({all[s.param], s, false, rows.shape(), {}});
    }
  }
  uint64_t tag = 0;
  for (Bucket& bucket : buckets_) {
    size_t offset = 0;
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      const Param& p = *bucket.params[i];
      const auto numel = static_cast<size_t>(p.grad.numel());
      const Shape& shape = p.value.shape();
      const size_t row = shape.rank() > 0 && p.value.dtype() == DType::kF32
                             ? numel / static_cast<size_t>(std::max<int64_t>(1, shape[0]))
                             : numel;
      size_t covered = 0;
      for (const StateShard& s : shards) {
        if (s.param != bucket.indices[i]) continue;
        Piece piece;
        piece.offset = offset + static_cast<size_t>(s.begin) * row;
        piece.count = static_cast<size_t>(s.end - s.begin) * row;
        piece.owner = s.owner;
        piece.tag = tag++;
        piece.param = i;
        piece.row_begin = s.begin;
        TANDEM_CHECK_MSG(
            piece.offset == offset + covered, InvalidArgument,
            "gradient buckets: the shards of '" << p.name << "' do not tile its rows in order");
        covered += piece.count;
        for (size_t k = 0; k < owned_.size(); ++k)
          if (owned_[k].shard == s && !owned_[k].whole) piece.owned = k;
        bucket.pieces.push_back(piece);
      }
      TANDEM_CHECK_MSG(covered == numel, InvalidArgument,
                       "gradient buckets: the shards cover " << covered << " of the " << numel
                                                             << " values of '" << p.name << "'");
      offset += numel;
    }
  }
  tags_ = tag;
}

std::vector<Param> GradientBuckets::ownedParams() const {
  std::vector<Param> out;
  for (const Owned& o : owned_) {
    if (o.whole) {
      out.push_back(*o.param);  // its own gradient
      continue;
    }
    Param part;
    part.name = o.param->name;
    part.grad = o.grad;
    if (o.param->value.defined())  // (ZeRO 3 gives the values up between layers)
      part.value = o.param->value.slice(o.shard.begin, o.shard.end - o.shard.begin);
    out.push_back(std::move(part));
  }
  return out;
}

int64_t GradientBuckets::gradientBytes() const {
  int64_t bytes = 0;
  for (const Bucket& bucket : buckets_) {
    for (const Param* p : bucket.params)
      if (p->grad.defined()) bytes += static_cast<int64_t>(p->grad.bytes());
    bytes += static_cast<int64_t>(bucket.host.capacity() * sizeof(float));
  }
  for (const Owned& o : owned_)
    if (o.grad.defined()) bytes += static_cast<int64_t>(o.grad.bytes());
  return bytes;
}

void GradientBuckets::notePeak() { peak_bytes_ = std::max(peak_bytes_, gradientBytes()); }

std::span<float> GradientBuckets::values(Bucket& bucket) {
  return options_.in_place ? bucket.in_place : std::span<float>(bucket.host);
}

void GradientBuckets::layerStarts(size_t layer) {
  if (!sharded_ || layer < begin_ || layer - begin_ >= trainable_.size()) return;
  bool grown = false;
  for (const auto& [p, shape] : trainable_[layer - begin_]) {
    if (p->grad.defined()) continue;
    p->grad = backend_.zeros(shape);
    grown = true;
  }
  if (grown) notePeak();
}

void GradientBuckets::release(Bucket& bucket) {
  for (size_t i = 0; i < bucket.params.size(); ++i)
    if (!kept_[bucket.indices[i]]) bucket.params[i]->grad = Tensor{};
}

GradientBuckets::~GradientBuckets() { abandon(); }

Tensor& GradientBuckets::sumOf(Owned& part) {
  if (!part.grad.defined()) part.grad = backend_.empty(part.rows);
  return part.grad;
}

void GradientBuckets::start(uint64_t tag) {
  if (running_) abandon();                    // the last step failed before its finish
  for (Owned& o : owned_) o.grad = Tensor{};  // (the last step's sums: its update took them)
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
  if (options_.in_place) return;
  for (Bucket& bucket : buckets_) {
    if (!sharded_) {
      size_t at = 0;
      for (Param* p : bucket.params) {
        backend_.upload(p->grad, bucket.host.data() + at);
        at += static_cast<size_t>(p->grad.numel());
      }
      continue;
    }
    // This rank's runs back onto its backend: a whole parameter's into its gradient,
    // a part's into its own buffer; the host copy is given up.
    for (const Piece& piece : bucket.pieces) {
      if (piece.owner != group_.rank()) continue;
      const Tensor& into =
          piece.owned != SIZE_MAX ? sumOf(owned_[piece.owned]) : bucket.params[piece.param]->grad;
      backend_.upload(into, bucket.host.data() + piece.offset);
    }
    notePeak();
    std::vector<float>().swap(bucket.host);
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
  if (sharded_)  // (a replica without samples this step ran no backward to give them back)
    for (size_t i = 0; i < bucket.params.size(); ++i)
      if (!bucket.params[i]->grad.defined())
        bucket.params[i]->grad = backend_.zeros(bucket.shapes[i]);
  if (options_.in_place) {
    const void* grad = backend_.hostData(bucket.params[0]->grad);
    bucket.in_place = {const_cast<float*>(static_cast<const float*>(grad)), bucket.count};
  } else {  // to the host first
    bucket.host.resize(bucket.count);
    size_t at = 0;
    for (Param* p : bucket.params) {
      backend_.download(p->grad, bucket.host.data() + at);
      at += static_cast<size_t>(p->grad.numel());
    }
  }
  notePeak();
  if (sharded_ && !options_.in_place) release(bucket);  // the host copy holds them now
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
  Bucket& bucket = buckets_[b];
  if (!sharded_) {
    AllreduceOptions o;
    o.timeout = options_.timeout;
    o.tag = tag_ + b;
    allreduce(group_, values(bucket), o);
    return;
  }
  // Each run into its owner, summed as the bucket's allreduce would sum it.
  ReduceOptions o;
  o.timeout = options_.timeout;
  o.allreduce_count = bucket.count;
  const std::span<float> all = values(bucket);
  for (const Piece& piece : bucket.pieces) {
    o.tag = tag_ + piece.tag;
    o.root = piece.owner;
    o.allreduce_offset = piece.offset;
    reduce(group_, all.subspan(piece.offset, piece.count), o);
  }
  if (!options_.in_place) return;  // (finish() takes this rank's runs from the host)
  // In place (on the caller's thread): a part's sum into its own buffer, then the
  // gradients this rank does not keep given up.
  for (const Piece& piece : bucket.pieces) {
    if (piece.owned == SIZE_MAX) continue;
    Owned& mine = owned_[piece.owned];
    backend_.copy(
        bucket.params[piece.param]->grad.slice(piece.row_begin, mine.shard.end - mine.shard.begin),
        sumOf(mine));
    notePeak();
  }
  release(bucket);
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
