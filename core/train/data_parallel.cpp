#include "core/train/data_parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <numeric>
#include <span>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/loss.h"
#include "core/spin.h"
#include "core/train/microbatch.h"

namespace tandem {

namespace {

// A thread that runs one job at a time, handed over by run() and awaited by wait();
// each side keeps trying for `spin` (yielding) before it sleeps.
class JobThread {
 public:
  explicit JobThread(std::chrono::microseconds spin) : spin_(spin), thread_([this] { loop(); }) {}
  ~JobThread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void run(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      job_ = std::move(job);
      busy_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }
  // Rethrows what the job threw.
  void wait() {
    yieldFor(spin_, [&] { return !busy_.load(std::memory_order_acquire); });
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return !busy_.load(std::memory_order_relaxed); });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    for (;;) {
      yieldFor(spin_, [&] { return busy_.load(std::memory_order_acquire); });
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return busy_.load(std::memory_order_relaxed) || stop_; });
      if (stop_) return;
      std::function<void()> job = std::move(job_);
      lock.unlock();
      std::exception_ptr error;
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      busy_.store(false, std::memory_order_release);
      cv_.notify_all();
    }
  }

  const std::chrono::microseconds spin_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> job_;
  std::atomic<bool> busy_ = false;  // written under mutex_; read spinning without
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the rest is ready
};

// Gradients allreduced together: whole parameters, in the order backward finishes them.
struct Bucket {
  size_t lowest_layer = 0;  // ready once this layer's backward is done
  std::vector<Param*> params;
  std::vector<float> host;    // the gradients, flattened (device memory)
  std::span<float> in_place;  // or one parameter's gradient itself (host memory)
  std::span<float> data() { return in_place.empty() ? std::span<float>(host) : in_place; }
};

}  // namespace

std::vector<int64_t> shareBatch(int64_t n, size_t replicas, const std::vector<double>& shares) {
  TANDEM_CHECK_MSG(replicas >= 1, InvalidArgument, "data parallel needs a replica");
  TANDEM_CHECK_MSG(shares.empty() || shares.size() == replicas, InvalidArgument,
                   shares.size() << " shares for " << replicas << " replicas");
  std::vector<int64_t> counts(replicas, 0);
  if (shares.empty()) {
    for (size_t r = 0; r < replicas; ++r)
      counts[r] = n / static_cast<int64_t>(replicas) +
                  (static_cast<int64_t>(r) < n % static_cast<int64_t>(replicas) ? 1 : 0);
    return counts;
  }
  double largest = 0;
  for (double s : shares) {
    TANDEM_CHECK_MSG(s >= 0 && std::isfinite(s), InvalidArgument,
                     "a replica's share must be a non-negative number, got " << s);
    largest = std::max(largest, s);
  }
  TANDEM_CHECK_MSG(largest > 0, InvalidArgument, "the replicas' shares add up to 0");
  // As fractions of the largest, so that neither their sum nor n times one overflows
  // (shares of 1e308 each are as good as shares of 1).
  double total = 0;
  for (double s : shares) total += s / largest;
  std::vector<double> remainder(replicas);
  int64_t given = 0;
  for (size_t r = 0; r < replicas; ++r) {
    const double exact = static_cast<double>(n) * (shares[r] / largest / total);
    counts[r] = static_cast<int64_t>(exact);
    remainder[r] = exact - static_cast<double>(counts[r]);
    given += counts[r];
  }
  std::vector<size_t> order(replicas);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return remainder[a] > remainder[b]; });
  for (size_t i = 0; given < n; ++i, ++given) ++counts[order[i % replicas]];
  return counts;
}

