#include "core/profile/measure.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/random.h"

namespace tandem {

Spread timeRepeated(const std::function<void()>& f, int warmup, int repeats) {
  TANDEM_CHECK_MSG(
      repeats >= 1 && warmup >= 0, InvalidArgument,
      "timing needs repeats >= 1 and warm-up >= 0, got " << repeats << " and " << warmup);
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) t.push_back(timeOnce(f));
  return spreadOf(std::move(t));
}

double timeOnce(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Spread spreadOf(std::vector<double> t) {
  TANDEM_CHECK_MSG(!t.empty(), InvalidArgument, "a spread of no timed runs");
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  const double median = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
  return {median, t.front(), t.back(), static_cast<int>(n)};
}

SustainedRun runSustained(const std::function<void()>& pass, double window) {
  SustainedRun r;
  std::vector<double> ends;  // seconds from the start to each pass's end
  const double cpu0 = processCpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  do {
    pass();
    ++r.passes;
    r.window_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ends.push_back(r.window_s);
  } while (r.window_s < window || r.passes < 2);
  r.cpu_s = processCpuSeconds() - cpu0;
  r.pass_s = medianPartPass(ends, kSustainedParts);
  return r;
}

double medianPartPass(const std::vector<double>& ends, int parts) {
  TANDEM_CHECK_MSG(!ends.empty() && parts >= 1, InvalidArgument,
                   "a sustained window of " << ends.size() << " passes in " << parts << " parts");
  const double window = ends.back();
  std::vector<double> times;
  size_t first = 0;
  double start = 0;
  for (int part = 1; part <= parts; ++part) {
    const double until = window * part / parts;
    size_t last = first;
    while (last < ends.size() && (ends[last] <= until || part == parts)) ++last;
    if (last > first) {
      times.push_back((ends[last - 1] - start) / static_cast<double>(last - first));
      start = ends[last - 1];
      first = last;
    }
  }
  return spreadOf(times).median;
}

double sustainWindow(double least, const CpuLimit& limit) {
  if (limit.quota_cores <= 0 || limit.period_s <= 0) return least;
  return std::max(least, std::min(4.0, kSustainedPeriods * limit.period_s));
}

namespace {

// Uniform in [-1, 1) from its own stream.
std::vector<float> randomValues(int64_t n, uint64_t seed) {
  Rng rng(seed);
  return uniformInit(rng, n, 1.0f);
}

}  // namespace

LayerRunner::LayerRunner(Model& model, int64_t batch, uint64_t seed) : model_(model) {
  Backend& be = model.backend();
  const Shape xs = model.inputShape().withBatch(batch);
  Tensor x;
  if (model.inputDType() == DType::kI32) {  // token ids: any valid id will do
    std::vector<int32_t> ids(static_cast<size_t>(xs.numel()), 0);
    x = toDeviceI32(be, xs, ids);
  } else {
    x = toDevice(be, xs, randomValues(xs.numel(), seed));
  }
  const ForwardContext ctx{true, seed};
  for (size_t i = 0; i < model.size(); ++i) {
    inputs_.push_back(x);
    stashes_.emplace_back();
    const Layer& layer = model.layer(i);
    runs_.push_back(be.lacking(layer.ops(true)).empty());
    x = runs_.back() ? model.layer(i).forward(x, stashes_.back(), ctx)
                     : be.zeros(layer.outputShape().withBatch(batch));
    grads_.push_back(toDevice(be, x.shape(), randomValues(x.numel(), seed + i + 1)));
  }
  be.synchronize();
}

void LayerRunner::forward(size_t i) {
  if (!runs_.at(i)) return;
  Stash stash;
  Tensor y = model_.layer(i).forward(inputs_.at(i), stash, ForwardContext{true, 1});
  model_.backend().synchronize();
  stashes_.at(i) = std::move(stash);
  if (i + 1 < inputs_.size()) inputs_[i + 1] = std::move(y);
}

void LayerRunner::backward(size_t i, bool input_grad) {
  if (!runs_.at(i) || !model_.layer(i).trains()) return;  // int8 weights: forward only
  Stash stash = stashes_.at(i);  // backward may consume its stash; keep the original
  Tensor dx = model_.layer(i).backward(grads_.at(i), stash, i > 0 && input_grad);
  model_.backend().synchronize();
  if (i > 0 && dx.defined()) grads_[i - 1] = std::move(dx);
}

int64_t LayerRunner::activationBytes(size_t i) const {
  return static_cast<int64_t>(grads_.at(i).bytes());
}

int64_t LayerRunner::paramBytes(size_t i) const { return model_.layer(i).paramBytes(); }

BackgroundLoad::BackgroundLoad(const ModelSpec& spec,
                               const std::function<std::unique_ptr<Backend>()>& make, int copies,
                               int64_t batch, uint64_t seed) {
  for (int c = 0; c < copies; ++c) {
    // Set up here, so that errors reach the caller; then only the passes run on the thread.
    std::shared_ptr<Backend> backend = make();
    auto model = std::make_shared<Model>(spec);
    model->build(*backend, seed);
    auto runner = std::make_shared<LayerRunner>(*model, batch, seed);
    threads_.emplace_back([this, backend, model, runner] {
      while (!stop_.load(std::memory_order_relaxed)) {
        for (size_t i = 0; i < runner->size(); ++i) runner->forward(i);
        for (size_t i = runner->size(); i-- > 0;) runner->backward(i);
      }
    });
  }
}

BackgroundLoad::~BackgroundLoad() {
  stop_ = true;
  for (std::thread& t : threads_) t.join();
}

namespace {

// The positions of a decode state tree, depth first: what rewind() sets back.
void positionsOf(const DecodeState& s, std::vector<int64_t>& out) {
  out.push_back(s.position);
  for (const DecodeState& c : s.children) positionsOf(c, out);
}

void rewind(DecodeState& s, const std::vector<int64_t>& positions, size_t& at) {
  s.position = positions.at(at++);
  for (DecodeState& c : s.children) rewind(c, positions, at);
}

int64_t stateBytes(const DecodeState& s) {
  int64_t bytes = 0;
  for (const Tensor& t : s.cache) bytes += t.bytes();
  for (const DecodeState& c : s.children) bytes += stateBytes(c);
  return bytes;
}

}  // namespace

std::optional<DecodeTimes> timeDecode(Model& model, int64_t context, int64_t sequences, int warmup,
                                      int repeats) {
  TANDEM_CHECK_MSG(sequences >= 1 && repeats >= 1 && warmup >= 0, InvalidArgument,
                   "timing decoding needs sequences and repeats >= 1 and warm-up >= 0, got "
                       << sequences << ", " << repeats << " and " << warmup);
  const size_t n = model.size();
  const Shape& input = model.layer(0).inputShape();
  if (n == 0 || model.layer(0).inputDType() != DType::kI32 || input.rank() != 1 || context < 1 ||
      context >= input[0])
    return std::nullopt;
  Backend& be = model.backend();
  std::vector<DecodeState> states(static_cast<size_t>(sequences));
  std::vector<int32_t> prompt(static_cast<size_t>(context));
  for (size_t k = 0; k < prompt.size(); ++k) prompt[k] = static_cast<int32_t>(k % 7);
  try {  // each sequence's cache filled with the context's tokens, as a prefill leaves it
    for (DecodeState& s : states) model.decode(toDeviceI32(be, {1, context}, prompt), s);
  } catch (const Unsupported&) {
    return std::nullopt;
  }
  DecodeTimes out;
  for (size_t i = 0; i < n; ++i) out.cache_bytes.push_back(stateBytes(states[0].children.at(i)));
  std::vector<int64_t> positions;
  for (const DecodeState& s : states) positionsOf(s, positions);
  const Tensor tokens =
      toDeviceI32(be, {sequences, 1}, std::vector<int32_t>(static_cast<size_t>(sequences), 3));
  std::vector<std::vector<double>>& times = out.seconds;
  times.resize(n);
  std::vector<DecodeState*> layer_states(states.size());
  for (int pass = 0; pass < warmup + repeats; ++pass) {
    size_t at = 0;
    for (DecodeState& s : states) rewind(s, positions, at);
    Tensor h = tokens;
    for (size_t i = 0; i < n; ++i) {
      for (size_t b = 0; b < states.size(); ++b) layer_states[b] = &states[b].children.at(i);
      const double s = timeOnce([&] {
        h = model.layer(i).decodeEach(h, layer_states);
        be.synchronize();
      });
      if (pass >= warmup) times[i].push_back(s);
    }
  }
  return out;
}

GemmRunner::GemmRunner(Backend& backend, int64_t n) : backend_(backend), n_(n) {
  a_ = toDevice(backend, {n, n}, randomValues(n * n, 1));
  b_ = toDevice(backend, {n, n}, randomValues(n * n, 2));
  c_ = backend.zeros({n, n});
}

void GemmRunner::run() {
  backend_.gemm(false, false, 1.0f, a_, b_, 0.0f, c_);
  backend_.synchronize();
}

}  // namespace tandem
