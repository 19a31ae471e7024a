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
#include "core/train/parameter_shards.h"

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

struct DataParallelTrainer::Replica {
  Replica(const ModelSpec& spec, Backend& be, Group& g, const OptimizerOptions& o,
          std::chrono::microseconds spin)
      : backend(be), group(g), model(spec), optimizer(be, o), compute(spin) {}

  Backend& backend;
  Group& group;
  Model model;
  Optimizer optimizer;
  std::unique_ptr<GradientBuckets> buckets;
  std::unique_ptr<ParameterShards> values;  // ZeRO 3
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
  TANDEM_CHECK_MSG(options.zero >= 0 && options.zero <= 3, InvalidArgument,
                   "ZeRO stage " << options.zero
                                 << ": 0 (every replica keeps the optimizer state), 1 (a shard "
                                    "of it on each), 2 (and of the summed gradients) or 3 (and "
                                    "of the parameters)");
  TANDEM_CHECK_MSG(options.zero == 0 || backends.size() > 1, InvalidArgument,
                   "ZeRO stage " << options.zero << " shards the optimizer state over "
                                 << "replicas: it needs two or more, not " << backends.size());
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
    replicas_.push_back(std::move(rep));
  }
  if (options.zero > 0)
    shards_ = modelStateShards(replicas_[0]->model, replicas_.size(), options.state_shares);
  for (size_t r = 0; r < replicas_.size(); ++r) {
    // Every replica must cut the same buckets: in place (one per parameter, summed where
    // it lies on the compute thread) only if all hold host memory; else copied to the
    // host and summed on a communication thread while the device runs backward. At ZeRO
    // stage 2 each run of rows is reduced into its owner alone.
    BucketOptions bo;
    bo.bucket_bytes = options.bucket_bytes;
    bo.timeout = options.timeout;
    bo.in_place = host_memory;
    bo.comm_thread = !host_memory;
    if (options.zero >= 2) bo.shards = shards_;
    Model& model = replicas_[r]->model;
    replicas_[r]->buckets =
        std::make_unique<GradientBuckets>(model, 0, model.size(), *groups[r], bo);
    if (options.zero == 3)
      replicas_[r]->values =
          std::make_unique<ParameterShards>(model, *groups[r], shards_, options.timeout);
  }
}

DataParallelTrainer::~DataParallelTrainer() = default;

Model& DataParallelTrainer::model(size_t replica) {
  Replica& rep = *replicas_.at(replica);
  if (rep.values) rep.values->makeWhole(parameterShards());
  return rep.model;
}

std::vector<const ParameterShards*> DataParallelTrainer::parameterShards() const {
  std::vector<const ParameterShards*> all;
  for (const auto& rep : replicas_) all.push_back(rep->values.get());
  return all;
}

int64_t DataParallelTrainer::parameterBytes(size_t replica) const {
  const Replica& rep = *replicas_.at(replica);
  if (rep.values) return rep.values->keptBytes();
  int64_t bytes = 0;
  for (const Param* p : rep.model.params()) bytes += static_cast<int64_t>(p->value.bytes());
  return bytes;
}

int64_t DataParallelTrainer::peakParameterBytes(size_t replica) const {
  const Replica& rep = *replicas_.at(replica);
  return rep.values ? rep.values->peakParameterBytes() : parameterBytes(replica);
}
Optimizer& DataParallelTrainer::optimizer(size_t replica) {
  return replicas_.at(replica)->optimizer;
}

int64_t DataParallelTrainer::stateBytes(size_t replica) const {
  int64_t bytes = 0;
  for (const auto& [name, t] : replicas_.at(replica)->optimizer.state()) bytes += t.bytes();
  return bytes;
}

int64_t DataParallelTrainer::peakGradientBytes(size_t replica) const {
  return replicas_.at(replica)->buckets->peakGradientBytes();
}

int64_t DataParallelTrainer::gradientBytes(size_t replica) const {
  return replicas_.at(replica)->buckets->gradientBytes();
}