std::vector<double> sharesFromProfile(const Profile& profile, const Model& model,
                                      const std::vector<std::string>& devices,
                                      const std::string& where) {
  TANDEM_CHECK_MSG(profile.batch > 0, InvalidArgument,
                   where << " measures no batch (a profile of links only?)");
  std::vector<double> shares;
  for (const std::string& name : devices) {
    const DeviceProfile& d = deviceProfile(profile, model, name, where);
    double seconds = d.loss.median;
    for (const LayerProfile& lp : d.layers) seconds += lp.forward.median + lp.backward.median;
    TANDEM_CHECK_MSG(
        seconds > 0 && std::isfinite(seconds), InvalidArgument,
        where << ": device '" << name << "' has no time measured (" << seconds << " s)");
    shares.push_back(static_cast<double>(profile.batch) / seconds);  // samples per second
  }
  return shares;
}

struct DataParallelTrainer::Replica {
  Replica(const ModelSpec& spec, Backend& be, Group& g, const OptimizerOptions& o,
          std::chrono::microseconds spin)
      : backend(be), group(g), model(spec), optimizer(be, o), compute(spin), comm(spin) {}

  Backend& backend;
  Group& group;
  Model model;
  Optimizer optimizer;
  std::vector<Bucket> buckets;
  std::vector<std::vector<size_t>> ready_at;  // by layer: buckets complete after it
  JobThread compute, comm;
  // The communication queue: buckets handed over, in order; how many are reduced.
  std::mutex mutex;
  std::condition_variable cv;
  size_t handed = 0, reduced = 0;
  bool failed = false;  // either thread gave up: the other stops waiting for it
  double loss_sum = 0;
  std::vector<float> x;  // this replica's share of the batch, when it gathers it
  std::vector<int32_t> y;
};

DataParallelTrainer::DataParallelTrainer(const ModelSpec& spec,
                                         const std::vector<Backend*>& backends,
                                         const std::vector<Group*>& groups,
                                         const OptimizerOptions& optimizer,
                                         const DataParallelOptions& options)
    : options_(options) {
  TANDEM_CHECK_MSG(
      !backends.empty() && backends.size() == groups.size(), InvalidArgument,
      "data parallel: " << backends.size() << " backends and " << groups.size() << " group ranks");
  TANDEM_CHECK_MSG(options.batch > 0, InvalidArgument,
                   "batch size " << options.batch << " must be positive");
  TANDEM_CHECK_MSG(options.bucket_bytes >= 4, InvalidArgument,
                   "bucket size " << options.bucket_bytes << " bytes is below one gradient");
  shareBatch(options.batch, backends.size(), options.shares);  // checks the shares
  // Every replica must cut the same buckets: reduce in place only if all hold host memory.
  bool host_memory = true;
  for (Backend* be : backends) host_memory = host_memory && be->hostData(be->empty({1})) != nullptr;
  inline_comm_ = host_memory;
  for (size_t r = 0; r < backends.size(); ++r) {
    TANDEM_CHECK_MSG(groups[r]->size() == static_cast<int>(backends.size()) &&
                         groups[r]->rank() == static_cast<int>(r),
                     InvalidArgument,
                     "data parallel: replica " << r << " was given rank " << groups[r]->rank()
                                               << " of " << groups[r]->size());
    auto rep = std::make_unique<Replica>(spec, *backends[r], *groups[r], optimizer,
                                         waitBeforeSleeping(static_cast<int>(backends.size())));
    rep->model.build(*backends[r], options.seed);
    // Buckets from the last layer down, whole parameters, about bucket_bytes each.
    const size_t L = rep->model.size();
    rep->ready_at.resize(L);
    Bucket current;
    size_t bytes = 0;
    // On backends of host memory each parameter is its own bucket, reduced where it
    // lies: no copies.
    auto close = [&] {
      if (current.params.empty()) return;
      size_t count = 0;
      for (Param* p : current.params) count += static_cast<size_t>(p->grad.numel());
      if (host_memory) {
        const void* grad = backends[r]->hostData(current.params[0]->grad);
        current.in_place = {const_cast<float*>(static_cast<const float*>(grad)), count};
      } else {
        current.host.resize(count);
      }
      rep->ready_at[current.lowest_layer].push_back(rep->buckets.size());
      rep->buckets.push_back(std::move(current));
      current = Bucket{};
      bytes = 0;
    };
    for (size_t l = L; l-- > 0;) {
      for (Param* p : rep->model.layer(l).params()) {
        current.params.push_back(p);
        current.lowest_layer = l;
        bytes += p->grad.bytes();
        if (host_memory) close();
      }
      if (bytes >= options.bucket_bytes || l == 0) close();
    }
    replicas_.push_back(std::move(rep));
  }
}

