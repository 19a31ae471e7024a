#include "core/pipeline/executor.h"

#include <algorithm>

#include "core/error.h"
#include "core/host_limits.h"
#include "core/loss.h"
#include "core/train/microbatch.h"
#include "core/train/trainer.h"

namespace tandem {

namespace {
double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}
}  // namespace

StageRange StageRange::interleaved(int stage, int stages, std::vector<LayerRange> chunks) {
  TANDEM_CHECK_MSG(!chunks.empty(), InvalidArgument, "stage " << stage << " has no chunks");
  StageRange r(stage, stages, chunks.front().begin, chunks.back().end);
  if (chunks.size() > 1) r.chunks = std::move(chunks);
  return r;
}

StageExecutor::StageExecutor(Model& model, StageRange range, Link* prev, Link* next,
                             Optimizer* optimizer, ExecutorOptions options)
    : model_(model),
      backend_(model.backend()),
      range_(range),
      prev_(prev),
      next_(next),
      optimizer_(optimizer),
      options_(options) {
  TANDEM_CHECK_MSG(range.stages > 0 && range.stage >= 0 && range.stage < range.stages,
                   InvalidArgument, "stage " << range.stage << " of " << range.stages);
  const int v = range.chunkCount();
  for (int c = 0; c < v; ++c) {
    const LayerRange r = range.chunk(c);
    TANDEM_CHECK_MSG(
        r.begin < r.end && r.end <= model.size() && (c == 0 || range.chunk(c - 1).end <= r.begin),
        InvalidArgument,
        "stage " << range.stage << ": layers " << describe({r})
                 << (v > 1 ? " (chunk " + std::to_string(c) + ")" : std::string())
                 << (c > 0 && range.chunk(c - 1).end > r.begin
                         ? " do not come after the chunk before"
                         : " of a model with " + std::to_string(model.size())));
  }
  TANDEM_CHECK_MSG(v == 1 || range.stages > 1, InvalidArgument,
                   "an interleaved stage needs other stages to pass its chunks through");
  if (optimizer) {  // a training stage
    for (int c = 0; c < v; ++c) model.requireTrainable(range.chunk(c).begin, range.chunk(c).end);
  }
  TANDEM_CHECK_MSG(v == 1 || !replicated(), Unsupported,
                   "stage " << range.stage << ": interleaved stages cannot have replicas");
  // Interleaved: the first stage's chunks after the first take their input from the
  // last stage, whose chunks but the last send to it.
  TANDEM_CHECK_MSG((range.first() && v == 1) == (prev == nullptr), InvalidArgument,
                   "stage " << range.stage << ": a link to the previous stage is needed exactly "
                            << "when the stage is not the first"
                            << (v > 1 ? " or holds several chunks" : ""));
  TANDEM_CHECK_MSG((range.last() && v == 1) == (next == nullptr), InvalidArgument,
                   "stage " << range.stage << ": a link to the next stage is needed exactly "
                            << "when the stage is not the last"
                            << (v > 1 ? " or holds several chunks" : ""));
  TANDEM_CHECK_MSG(
      options.zero >= 0 && options.zero <= 2, InvalidArgument,
      "stage " << range.stage << ": ZeRO stage " << options.zero
               << (options.zero == 3 ? " would gather the stage's parameters for every "
                                       "microbatch: a pipeline stage's replicas shard 1 (the "
                                       "optimizer state) or 2 (and the summed gradients)"
                                     : ": 0, 1 or 2"));
  TANDEM_CHECK_MSG(options.zero == 0 || replicated(), InvalidArgument,
                   "stage " << range.stage << ": ZeRO stage " << options.zero
                            << " shards the training state over the stage's replicas, and it "
                               "has none");
  if (replicated() && optimizer != nullptr) {
    if (options.zero > 0) {
      shards_ = modelStateShards(model, static_cast<size_t>(options.replicas->size()),
                                 options.state_shares);
      // A whole state restored (a checkpoint's) keeps only this replica's rows.
      if (!optimizer->state().empty())
        optimizer->restore(
            stateOfShards(optimizer->state(), model, shards_, options.replicas->rank()),
            optimizer->steps());
    }
    BucketOptions bo;
    if (options.zero == 2) bo.shards = shards_;
    bo.bucket_bytes = options.bucket_bytes;
    bo.timeout = options.collective_timeout;
    // A device's buckets are summed on a communication thread while the device runs
    // the rest of backward; a CPU stage sums each bucket on its compute thread as it is
    // ready, since the summing is CPU work that would compete with backward anyway
    // (docs/collectives.md has the measurements behind this).
    bo.comm_thread = backend_.hostData(backend_.empty({1})) == nullptr;
    buckets_ =
        std::make_unique<GradientBuckets>(model, range.begin, range.end, *options.replicas, bo);
  }
}

