#include "core/pipeline/stage_trainer.h"

#include "core/error.h"
#include "core/train/microbatch.h"

namespace tandem {

StageTrainer::StageTrainer(Model& model, StageRange range, Link* prev, Link* next,
                           Optimizer* optimizer, const PipelineOptions& options)
    : model_(model),
      range_(range),
      options_(options),
      executor_(model, range, prev, next, optimizer,
                ExecutorOptions{options.recompute, options.seed, options.record_spans,
                                options.replicas, options.collective_timeout}) {
  TANDEM_CHECK_MSG(options.batch > 0, InvalidArgument,
                   "batch size " << options.batch << " must be positive");
  TANDEM_CHECK_MSG(options.microbatches > 0, InvalidArgument,
                   "microbatches " << options.microbatches << " must be positive");
}

StepResult StageTrainer::step(const Dataset* data, const std::vector<int64_t>& order, int64_t begin,
                              int64_t n, ScheduleKind kind, bool training) {
  const std::vector<MicrobatchSlice> slices = splitBatch(n, options_.microbatches);
  const auto m = static_cast<int64_t>(slices.size());
  if (range_.first()) gatherBatch(*data, order, begin, n, x_, y_);
  Backend& be = model_.backend();
  const int64_t per_sample = model_.inputShape().numel();
  auto input = [&](int64_t k) {
    const MicrobatchSlice& s = slices.at(static_cast<size_t>(k));
    MicrobatchInput in{be.empty(model_.inputShape().withBatch(s.count)),
                       be.empty({s.count}, DType::kI32)};
    be.upload(in.x, x_.data() + s.offset * per_sample);
    be.upload(in.labels, y_.data() + s.offset);
    return in;
  };
  const StepInfo info{global_step_, n, training, true};
  return executor_.run(stageActions(kind, range_.stage, range_.stages, m), info, input);
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
        const double loss = step(data, order, begin, n, options_.schedule, true).loss_sum;
        ++global_step_;
        return loss;
      },
      progress, first_step);
}

EvalResult StageTrainer::evaluate(const Dataset* data, int64_t samples, int64_t batch) {
  TANDEM_CHECK_MSG(range_.first() == (data != nullptr), InvalidArgument,
                   "stage " << range_.stage << ": the dataset goes to the first stage only");
  TANDEM_CHECK_MSG(batch > 0, InvalidArgument, "batch size " << batch << " must be positive");
  const std::vector<int64_t> order =
      range_.first() ? epochOrder(samples, false, 0, 0) : std::vector<int64_t>{};
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < samples; begin += batch) {
    const int64_t n = std::min(batch, samples - begin);
    const StepResult r = step(data, order, begin, n, ScheduleKind::kForwardOnly, false);
    loss_sum += r.loss_sum;
    correct += r.correct;
  }
  EvalResult r;
  if (range_.last() && samples > 0) {
    r.samples = samples;
    r.loss = loss_sum / static_cast<double>(samples);
    r.accuracy = static_cast<double>(correct) / static_cast<double>(samples);
  }
  return r;
}

}  // namespace tandem