DataParallelTrainer::~DataParallelTrainer() = default;

Model& DataParallelTrainer::model(size_t replica) { return replicas_.at(replica)->model; }
Optimizer& DataParallelTrainer::optimizer(size_t replica) {
  return replicas_.at(replica)->optimizer;
}

double DataParallelTrainer::step(const float* x, const int32_t* labels, int64_t n) {
  const int64_t per_sample = replicas_[0]->model.inputShape().numel();
  const int64_t per_label = labelsPerSample(replicas_[0]->model);
  return run(n, [&](size_t, int64_t first, int64_t) {
    return std::make_pair(x + first * per_sample, labels + first * per_label);
  });
}

double DataParallelTrainer::step(const Dataset& data, const std::vector<int64_t>& order,
                                 int64_t begin, int64_t n) {
  // Checked here, not on the replicas' threads, where a failing gather would leave the
  // others waiting for its gradients until the timeout.
  checkClassifier(replicas_[0]->model, data);
  checkBatch(data, order, begin, n);
  return run(n, [&](size_t r, int64_t first, int64_t count) {
    Replica& rep = *replicas_[r];
    gatherBatch(data, order, begin + first, count, rep.x, rep.y);
    return std::pair<const float*, const int32_t*>(rep.x.data(), rep.y.data());
  });
}