int64_t StageExecutor::peakGradientBytes() const {
  if (buckets_) return buckets_->peakGradientBytes();
  int64_t bytes = 0;
  for (const Param* p : model_.params())
    if (p->grad.defined()) bytes += static_cast<int64_t>(p->grad.bytes());
  return bytes;
}

void StageExecutor::optimizerStep() {
  if (shards_.empty()) {
    optimizer_->step(model_.params());
    return;
  }
  // Sharded: this replica's rows (at ZeRO 2 the buckets hold their sums), then every
  // replica's rows to the others.
  std::vector<Param> mine;
  if (options_.zero == 2) {
    mine = buckets_->ownedParams();
  } else {
    mine = ownedRows(model_.params(), shards_, options_.replicas->rank());
  }
  std::vector<Param*> owned;
  for (Param& p : mine) owned.push_back(&p);
  optimizer_->step(owned);
  shareSteppedRows(model_, *options_.replicas, shards_, collectives_, options_.collective_timeout);
  collectives_ += shards_.size();
}

std::vector<std::pair<std::string, Tensor>> StageExecutor::gatherOptimizerState() {
  TANDEM_CHECK_MSG(sharded() && optimizer_ != nullptr, InvalidArgument,
                   "stage " << range_.stage << ": its optimizer state is not sharded");
  auto whole = gatherShardedState(*optimizer_, model_, *options_.replicas, shards_, collectives_,
                                  options_.collective_timeout);
  collectives_ += shards_.size() * stateSlots(optimizer_->options()).size();
  return whole;
}

void StageExecutor::record(ActionType type, int64_t k, Clock::time_point t0, double& counter) {
  const auto t1 = Clock::now();
  counter += seconds(t1 - t0);
  if (!options_.record_spans) return;
  int64_t g = tag_base_ + k;
  if (g >= kFirstEvaluationMicrobatch) g -= kFirstEvaluationMicrobatch;
  spans_.push_back({type, g, seconds(t0.time_since_epoch()), seconds(t1.time_since_epoch())});
}

StepResult StageExecutor::run(const std::vector<Action>& actions, const StepInfo& info,
                              const std::function<MicrobatchInput(int64_t)>& input,
                              const std::function<void(int64_t)>& before_input) {
  TANDEM_CHECK_MSG(info.first_microbatch >= -1 && info.first_microbatch <= kMaxMicrobatchNumber,
                   InvalidArgument,
                   "stage " << range_.stage << ": microbatch number " << info.first_microbatch
                            << " is not in [-1, 2^50]");
  if (info.first_microbatch >= 0) tag_base_ = info.first_microbatch;
  try {
    return runActions(actions, info, input, before_input);
  } catch (...) {
    if (buckets_) buckets_->abandon();  // its communication thread waits no more
    throw;
  }
}

