#include "core/pipeline/stage_trainer.h"

#include <thread>

#include "core/error.h"

namespace tandem {

namespace {

// The options only a trainer reads, checked before its executor checks the rest.
const PipelineOptions& trainerOptions(const PipelineOptions& options, StageRange range) {
  TANDEM_CHECK_MSG(options.rebalance_steps >= 0, InvalidArgument,
                   "rebalance_steps " << options.rebalance_steps << " must not be negative");
  TANDEM_CHECK_MSG(options.rebalance_steps == 0 || !options.replicas ||
                       options.replicas->size() == 1 || (range.first() && range.last()),
                   InvalidArgument,
                   "stage " << range.stage << " of " << range.stages
                            << ": only replicas of the whole model rebalance their shares (the "
                               "first stage cuts the batches, the last one measures them)");
  return options;
}

}  // namespace

StageTrainer::StageTrainer(Model& model, StageRange range, Link* prev, Link* next,
                           Optimizer* optimizer, const PipelineOptions& options)
    : model_(model),
      range_(range),
      options_(trainerOptions(options, range)),
      executor_(model, range, prev, next, optimizer,
                ExecutorOptions{options.recompute, options.seed, options.record_spans,
                                options.replicas, options.collective_timeout, options.bucket_bytes,
                                options.zero, options.state_shares}) {
  TANDEM_CHECK_MSG(options.batch > 0, InvalidArgument,
                   "batch size " << options.batch << " must be positive");
  TANDEM_CHECK_MSG(options.microbatches > 0, InvalidArgument,
                   "microbatches " << options.microbatches << " must be positive");
  TANDEM_CHECK_MSG(range.chunkCount() == 1 || options.schedule == ScheduleKind::kInterleaved1F1B,
                   InvalidArgument,
                   "stage " << range.stage << " holds " << range.chunkCount()
                            << " model chunks, which only the interleaved schedule runs, not '"
                            << scheduleName(options.schedule) << "'");
}

bool StageTrainer::rebalances() const {
  return options_.rebalance_steps > 0 && options_.replicas && options_.replicas->size() > 1 &&
         steps_run_ >= 1 && steps_run_ <= options_.rebalance_steps;
}

int64_t StageTrainer::firstMicrobatch(bool training) const {
  if (!training)
    return kFirstEvaluationMicrobatch + eval_microbatches_ % (kFirstEvaluationMicrobatch / 2);
  TANDEM_CHECK_MSG(
      global_step_ < kFirstEvaluationMicrobatch / std::max<int64_t>(1, options_.microbatches),
      InvalidArgument,
      "step " << global_step_ << " of " << options_.microbatches
              << " microbatches numbers them past 2^49");
  return global_step_ * options_.microbatches;
}

std::vector<MicrobatchSlice> StageTrainer::slices(int64_t n, bool training) const {
  return splitBatch(n, options_.microbatches, options_.microbatch_shares,
                    firstMicrobatch(training));
}

StepResult StageTrainer::step(const Dataset* data, const std::vector<int64_t>& order, int64_t begin,
                              int64_t n, const std::vector<MicrobatchSlice>& slices,
                              ScheduleKind kind, bool training, bool outputs,
                              bool replica_seconds) {
  const auto m = static_cast<int64_t>(slices.size());
  if (range_.first()) gatherBatch(*data, order, begin, n, x_, y_);
  Backend& be = model_.backend();
  const int64_t per_sample = model_.inputShape().numel();
  const int64_t per_label = labelsPerSample(model_);  // a language model's: one per token
  auto input = [&](int64_t k) {
    const MicrobatchSlice& s = slices.at(static_cast<size_t>(k));
    MicrobatchInput in{uploadSamples(be, model_, x_.data() + s.offset * per_sample, s.count),
                       be.empty({s.count * per_label}, DType::kI32)};
    be.upload(in.labels, y_.data() + s.offset * per_label);
    return in;
  };
  const StepInfo info{
      global_step_, n, training, true, outputs, replica_seconds, firstMicrobatch(training)};
  auto pace = [&](int64_t) {  // a paced stream: this request's turn
    std::this_thread::sleep_until(next_feed_);
    next_feed_ += interval_;
  };
  return executor_.run(
      stageActions(kind, range_.stage, range_.stages, m, range_.chunkCount()), info, input,
      interval_.count() > 0 ? std::function<void(int64_t)>(pace) : std::function<void(int64_t)>());
}

EpochReport StageTrainer::trainEpoch(const Dataset* data, int64_t samples, int64_t epoch,
                                     const std::function<void(const StepReport&)>& progress,
                                     int64_t first_step) {
  TANDEM_CHECK_MSG(range_.first() == (data != nullptr), InvalidArgument,
                   "stage " << range_.stage << ": the dataset goes to the first stage only");
  TANDEM_CHECK_MSG(
      !data || data->size() == samples, InvalidArgument,
      "stage 0: dataset of " << data->size() << " samples, " << samples << " expected");
  TANDEM_CHECK_MSG(
      isTraining(options_.schedule), InvalidArgument,
      "training needs a training schedule, not '" << scheduleName(options_.schedule) << "'");
  const std::vector<int64_t> order =
      range_.first() ? epochOrder(samples, options_.shuffle, options_.seed, epoch)
                     : std::vector<int64_t>{};
  return runEpoch(
      epoch, samples, options_.batch,
      [&](int64_t begin, int64_t n) {
        const int64_t first = firstMicrobatch(true);
        const std::vector<MicrobatchSlice> cut = slices(n, true);
        const bool measure = rebalances();
        const StepResult r =
            step(data, order, begin, n, cut, options_.schedule, true, false, measure);
        if (measure) {
          std::vector<double> measured = measuredShares(cut, first, r.replica_seconds);
          if (!measured.empty()) measured_.push_back(std::move(measured));
          if (steps_run_ == options_.rebalance_steps && !measured_.empty())
            options_.microbatch_shares = medianShares(measured_);
        }
        ++steps_run_;
        ++global_step_;
        return r.loss_sum;
      },
      progress, first_step);
}

EvalResult StageTrainer::evaluate(const Dataset* data, int64_t samples, int64_t batch,
                                  const EvalStream& stream) {
  TANDEM_CHECK_MSG(range_.first() == (data != nullptr), InvalidArgument,
                   "stage " << range_.stage << ": the dataset goes to the first stage only");
  TANDEM_CHECK_MSG(batch > 0, InvalidArgument, "batch size " << batch << " must be positive");
  TANDEM_CHECK_MSG(stream.from >= 0 && stream.from % batch == 0 && stream.from <= samples,
                   InvalidArgument,
                   "an evaluation stream starts at a batch of the "
                       << samples << " samples, not at " << stream.from);
  const std::vector<int64_t> order =
      range_.first() ? epochOrder(samples, false, 0, 0) : std::vector<int64_t>{};
  const bool answers = range_.last() && static_cast<bool>(stream.answer);
  interval_ = stream.interval;
  next_feed_ = std::chrono::steady_clock::now();
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t begin = stream.from; begin < samples; begin += batch) {
    const int64_t n = std::min(batch, samples - begin);
    const std::vector<MicrobatchSlice> slices = this->slices(n, false);
    const StepResult r =
        step(data, order, begin, n, slices, ScheduleKind::kForwardOnly, false, answers);
    eval_microbatches_ += static_cast<int64_t>(slices.size());
    loss_sum += r.loss_sum;
    correct += r.correct;
    if (!answers) continue;
    for (const MicrobatchOutput& o : r.outputs) {
      EvalAnswer a;
      a.first = begin + slices.at(static_cast<size_t>(o.microbatch)).offset;
      a.count = o.y.shape()[0];
      a.columns = o.y.numel() / std::max<int64_t>(a.count, 1);
      a.outputs = o.host;
      a.loss_sum = o.loss_sum;
      a.correct = o.correct;
      stream.answer(a);
    }
  }
  interval_ = std::chrono::microseconds{0};
  EvalResult r;
  if (range_.last() && samples > stream.from) {
    r.samples = samples - stream.from;
    r.loss = loss_sum / static_cast<double>(r.samples);
    r.accuracy = static_cast<double>(correct) /
                 static_cast<double>(r.samples * labelsPerSample(model_));  // per token
  }
  return r;
}

}  // namespace tandem