double DataParallelTrainer::run(int64_t n, const Share& share) {
  const std::vector<int64_t> counts = shareBatch(n, replicas_.size(), options_.shares);
  const uint64_t global_step = static_cast<uint64_t>(global_step_);
  int64_t offset = 0;
  std::function<void()> first_compute;
  for (size_t r = 0; r < replicas_.size(); ++r) {
    Replica& rep = *replicas_[r];
    const int64_t count = counts[r], first = offset;
    offset += count;
    rep.handed = rep.reduced = 0;
    rep.failed = false;
    rep.loss_sum = 0;
    auto failing = [&rep](const std::function<void()>& body) {
      try {
        body();
      } catch (...) {
        std::lock_guard lock(rep.mutex);
        rep.failed = true;
        rep.cv.notify_all();
        throw;
      }
    };
    // Communication: each bucket as it is handed over, in order — on a thread of its
    // own when the reduction can overlap the compute (device replicas: the host does the
    // summing while the device runs backward), else on the compute thread as soon as
    // the bucket is ready (CPU replicas: the summing is CPU work itself, and a hand-over
    // to another thread costs a wake-up per bucket).
    if (!inline_comm_)
      rep.comm.run([this, &rep, failing] {
        failing([&] {
          AllreduceOptions o;
          o.timeout = options_.timeout;
          for (size_t b = 0; b < rep.buckets.size(); ++b) {
            {
              std::unique_lock lock(rep.mutex);
              rep.cv.wait(lock, [&] { return rep.handed > b || rep.failed; });
              if (rep.handed <= b) return;  // the compute thread failed
            }
            o.tag = b;
            allreduce(rep.group, rep.buckets[b].data(), o);
            std::lock_guard lock(rep.mutex);
            rep.reduced = b + 1;
            rep.cv.notify_all();
          }
        });
      });
    auto compute = [this, &rep, failing, &share, n, count, first, global_step, r] {
      failing([&] {
        Backend& be = rep.backend;
        Model& model = rep.model;
        const size_t L = model.size();
        model.zeroGrad();
        auto handOver = [&](size_t layer) {
          for (size_t b : rep.ready_at[layer]) {
            Bucket& bucket = rep.buckets[b];
            if (bucket.in_place.empty()) {  // device memory: to the host first
              size_t at = 0;
              for (Param* p : bucket.params) {
                be.download(p->grad, bucket.host.data() + at);
                at += static_cast<size_t>(p->grad.numel());
              }
            }
            if (inline_comm_) {
              AllreduceOptions o;
              o.timeout = options_.timeout;
              o.tag = b;
              allreduce(rep.group, bucket.data(), o);
              rep.handed = rep.reduced = b + 1;
              continue;
            }
            std::lock_guard lock(rep.mutex);
            rep.handed = b + 1;
            rep.cv.notify_all();
          }
        };
        if (count > 0) {
          const auto [x, labels] = share(r, first, count);
          const int64_t per_label = labelsPerSample(model);
          Tensor h = uploadSamples(be, model, x, count);
          Tensor y = be.empty({count * per_label}, DType::kI32);
          be.upload(y, labels);
          // Layer by layer, as one forward would (each layer seeds from its index).
          const ForwardContext ctx{true,
                                   microbatchSeed(options_.seed, static_cast<int64_t>(global_step),
                                                  static_cast<int64_t>(r))};
          std::vector<Stash> stashes(L);
          for (size_t l = 0; l < L; ++l) h = model.forward(h, stashes[l], ctx, l, l + 1);
          Tensor g = be.empty(h.shape());
          rep.loss_sum =
              softmaxCrossEntropy(be, h, y, 1.0f / static_cast<float>(n * per_label), g) /
              static_cast<double>(per_label);
          size_t first_param = L;
          for (size_t l = 0; l < L && first_param == L; ++l)
            if (model.layer(l).paramCount() > 0) first_param = l;
          for (size_t l = L; l-- > 0;) {
            if (l >= first_param) g = model.backward(g, stashes[l], l > first_param, l, l + 1);
            stashes[l].clear();
            handOver(l);
          }
        } else {
          for (size_t l = L; l-- > 0;) handOver(l);  // zeros: this replica had no samples
        }
        {
          std::unique_lock lock(rep.mutex);
          rep.cv.wait(lock, [&] { return rep.reduced == rep.buckets.size() || rep.failed; });
          TANDEM_CHECK_MSG(rep.reduced == rep.buckets.size(), Error,
                           "replica " << r
                                      << ": its gradients were not summed (see the "
                                         "communication error)");
        }
        for (Bucket& bucket : rep.buckets) {
          if (!bucket.in_place.empty()) continue;
          size_t at = 0;
          for (Param* p : bucket.params) {
            be.upload(p->grad, bucket.host.data() + at);
            at += static_cast<size_t>(p->grad.numel());
          }
        }
        rep.optimizer.step(model.params());
      });
    };
    // Replica 0 computes on the caller's thread (one hand-over fewer per step).
    if (r == 0) {
      first_compute = std::move(compute);
    } else {
      rep.compute.run(std::move(compute));
    }
  }
  // Every replica's threads finish (a failed collective times out the others); the first
  // error is raised.
  std::exception_ptr error;
  try {
    first_compute();
  } catch (...) {
    error = std::current_exception();
  }
  auto join = [&error](JobThread& w) {
    try {
      w.wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  };
  for (size_t r = 0; r < replicas_.size(); ++r) {
    if (!inline_comm_) join(replicas_[r]->comm);
    if (r > 0) join(replicas_[r]->compute);  // replica 0 ran on this thread
  }
  if (error) std::rethrow_exception(error);
  ++global_step_;
  double loss = 0;
  for (auto& rep : replicas_) loss += rep->loss_sum;
  return loss / static_cast<double>(n);
}

EpochReport DataParallelTrainer::trainEpoch(
    const Dataset& data, int64_t epoch, const std::function<void(const StepReport&)>& progress) {
  return datasetEpoch(
      replicas_[0]->model, data, epoch, options_.batch, options_.shuffle, options_.seed,
      [&](const std::vector<int64_t>& order, int64_t begin, int64_t n) {
        return step(data, order, begin, n);
      },
      progress);
}

}  // namespace tandem