std::pair<int64_t, std::vector<bool>> StageExecutor::checkActions(
    const std::vector<Action>& actions, const StepInfo& info) const {
  const int v = range_.chunkCount();
  int64_t m = 0;
  // Per chunk: backwards leave the weight gradients to their own action.
  std::vector<bool> split(static_cast<size_t>(v), false);
  for (const Action& a : actions) {
    if (a.type == ActionType::kStep) continue;
    m = std::max(m, a.microbatch + 1);
    TANDEM_CHECK_MSG(
        a.chunk >= 0 && a.chunk < v, InvalidArgument,
        "stage " << range_.stage << ": an action on chunk " << a.chunk << " of a stage with " << v);
    if (a.type == ActionType::kWeightGradient) split[static_cast<size_t>(a.chunk)] = true;
  }
  TANDEM_CHECK_MSG(!info.training || info.batch_samples > 0, InvalidArgument,
                   "stage " << range_.stage << ": a training step needs its batch size");
  TANDEM_CHECK_MSG(!info.training || info.labels, InvalidArgument,
                   "stage " << range_.stage << ": training needs labels");
  TANDEM_CHECK_MSG(info.labels || !range_.last() || !replicated(), Unsupported,
                   "stage " << range_.stage
                            << ": a replicated last stage cannot serve outputs without labels "
                               "(each replica holds only its own microbatches')");
  return {m, split};
}