std::unique_ptr<Optimizer> DataParallelTrainer::mergedOptimizer() const {
  const Replica& first = *replicas_[0];
  // (ZeRO 3: replica 0's parameters whole first, whose shapes the merged state takes.)
  if (first.values) replicas_[0]->values->makeWhole(parameterShards());
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
        if (!isSlotOf(key, p.name)) continue;  // another parameter's
        auto [at, fresh] = whole.try_emplace(key);
        if (fresh) at->second = first.backend.empty(p.value.shape());
        rows.resize(static_cast<size_t>(t.numel()));
        t.backend().download(t, rows.data());
        const Tensor into = shardOf(at->second, params, s);
        first.backend.upload(into, rows.data());
      }
    }
    for (auto& [key, t] : whole) state.emplace_back(key, t);
  }
  merged->restore(state, first.optimizer.steps());
  return merged;
}

void DataParallelTrainer::stepOwned(Replica& rep, size_t r) {
  // Stages 2 and 3: the buckets hold this replica's rows' sums (and no other gradient);
  // at stage 3 its rows' values are the masters, which the next gathers make whole again.
  std::vector<Param> mine;
  if (options_.zero >= 2) {
    mine = rep.buckets->ownedParams();
  } else {
    mine = ownedRows(rep.model.params(), shards_, static_cast<int>(r));
  }
  if (options_.zero == 3) {
    const std::vector<Param> values = rep.values->owned();
    for (size_t k = 0; k < mine.size(); ++k) mine[k].value = values[k].value;
  }
  std::vector<Param*> owned;
  for (Param& p : mine) owned.push_back(&p);
  rep.optimizer.step(owned);
  if (options_.zero < 3) shareSteppedRows(rep.model, rep.group, shards_, 0, options_.timeout);
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

void DataParallelTrainer::replicaStep(Replica& rep, size_t r, int64_t n, const float* x,
                                      const int32_t* labels, int64_t count, uint64_t global_step) {
  Backend& be = rep.backend;
  Model& model = rep.model;
  GradientBuckets& buckets = *rep.buckets;
  ParameterShards* values = rep.values.get();  // ZeRO 3; else null
  const size_t L = model.size();
  model.zeroGrad();
  buckets.start(0);
  try {
    // Layer by layer, as one forward would (each layer seeds from its index). A replica
    // without samples this step computes nothing but takes part in every collective:
    // its gradients are zeros.
    std::vector<Stash> stashes(L);
    const ForwardContext ctx{true, microbatchSeed(options_.seed, static_cast<int64_t>(global_step),
                                                  static_cast<int64_t>(r))};
    Tensor h, g;
    if (count > 0) h = uploadSamples(be, model, x, count);
    for (size_t l = 0; l < L; ++l) {
      if (values) values->gather(l);
      if (count > 0) h = model.forward(h, stashes[l], ctx, l, l + 1);
      if (values) values->release(l);
    }
    if (count > 0) {
      const int64_t per_label = labelsPerSample(model);
      Tensor y = be.empty({count * per_label}, DType::kI32);
      be.upload(y, labels);
      g = be.empty(h.shape());
      rep.loss_sum = softmaxCrossEntropy(be, h, y, 1.0f / static_cast<float>(n * per_label), g) /
                     static_cast<double>(per_label);
    }
    size_t first_param = L;
    for (size_t l = 0; l < L && first_param == L; ++l)
      if (model.layer(l).paramCount() > 0) first_param = l;
    for (size_t l = L; l-- > 0;) {
      if (values) values->gather(l);
      if (count > 0 && l >= first_param) {
        buckets.layerStarts(l);
        g = model.backward(g, stashes[l], l > first_param, l, l + 1);
      }
      stashes[l].clear();
      buckets.layerDone(l);
      if (values) values->release(l);
    }
    buckets.finish();
  } catch (...) {
    buckets.abandon();
    throw;
  }
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
      const std::pair<const float*, const int32_t*> samples =
          count > 0 ? share(r, first, count) : std::pair<const float*, const int32_t*>{};
      replicaStep(rep, r, n, samples.first, samples.second, count, global_step);
      if (options_.zero == 0)
        rep.optimizer.step(rep.model.params());
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
