#include "core/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/train/trainer.h"

namespace tandem {
int32_t chooseToken(const std::vector<float>& logits, const SamplingOptions& o, Rng& rng) {
  TANDEM_CHECK_MSG(!logits.empty(), InvalidArgument, "no logits to choose a token from");
  TANDEM_CHECK_MSG(o.temperature >= 0 && std::isfinite(o.temperature), InvalidArgument,
                   "temperature must be 0 (greedy) or positive, got " << o.temperature);
  TANDEM_CHECK_MSG(o.top_k >= 0, InvalidArgument,
                   "top-k must be 0 (all) or positive, got " << o.top_k);
  TANDEM_CHECK_MSG(o.top_p > 0 && o.top_p <= 1, InvalidArgument,
                   "top-p must be in (0, 1], got " << o.top_p);
  if (o.temperature == 0.0f)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  // Largest first; ties by index, so the choice does not depend on the sort's whims.
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t k = o.top_k > 0 ? std::min(order.size(), static_cast<size_t>(o.top_k)) : order.size();
  std::vector<double> weight(k);
  double total = 0;
  for (size_t i = 0; i < k; ++i) {
    weight[i] =
        std::exp((static_cast<double>(logits[order[i]]) - logits[order[0]]) / o.temperature);
    total += weight[i];
  }
  if (o.top_p < 1) {  // the fewest most likely tokens holding top_p of the probability
    double kept = 0;
    size_t n = 0;
    while (n < k && kept < static_cast<double>(o.top_p) * total) kept += weight[n++];
    k = std::max<size_t>(n, 1);
    total = kept > 0 ? kept : weight[0];
  }
  double draw = static_cast<double>(rng.uniform(0.0f, 1.0f)) * total;
  for (size_t i = 0; i < k; ++i) {
    draw -= weight[i];
    if (draw < 0) return order[i];
  }
  return order[k - 1];
}

TextShape textShape(const Model& model) {
  const Shape& in = model.inputShape();
  const Shape& out = model.outputShape();
  TANDEM_CHECK_MSG(
      model.inputDType() == DType::kI32 && in.rank() == 1 && out.rank() == 2 && out[0] == in[0],
      InvalidArgument,
      "model '" << model.name() << "' is not a language model: it takes " << in << " and outputs "
                << out << " (generation needs [T] token ids in, [T, vocab] logits out)");
  const int64_t context = in[0], vocab = out[1];
  TANDEM_CHECK_MSG(inputVocab(model) >= vocab, InvalidArgument,
                   "model '" << model.name() << "' chooses among " << vocab
                             << " tokens but embeds only " << inputVocab(model)
                             << ": its embedding's vocab and its output disagree");
  return {context, vocab, model.name()};
}

void checkRequest(const TextShape& shape, const std::vector<int32_t>& prompt, int64_t count,
                  const std::string& who) {
  TANDEM_CHECK_MSG(!prompt.empty(), InvalidArgument, who << "the prompt is empty");
  TANDEM_CHECK_MSG(count >= 0, InvalidArgument, who << "cannot generate " << count << " tokens");
  const auto length = static_cast<int64_t>(prompt.size());
  TANDEM_CHECK_MSG(length <= shape.context && count <= shape.context - length, InvalidArgument,
                   who << "a prompt of " << length << " tokens and " << count
                       << " new ones exceed the context of " << shape.context
                       << " tokens of model '" << shape.model << "'");
  for (size_t i = 0; i < prompt.size(); ++i)
    TANDEM_CHECK_MSG(prompt[i] >= 0 && prompt[i] < shape.vocab, InvalidArgument,
                     who << "prompt token " << prompt[i] << " at " << i
                         << " is outside the vocab of " << shape.vocab);
}

Generation generate(Model& model, const std::vector<int32_t>& prompt, int64_t count,
                    const SamplingOptions& o, bool cache,
                    const std::function<void(int32_t)>& on_token,
                    const std::function<int32_t(int32_t)>& agree,
                    const std::vector<int32_t>& end_tokens) {
  const TextShape shape = textShape(model);
  checkRequest(shape, prompt, count);
  const int64_t vocab = shape.vocab;
  Backend& be = model.backend();
  Rng rng(o.seed);
  Generation g;
  std::vector<int32_t> sequence = prompt;
  DecodeState state;
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto last = t0;
  // Step 0 feeds the prompt; each later step the token chosen before it (with the
  // cache) or the whole sequence so far (without).
  for (int64_t step = 0; step < count; ++step) {
    std::vector<int32_t> feed;
    if (cache && step > 0) {
      feed = {sequence.back()};
    } else {
      feed = sequence;
      if (!cache) state = DecodeState{};
    }
    const auto n = static_cast<int64_t>(feed.size());
    const Tensor logits = model.decode(toDeviceI32(be, {1, n}, feed), state);
    const std::vector<float> all = toHost(logits);
    std::vector<float> row(all.end() - vocab, all.end());
    const int32_t chosen = chooseToken(row, o, rng);
    const int32_t token = agree ? agree(chosen) : chosen;
    const auto now = Clock::now();
    if (step == 0) {
      g.first_token_s = std::chrono::duration<double>(now - t0).count();
    } else {
      g.intervals_s.push_back(std::chrono::duration<double>(now - last).count());
    }
    last = now;
    sequence.push_back(token);
    g.tokens.push_back(token);
    g.logits.push_back(std::move(row));
    if (on_token) on_token(token);
    if (std::find(end_tokens.begin(), end_tokens.end(), token) != end_tokens.end()) break;
  }
  return g;
}

}  // namespace tandem