StepResult StageExecutor::runActions(const std::vector<Action>& actions, const StepInfo& info,
                                     const std::function<MicrobatchInput(int64_t)>& input,
                                     const std::function<void(int64_t)>& before_input) {
  const auto [m, split] = checkActions(actions, info);
  // With replicas, the last action making weight gradients reports them layer by layer,
  // each bucket leaving once final (ZeRO 2: the gradients given up are zeros again first).
  const Action* last_gradient = nullptr;
  const bool buckets = info.training && buckets_;
  if (buckets) {
    for (const Action& a : actions)
      if (mine(a.microbatch) &&
          a.type == (split[0] ? ActionType::kWeightGradient : ActionType::kBackward))
        last_gradient = &a;
    buckets_->start(collectives_);
    collectives_ += buckets_->tags();
  }
  const LayerDone layer_done = [this](size_t l) { buckets_->layerDone(l); };
  if (info.training) model_.zeroGrad();
  for (size_t l = range_.begin; buckets && l < range_.end; ++l) buckets_->layerStarts(l);
  const double busy0 = counters_.busy_s, optimizer0 = counters_.step_s;
  const double summed0 = buckets ? buckets_->callerSumSeconds() : 0;
  StepResult result;
  int64_t stashed = 0;
  for (const Action& a : actions) {
    const int64_t k = a.microbatch;
    const int c = a.chunk;
    if (a.type != ActionType::kStep && !mine(k)) continue;  // another replica's
    if (a.type == ActionType::kForward && firstVirtual(c) && before_input) before_input(k);
    const auto t0 = Clock::now();
    const bool compute = a.type == ActionType::kForward || a.type == ActionType::kBackward ||
                         a.type == ActionType::kWeightGradient;
    const double cpu0 = compute ? threadCpuSeconds() : 0;
    const auto key = std::make_pair(k, c);
    switch (a.type) {
      case ActionType::kRecvActivation: {
        InFlight& f = inflight_[key];
        const int b = inputBoundary(c);
        f.x = prev_->recv(tag(MessageKind::kActivation, k, b), backend_);
        if (info.labels) f.labels = prev_->recv(tag(MessageKind::kLabel, k, b), backend_);
        record(a.type, k, t0, counters_.recv_wait_s);
        break;
      }
      case ActionType::kForward:
        forward(k, c, info, result, input);
        if (info.training) counters_.peak_stash = std::max(counters_.peak_stash, ++stashed);
        if (c == 0) ++counters_.microbatches;
        record(a.type, k, t0, counters_.busy_s);
        break;
      case ActionType::kSendActivation: {
        InFlight& f = inflight_.at(key);
        next_->send(tag(MessageKind::kActivation, k, c), f.y);
        if (info.labels) next_->send(tag(MessageKind::kLabel, k, c), f.labels);
        f.y = Tensor();
        if (!info.training) inflight_.erase(key);  // nothing more to do for it here
        record(a.type, k, t0, counters_.send_s);
        break;
      }
      case ActionType::kRecvGradient:
        inflight_.at(key).dy = next_->recv(tag(MessageKind::kGradient, k, c), backend_);
        record(a.type, k, t0, counters_.recv_wait_s);
        break;
      case ActionType::kBackward: {
        const bool s = split[static_cast<size_t>(c)];
        backward(k, c, info, s, &a == last_gradient ? layer_done : LayerDone());
        if (!s) --stashed;  // else its weight gradient still needs the stash
        if (firstVirtual(c) && !s) inflight_.erase(key);  // a split one waits for its W
        record(a.type, k, t0, counters_.busy_s);
        break;
      }
      case ActionType::kWeightGradient: {
        InFlight& f = inflight_.at(key);
        TANDEM_CHECK_MSG(
            f.split, InvalidArgument,
            "stage " << range_.stage << ": weight gradient " << k << " without its backward");
        const LayerRange r = range_.chunk(c);
        model_.backwardWeights(f.stash, r.begin, r.end,
                               &a == last_gradient ? layer_done : LayerDone(), firstVirtual(c));
        inflight_.erase(key);
        --stashed;
        record(a.type, k, t0, counters_.busy_s);
        break;
      }
      case ActionType::kSendGradient: {
        InFlight& f = inflight_.at(key);
        prev_->send(tag(MessageKind::kGradient, k, inputBoundary(c)), f.dx);
        f.dx = Tensor();
        if (!f.split) inflight_.erase(key);
        record(a.type, k, t0, counters_.send_s);
        break;
      }
      case ActionType::kStep:
        TANDEM_CHECK_MSG(optimizer_ != nullptr, InvalidArgument,
                         "stage " << range_.stage << ": a step without an optimizer");
        if (buckets) {
          const auto w0 = Clock::now();
          buckets_->finish();
          counters_.allreduce_s += seconds(Clock::now() - w0);
        }
        optimizerStep();
        {
          const double before = counters_.busy_s;
          record(a.type, 0, t0, counters_.busy_s);
          counters_.step_s += counters_.busy_s - before;
        }
        break;
    }
    if (compute) counters_.compute_cpu_s += threadCpuSeconds() - cpu0;
  }
  if (buckets) {  // summing on this thread is time with the replicas, not compute
    const double summed = buckets_->callerSumSeconds() - summed0;
    counters_.busy_s -= summed;
    counters_.allreduce_s += summed;
  }
  // The last stage keeps nothing after its forward (evaluation) or backward (training).
  inflight_.clear();
  tag_base_ += m;
  if (range_.last() && replicated())
    allreduceResult(result, info.replica_seconds
                                ? (counters_.busy_s - busy0) - (counters_.step_s - optimizer0)
                                : -1);
  return result;
}

void StageExecutor::allreduceResult(StepResult& result, double compute_s) {
  const auto t0 = Clock::now();
  // Small integers are exact in fp32; the loss sum keeps fp32's relative precision.
  std::vector<float> sums = {static_cast<float>(result.loss_sum),
                             static_cast<float>(result.correct),
                             static_cast<float>(result.samples)};
  // Each replica's time in its own slot (the others add zeros: every replica sums the
  // same values, exactly).
  if (compute_s >= 0) {
    sums.resize(3 + static_cast<size_t>(options_.replicas->size()), 0.0f);
    sums[3 + static_cast<size_t>(options_.replicas->rank())] = static_cast<float>(compute_s);
  }
  AllreduceOptions o;
  o.tag = collectives_++;
  o.timeout = options_.collective_timeout;
  allreduce(*options_.replicas, sums, o);
  result.loss_sum = sums[0];
  result.correct = static_cast<int64_t>(sums[1]);
  result.samples = static_cast<int64_t>(sums[2]);
  if (compute_s >= 0) result.replica_seconds.assign(sums.begin() + 3, sums.end());
  counters_.allreduce_s += seconds(Clock::now() - t0);
}

