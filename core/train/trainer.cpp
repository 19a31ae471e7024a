#include "core/train/trainer.h"

#include <chrono>

#include "core/error.h"
#include "core/loss.h"
#include "core/train/microbatch.h"

namespace tandem {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

void checkClassifier(const Model& model, const Dataset& data) {
  TANDEM_CHECK_MSG(model.inputShape() == data.sample_shape, InvalidArgument,
                   "model '" << model.name() << "' takes " << model.inputShape() << " but "
                             << data.name << " samples are " << data.sample_shape);
  TANDEM_CHECK_MSG((model.inputDType() == DType::kI32) == data.tokens, InvalidArgument,
                   "model '" << model.name() << "' takes "
                             << (data.tokens ? "numbers" : "token ids") << " but " << data.name
                             << " gives "
                             << (data.tokens ? "token ids (start the model with an "
                                               "embedding)"
                                             : "numbers"));
  TANDEM_CHECK_MSG(
      model.outputShape() == data.outputShape(), InvalidArgument,
      "model '" << model.name() << "' outputs " << model.outputShape() << " but " << data.name
                << (data.tokens ? " needs " + data.outputShape().str() +
                                      " (a logit per token and byte: vocab " +
                                      std::to_string(data.classes) + ")"
                                : " has " + std::to_string(data.classes) + " classes"));
  TANDEM_CHECK_MSG(!data.tokens || inputVocab(model) >= data.classes, InvalidArgument,
                   "model '" << model.name() << "' embeds " << inputVocab(model)
                             << " token ids but " << data.name << " has " << data.classes
                             << " (bytes): its embedding's vocab must be at least that");
}

int64_t inputVocab(const Model& model) {
  if (model.size() == 0 || model.layer(0).type() != "embedding") return 0;
  return std::get<int64_t>(model.layer(0).spec().attrs.at("vocab"));
}

int64_t labelsPerSample(const Model& model) {
  const Shape& out = model.outputShape();
  return out.rank() <= 1 ? 1 : out.numel() / out[out.rank() - 1];
}

Tensor uploadSamples(Backend& backend, const Model& model, const float* x, int64_t n) {
  const Shape shape = model.inputShape().withBatch(n);
  Tensor values = backend.empty(shape);
  backend.upload(values, x);
  if (model.inputDType() != DType::kI32) return values;
  Tensor ids = backend.empty(shape, DType::kI32);
  backend.convert(values, ids);
  return ids;
}

Trainer::Trainer(Model& model, Optimizer& optimizer, const TrainOptions& options)
    : model_(model), optimizer_(optimizer), options_(options) {
  TANDEM_CHECK_MSG(options.batch > 0, InvalidArgument,
                   "batch size " << options.batch << " must be positive");
  TANDEM_CHECK_MSG(options.microbatches > 0, InvalidArgument,
                   "microbatches " << options.microbatches << " must be positive");
  model.requireTrainable();
}

double Trainer::step(const float* x, const int32_t* labels, int64_t n) {
  Backend& be = model_.backend();
  model_.zeroGrad();
  const int64_t per_sample = model_.inputShape().numel();
  const int64_t per_label = labelsPerSample(model_);
  const std::vector<MicrobatchSlice> slices =
      splitBatch(n, options_.microbatches, options_.microbatch_shares, microbatches_run_);
  microbatches_run_ += static_cast<int64_t>(slices.size());
  double loss_sum = 0;
  for (size_t k = 0; k < slices.size(); ++k) {
    const MicrobatchSlice& mb = slices[k];
    Tensor xt = uploadSamples(be, model_, x + mb.offset * per_sample, mb.count);
    Tensor yt = be.empty({mb.count * per_label}, DType::kI32);
    be.upload(yt, labels + mb.offset * per_label);
    Stash stash;
    const ForwardContext ctx{true,
                             microbatchSeed(options_.seed, global_step_, static_cast<int64_t>(k))};
    Tensor logits = model_.forward(xt, stash, ctx);
    Tensor grad = be.empty(logits.shape());
    loss_sum += softmaxCrossEntropy(be, logits, yt, 1.0f / static_cast<float>(n * per_label), grad);
    model_.backward(grad, stash);
  }
  optimizer_.step(model_.params());
  ++global_step_;
  return loss_sum / static_cast<double>(n * per_label);
}

EpochReport runEpoch(int64_t epoch, int64_t samples, int64_t batch,
                     const std::function<double(int64_t begin, int64_t n)>& step,
                     const std::function<void(const StepReport&)>& progress, int64_t first_step) {
  const auto t0 = Clock::now();
  const int64_t steps = (samples + batch - 1) / batch;
  double loss_sum = 0;
  int64_t seen = 0;
  for (int64_t s = first_step; s < steps; ++s) {
    const int64_t begin = s * batch;
    const int64_t n = std::min(batch, samples - begin);
    loss_sum += step(begin, n);
    seen += n;
    if (progress) {
      const double el = since(t0);
      progress({epoch, s + 1, steps, loss_sum / static_cast<double>(seen),
                el > 0 ? static_cast<double>(seen) / el : 0.0, el});
    }
  }
  const double el = since(t0);
  return {epoch, seen ? loss_sum / static_cast<double>(seen) : 0.0, el,
          el > 0 ? static_cast<double>(seen) / el : 0.0};
}

EpochReport datasetEpoch(
    const Model& model, const Dataset& data, int64_t epoch, int64_t batch, bool shuffle,
    uint64_t seed,
    const std::function<double(const std::vector<int64_t>& order, int64_t begin, int64_t n)>& step,
    const std::function<void(const StepReport&)>& progress) {
  checkClassifier(model, data);
  const std::vector<int64_t> order = epochOrder(data.size(), shuffle, seed, epoch);
  return runEpoch(
      epoch, data.size(), batch,
      [&](int64_t begin, int64_t n) { return step(order, begin, n) * static_cast<double>(n); },
      progress);
}

EpochReport Trainer::trainEpoch(const Dataset& data, int64_t epoch,
                                const std::function<void(const StepReport&)>& progress) {
  std::vector<float> x;
  std::vector<int32_t> y;
  return datasetEpoch(
      model_, data, epoch, options_.batch, options_.shuffle, options_.seed,
      [&](const std::vector<int64_t>& order, int64_t begin, int64_t n) {
        gatherBatch(data, order, begin, n, x, y);
        return step(x.data(), y.data(), n);
      },
      progress);
}

EvalResult evaluate(Model& model, const Dataset& data, int64_t batch) {
  checkClassifier(model, data);
  TANDEM_CHECK_MSG(batch > 0, InvalidArgument, "batch size " << batch << " must be positive");
  Backend& be = model.backend();
  const std::vector<int64_t> order = epochOrder(data.size(), false, 0, 0);
  std::vector<float> x;
  std::vector<int32_t> y;
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < data.size(); begin += batch) {
    const int64_t n = std::min(batch, data.size() - begin);
    gatherBatch(data, order, begin, n, x, y);
    Tensor xt = uploadSamples(be, model, x.data(), n);
    Tensor yt = be.empty({static_cast<int64_t>(y.size())}, DType::kI32);
    be.upload(yt, y.data());
    Stash stash;
    Tensor logits = model.forward(xt, stash, ForwardContext{false, 0});
    loss_sum += softmaxCrossEntropy(be, logits, yt, 1.0f, Tensor());
    correct += countCorrect(toHost(logits), y, data.classes);
  }
  EvalResult r;
  r.samples = data.size();
  const auto labels = static_cast<double>(data.labels.size());
  if (r.samples) {
    r.loss = loss_sum / labels;
    r.accuracy = static_cast<double>(correct) / labels;
  }
  return r;
}

}  // namespace tandem
