#include "core/train/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <map>
#include <utility>

#include "core/error.h"
#include "core/loss.h"
#include "core/spin.h"
#include "core/train/gradient_buckets.h"
#include "core/train/job_thread.h"
#include "core/train/microbatch.h"

namespace tandem {

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
    shares.push_back(static_cast<double>(d.batchIn(profile)) / seconds);  // samples per second
  }
  return shares;
}

std::vector<StateShard> stateShards(const std::vector<int64_t>& rows,
                                    const std::vector<int64_t>& row_bytes, size_t replicas,
                                    const std::vector<double>& shares) {
  TANDEM_CHECK_MSG(replicas > 0, InvalidArgument, "optimizer state shared by no replica");
  TANDEM_CHECK_MSG(rows.size() == row_bytes.size(), InvalidArgument,
                   rows.size() << " row counts for " << row_bytes.size() << " row sizes");
  TANDEM_CHECK_MSG(shares.empty() || shares.size() == replicas, InvalidArgument,
                   shares.size() << " state shares for " << replicas << " replicas");
  for (const double s : shares)
    TANDEM_CHECK_MSG(s > 0 && std::isfinite(s), InvalidArgument,
                     "state share " << s << " is not a positive number");
  double total = 0, room = 0;
  for (size_t i = 0; i < rows.size(); ++i)
    total += static_cast<double>(rows[i]) * static_cast<double>(row_bytes[i]);
  for (size_t r = 0; r < replicas; ++r) room += shares.empty() ? 1.0 : shares[r];
  // Replica r's run ends where the bytes before it reach its cumulative share of `total`.
  std::vector<double> ends;
  double cumulative = 0;
  for (size_t r = 0; r + 1 < replicas; ++r) {
    cumulative += shares.empty() ? 1.0 : shares[r];
    ends.push_back(total * cumulative / room);
  }
  std::vector<StateShard> out;
  size_t owner = 0;
  double before = 0;  // bytes of the rows before parameter i
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto w = static_cast<double>(row_bytes[i]);
    if (rows[i] <= 0 || w <= 0) continue;  // (no values: no state)
    const double after = before + w * static_cast<double>(rows[i]);
    // The current run ends at the row boundary nearest its end: inside this parameter (the
    // next run goes on from there), at or before its start (nothing of it here), or past
    // its end (it takes the rest and goes on into the next parameter).
    for (int64_t begin = 0; begin < rows[i];) {
      const bool last = owner == ends.size();
      const int64_t end_row = last ? rows[i] : std::llround((ends[owner] - before) / w);
      const int64_t cut = std::clamp<int64_t>(end_row, begin, rows[i]);
      if (cut > begin) out.push_back({i, begin, cut, static_cast<int>(owner)});
      begin = cut;
      if (last || end_row > rows[i]) break;
      ++owner;
    }
    before = after;
  }
  return out;
}

struct DataParallelTrainer::Replica {
  Replica(const ModelSpec& spec, Backend& be, Group& g, const OptimizerOptions& o,
          std::chrono::microseconds spin)
      : backend(be), group(g), model(spec), optimizer(be, o), compute(spin) {}

  Backend& backend;
  Group& group;
  Model model;
  Optimizer optimizer;
  std::unique_ptr<GradientBuckets> buckets;
  JobThread compute;
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
  TANDEM_CHECK_MSG(options.zero == 0 || options.zero == 1, InvalidArgument,
                   "ZeRO stage " << options.zero
                                 << ": 0 (every replica keeps the optimizer state) or 1 (a shard "
                                    "of it on each) are implemented");
  TANDEM_CHECK_MSG(options.zero == 0 || backends.size() > 1, InvalidArgument,
                   "ZeRO stage " << options.zero << " shards the optimizer state over "
                                 << "replicas: it needs two or more, not " << backends.size());
  // Every replica must cut the same buckets: reduce in place only if all hold host memory.
  bool host_memory = true;
  for (Backend* be : backends) host_memory = host_memory && be->hostData(be->empty({1})) != nullptr;
  for (size_t r = 0; r < backends.size(); ++r) {
    TANDEM_CHECK_MSG(groups[r]->size() == static_cast<int>(backends.size()) &&
                         groups[r]->rank() == static_cast<int>(r),
                     InvalidArgument,
                     "data parallel: replica " << r << " was given rank " << groups[r]->rank()
                                               << " of " << groups[r]->size());
    auto rep = std::make_unique<Replica>(spec, *backends[r], *groups[r], optimizer,
                                         waitBeforeSleeping(static_cast<int>(backends.size())));
    rep->model.build(*backends[r], options.seed);
    // Every replica must cut the same buckets: in place (one per parameter, summed where
    // it lies on the compute thread) only if all hold host memory; else copied to the
    // host and summed on a communication thread while the device runs backward.
    BucketOptions bo;
    bo.bucket_bytes = options.bucket_bytes;
    bo.timeout = options.timeout;
    bo.in_place = host_memory;
    bo.comm_thread = !host_memory;
    rep->buckets =
        std::make_unique<GradientBuckets>(rep->model, 0, rep->model.size(), *groups[r], bo);
    replicas_.push_back(std::move(rep));
  }
  if (options.zero == 1) {
    std::vector<int64_t> rows, row_bytes;
    for (const Param* p : replicas_[0]->model.params()) {
      const bool whole = p->value.shape().rank() == 0 || !p->grad.defined() ||
                         p->value.dtype() != DType::kF32;  // (no state, or no rows to cut)
      rows.push_back(whole ? 1 : p->value.shape()[0]);
      row_bytes.push_back(p->grad.defined() ? static_cast<int64_t>(p->value.bytes()) /
                                                  std::max<int64_t>(1, rows.back())
                                            : 0);
    }
    shards_ = stateShards(rows, row_bytes, replicas_.size(), options.state_shares);
  }
}