void StageExecutor::forward(int64_t k, int c, const StepInfo& info, StepResult& result,
                            const std::function<MicrobatchInput(int64_t)>& input) {
  InFlight& f = inflight_[{k, c}];
  const LayerRange r = range_.chunk(c);
  if (firstVirtual(c)) {
    MicrobatchInput in = input(k);
    f.x = std::move(in.x);
    f.labels = std::move(in.labels);
  }
  TANDEM_CHECK_MSG(f.x.defined(), InvalidArgument,
                   "stage " << range_.stage << ": forward " << k << " has no input");
  if (c == 0) counters_.samples += f.x.shape()[0];
  const ForwardContext ctx{info.training,
                           info.training ? microbatchSeed(options_.seed, info.step, k) : 0};
  Tensor y;
  if (info.training && options_.recompute) {
    Stash scratch;  // dropped: backward recomputes it from f.x
    y = model_.forward(f.x, scratch, ctx, r.begin, r.end);
  } else {
    y = model_.forward(f.x, f.stash, ctx, r.begin, r.end);
    if (!info.training) f.stash.clear();
  }
  if (!(info.training && options_.recompute)) f.x = Tensor();  // the stash has what it needs
  if (!lastVirtual(c)) {
    f.y = std::move(y);
    return;
  }
  const int64_t n = y.shape()[0];
  result.samples += n;
  if (!info.labels) {
    result.outputs.push_back({k, std::move(y), {}, 0, 0});
    return;
  }
  // A language model's loss is a mean per token: its sum over a sample's tokens counts
  // as that sample's loss divided by the tokens; `correct` counts tokens.
  const int64_t per_label = labelsPerSample(model_);
  const auto per = static_cast<double>(per_label);
  if (info.training) {
    f.dy = backend_.empty(y.shape());
    result.loss_sum +=
        softmaxCrossEntropy(backend_, y, f.labels,
                            1.0f / static_cast<float>(info.batch_samples * per_label), f.dy) /
        per;
  } else {
    const double loss = softmaxCrossEntropy(backend_, y, f.labels, 1.0f, Tensor()) / per;
    std::vector<float> host = toHost(y);
    const int64_t correct =
        countCorrect(host, toHostI32(f.labels), y.shape()[y.shape().rank() - 1]);
    result.loss_sum += loss;
    result.correct += correct;
    if (info.outputs) result.outputs.push_back({k, std::move(y), std::move(host), loss, correct});
  }
  f.labels = Tensor();
}

void StageExecutor::backward(int64_t k, int c, const StepInfo& info, bool split,
                             const LayerDone& done) {
  InFlight& f = inflight_.at({k, c});
  const LayerRange r = range_.chunk(c);
  TANDEM_CHECK_MSG(f.dy.defined(), InvalidArgument,
                   "stage " << range_.stage << ": backward " << k << " has no output gradient");
  if (options_.recompute) {
    const ForwardContext ctx{true, microbatchSeed(options_.seed, info.step, k), true};
    model_.forward(f.x, f.stash, ctx, r.begin, r.end);
  }
  if (split) {
    // The first stage wants no input gradient: its first layer runs whole here.
    f.dx = model_.backwardInput(f.dy, f.stash, r.begin, r.end, !firstVirtual(c));
    f.split = true;  // the stash stays for the weight gradient
  } else {
    f.dx = model_.backward(f.dy, f.stash, !firstVirtual(c), r.begin, r.end, done);
    f.stash.clear();
  }
  f.x = f.dy = Tensor();
}

}  // namespace tandem
