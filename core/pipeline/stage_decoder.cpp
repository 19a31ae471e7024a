#include "core/pipeline/stage_decoder.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace tandem {

StageDecoder::StageDecoder(Model& model, StageRange range, Link* prev, Link* next, Link* feedback)
    : model_(model), range_(range), prev_(prev), next_(next), feedback_(feedback) {
  TANDEM_CHECK_MSG(range.stages >= 2, InvalidArgument,
                   "pipelined generation needs 2 or more stages (one process: generate)");
  TANDEM_CHECK_MSG(range.first() == (prev == nullptr) && range.last() == (next == nullptr) &&
                       (range.first() || range.last()) == (feedback != nullptr),
                   InvalidArgument,
                   "stage " << range.stage << " of " << range.stages
                            << ": links do not match its place (prev, next, feedback)");
}

std::vector<Generation> StageDecoder::run(const std::vector<GenerationRequest>& requests) {
  using Clock = std::chrono::steady_clock;
  Backend& be = model_.backend();
  const auto sequences = static_cast<int64_t>(requests.size());
  int64_t rounds = 0;
  for (const GenerationRequest& r : requests) {
    TANDEM_CHECK_MSG(!range_.first() || !r.prompt.empty(), InvalidArgument,
                     "a request's prompt is empty");
    rounds = std::max(rounds, r.count);
  }
  std::vector<DecodeState> states(requests.size());
  std::vector<Generation> out(range_.last() ? requests.size() : 0);
  std::vector<Rng> rngs;
  for (const GenerationRequest& r : requests) rngs.emplace_back(r.sampling.seed);
  std::vector<Clock::time_point> last(requests.size());
  const auto t0 = Clock::now();
  const int64_t vocab = model_.outputShape()[model_.outputShape().rank() - 1];
  for (int64_t r = 0; r < rounds; ++r) {
    for (int64_t q = 0; q < sequences; ++q) {
      const GenerationRequest& request = requests[static_cast<size_t>(q)];
      if (r >= request.count) continue;
      const int64_t id = r * sequences + q;
      Tensor x;
      if (!range_.first()) {
        x = prev_->recv({MessageKind::kActivation, id}, be);
      } else if (r == 0) {
        x = toDeviceI32(be, {1, static_cast<int64_t>(request.prompt.size())}, request.prompt);
      } else {  // the token the last stage chose at the step before
        x = feedback_->recv({MessageKind::kToken, id - sequences}, be).reshape({1, 1});
      }
      const Tensor y = model_.decode(x, states[static_cast<size_t>(q)], range_.begin, range_.end);
      if (!range_.last()) {
        next_->send({MessageKind::kActivation, id}, y);
        continue;
      }
      const std::vector<float> all = toHost(y);
      std::vector<float> row(all.end() - vocab, all.end());
      const int32_t token = chooseToken(row, request.sampling, rngs[static_cast<size_t>(q)]);
      if (r + 1 < request.count)
        feedback_->send({MessageKind::kToken, id}, toDeviceI32(be, {1}, {token}));
      Generation& g = out[static_cast<size_t>(q)];
      const auto now = Clock::now();
      if (r == 0) {
        g.first_token_s = std::chrono::duration<double>(now - t0).count();
      } else {
        g.intervals_s.push_back(
            std::chrono::duration<double>(now - last[static_cast<size_t>(q)]).count());
      }
      last[static_cast<size_t>(q)] = now;
      g.tokens.push_back(token);
      g.logits.push_back(std::move(row));
    }
  }
  return out;
}

}  // namespace tandem