DataParallelTrainer::~DataParallelTrainer() = default;

Model& DataParallelTrainer::model(size_t replica) { return replicas_.at(replica)->model; }
Optimizer& DataParallelTrainer::optimizer(size_t replica) {
  return replicas_.at(replica)->optimizer;
}

int64_t DataParallelTrainer::stateBytes(size_t replica) const {
  int64_t bytes = 0;
  for (const auto& [name, t] : replicas_.at(replica)->optimizer.state()) bytes += t.bytes();
  return bytes;
}

namespace {

// The rows [begin, end) of parameter p as a parameter of their own (the same name: a
// replica's optimizer keys its shard's state by it); the whole parameter when they are all.
Param rowsOf(const Param& p, int64_t begin, int64_t end) {
  if (begin == 0 && (p.value.shape().rank() == 0 || end == p.value.shape()[0])) return p;
  Param part;
  part.name = p.name;
  part.value = p.value.slice(begin, end - begin);
  part.grad = p.grad.slice(begin, end - begin);
  return part;
}

}  // namespace

std::unique_ptr<Optimizer> DataParallelTrainer::mergedOptimizer() const {
  const Replica& first = *replicas_[0];
  auto merged = std::make_unique<Optimizer>(first.backend, first.optimizer.options());
  std::vector<std::pair<std::string, Tensor>> state;
  if (options_.zero == 0) {
    state = first.optimizer.state();  // (every replica holds the same)
  } else {
    // Each parameter's slots assembled on replica 0's backend from its shards' rows.
    std::vector<std::map<std::string, Tensor>> held(replicas_.size());
    for (size_t r = 0; r < replicas_.size(); ++r)
      for (auto& [key, t] : replicas_[r]->optimizer.state()) held[r][key] = t;
    const std::vector<Param*> params = first.model.params();
    std::map<std::string, Tensor> whole;
    std::vector<float> rows;
    for (const StateShard& s : shards_) {
      const Param& p = *params[s.param];
      for (const auto& [key, t] : held[static_cast<size_t>(s.owner)]) {
        if (key.compare(0, p.name.size() + 1, p.name + ".") != 0 ||
            key.find('.', p.name.size() + 1) != std::string::npos)
          continue;  // another parameter's
        auto [at, fresh] = whole.try_emplace(key);
        if (fresh) at->second = first.backend.empty(p.value.shape());
        rows.resize(static_cast<size_t>(t.numel()));
        t.backend().download(t, rows.data());
        const Tensor into = rowsOf(Param{p.name, at->second, at->second, {}}, s.begin, s.end).value;
        first.backend.upload(into, rows.data());
      }
    }
    for (auto& [key, t] : whole) state.emplace_back(key, t);
  }
  merged->restore(state, first.optimizer.steps());
  return merged;
}

void DataParallelTrainer::stepOwned(Replica& rep, size_t r) {
  const std::vector<Param*> params = rep.model.params();
  std::vector<Param> mine;
  for (const StateShard& s : shards_)
    if (s.owner == static_cast<int>(r)) mine.push_back(rowsOf(*params[s.param], s.begin, s.end));
  std::vector<Param*> owned;
  for (Param& p : mine) owned.push_back(&p);
  rep.optimizer.step(owned);
  std::vector<float> values;
  RootOptions ro;
  ro.timeout = options_.timeout;
  for (size_t k = 0; k < shards_.size(); ++k) {
    const StateShard& s = shards_[k];
    const Tensor v = rowsOf(*params[s.param], s.begin, s.end).value;
    const auto n = static_cast<size_t>(v.numel());
    const bool own = s.owner == static_cast<int>(r);
    ro.root = s.owner;
    ro.tag = k;
    // Host memory (a CPU replica) is broadcast where it lies, as the gradient buckets sum it.
    if (const void* host = rep.backend.hostData(v)) {
      rep.group.broadcast({const_cast<float*>(static_cast<const float*>(host)), n}, ro);
      continue;
    }
    values.resize(n);
    if (own) rep.backend.download(v, values.data());
    rep.group.broadcast(values, ro);
    if (!own) rep.backend.upload(v, values.data());
  }
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
    rep.loss_sum = 0;
    auto compute = [this, &rep, &share, n, count, first, global_step, r] {
      Backend& be = rep.backend;
      Model& model = rep.model;
      GradientBuckets& buckets = *rep.buckets;
      const size_t L = model.size();
      model.zeroGrad();
      buckets.start(0);
      try {
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
            buckets.layerDone(l);
          }
        }  // else zeros: this replica had no samples; finish() sends its buckets as they are
        buckets.finish();
      } catch (...) {
        buckets.abandon();
        throw;
      }
      if (options_.zero == 0)
        rep.optimizer.step(model.params());
      else
        stepOwned(rep, r);
    };
    // Replica 0 computes on the caller's thread (one hand-over fewer per step).
    if (r == 0) {
      first_compute = std::move(compute);
    } else {
      rep.compute.run(std::move(compute));
    }
  }
  // Every replica's thread finishes (a failed collective times out the others); the first
  // error is raised.
  std::exception_ptr error;
  try {
    first_compute();
  } catch (...) {
    error = std::current_exception();
  }
  for (size_t r = 1; r < replicas_.size(); ++r) {  // replica 0 ran on this thread
    try {
      replicas_[r]->compute.wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
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
