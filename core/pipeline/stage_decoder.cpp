#include "core/pipeline/stage_decoder.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <map>

#include "core/error.h"

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;

// A step's header: int32 values, the same on every link, followed in the same message by
// the step's activation ([1, length, width] floats, their bits as int32: an int32 message
// travels raw, so the header survives whatever codec the link has).
enum HeaderField {
  kOp,
  kId,
  kRound,
  kCount,
  kTopK,
  kSeedLow,
  kSeedHigh,
  kTemperature,
  kTopP,
  kLength,
  kFields
};
enum Op : int32_t { kStep = 0, kKeepAlive = 1, kEnd = 2, kCancel = 3 };

std::vector<int32_t> header(Op op, int64_t id = 0, int64_t round = 0,
                            const GenerationRequest* r = nullptr) {
  std::vector<int32_t> h(kFields, 0);
  h[kOp] = op;
  h[kId] = static_cast<int32_t>(id);
  h[kRound] = static_cast<int32_t>(round);
  if (r) {
    h[kCount] = static_cast<int32_t>(r->count);
    h[kTopK] = static_cast<int32_t>(
        std::min<int64_t>(r->sampling.top_k, std::numeric_limits<int32_t>::max()));
    h[kSeedLow] = static_cast<int32_t>(static_cast<uint32_t>(r->sampling.seed));
    h[kSeedHigh] = static_cast<int32_t>(static_cast<uint32_t>(r->sampling.seed >> 32));
    h[kTemperature] = std::bit_cast<int32_t>(r->sampling.temperature);
    h[kTopP] = std::bit_cast<int32_t>(r->sampling.top_p);
  }
  return h;
}

}  // namespace

struct StageDecoder::Sequence {
  GenerationRequest request;
  DecodeState state;
  int64_t round = 0;  // the next step's
  Rng rng;
};

StageDecoder::StageDecoder(Model& model, StageRange range, Link* prev, Link* next, Link* feedback,
                           DecoderOptions options)
    : model_(model),
      range_(range),
      prev_(prev),
      next_(next),
      feedback_(feedback),
      options_(options) {
  const bool alone = range.stages == 1;
  TANDEM_CHECK_MSG(range.first() == (prev == nullptr) && range.last() == (next == nullptr) &&
                       (!alone && (range.first() || range.last())) == (feedback != nullptr),
                   InvalidArgument,
                   "stage " << range.stage << " of " << range.stages
                            << ": links do not match its place (prev, next, feedback)");
  TANDEM_CHECK_MSG(options.max_in_flight >= 1, InvalidArgument,
                   "sequences in flight must be 1 or more, got " << options.max_in_flight);
  TANDEM_CHECK_MSG(options.keepalive.count() > 0, InvalidArgument,
                   "the keep-alive interval must be positive");
  shape_ = textShape(model);
}

void StageDecoder::serve(const RequestSource& source, const TokenSink& sink,
                         const CancelCheck& cancelled) {
  if (range_.stages == 1) {
    serveAlone(source, sink, cancelled);
  } else if (range_.first()) {
    serveFirst(source, sink, cancelled);
  } else {
    serveRest(sink);
  }
}

void StageDecoder::step(Sequence& s, const Tensor& x, int64_t n, const std::vector<int32_t>& head,
                        const TokenSink& sink) {
  Backend& be = model_.backend();
  const Tensor y = model_.decode(x, s.state, range_.begin, range_.end);
  if (!range_.last()) {
    TANDEM_CHECK_MSG(
        y.shape().rank() == 3 && y.shape()[0] == 1, InvalidArgument,
        "stage " << range_.stage << " decodes to " << y.shape() << ", not [1, tokens, width]");
    const std::vector<float> values = toHost(y);
    std::vector<int32_t> message(head);
    message[kLength] = static_cast<int32_t>(y.shape()[1]);
    message.resize(kFields + values.size());
    std::memcpy(message.data() + kFields, values.data(), values.size() * sizeof(float));
    next_->send({MessageKind::kActivation, n},
                toDeviceI32(be, {static_cast<int64_t>(message.size())}, message));
    return;
  }
  const std::vector<float> all = toHost(y);
  const std::vector<float> row(all.end() - shape_.vocab, all.end());
  const int32_t token = chooseToken(row, s.request.sampling, s.rng);
  if (s.round + 1 < s.request.count)  // (the last of several stages: feedback_ is there)
    feedback_->send({MessageKind::kToken, n}, toDeviceI32(be, {1}, {token}));
  if (sink) sink(ChosenToken{s.request.id, s.round, s.request.count, token, row});
}

void StageDecoder::checkAdmission(const GenerationRequest& r, bool in_flight) const {
  TANDEM_CHECK_MSG(r.id >= 0 && r.id <= std::numeric_limits<int32_t>::max(), InvalidArgument,
                   "request id " << r.id << " is not in [0, 2^31)");
  TANDEM_CHECK_MSG(!in_flight, InvalidArgument,
                   "request " << r.id << " came while a request of that id is in flight");
  const std::string who = "request " + std::to_string(r.id) + ": ";
  TANDEM_CHECK_MSG(r.count >= 1, InvalidArgument,
                   who << "cannot generate " << r.count << " tokens");
  checkRequest(shape_, r.prompt, r.count, who);
  TANDEM_CHECK_MSG(
      r.sampling.temperature >= 0 && std::isfinite(r.sampling.temperature) && r.sampling.top_k >= 0,
      InvalidArgument,
      who << "temperature " << r.sampling.temperature << " and top-k " << r.sampling.top_k
          << " (need a finite temperature >= 0, top-k >= 0)");
  TANDEM_CHECK_MSG(r.sampling.top_p > 0 && r.sampling.top_p <= 1, InvalidArgument,
                   who << "top-p " << r.sampling.top_p << " (need one in (0, 1])");
}

void StageDecoder::serveFirst(const RequestSource& source, const TokenSink& sink,
                              const CancelCheck& cancelled) {
  Backend& be = model_.backend();
  std::map<int64_t, Sequence> live;                  // admitted, not every step sent yet
  std::deque<std::pair<int64_t, int64_t>> awaiting;  // (step, sequence) whose token comes back
  int64_t n = 0;
  auto pass = [&](const std::vector<int32_t>& head) {  // a header with no activation
    if (next_) next_->send({MessageKind::kActivation, n++}, toDeviceI32(be, {kFields}, head));
  };
  // Runs the next step of sequence `id` on `x`; the sequence leaves once its last is sent.
  auto advance = [&](int64_t id, const Tensor& x) {
    Sequence& s = live.at(id);
    step(s, x, n, header(kStep, id, s.round, s.round == 0 ? &s.request : nullptr), sink);
    if (s.round + 1 < s.request.count) awaiting.push_back({n, id});
    ++n;
    if (++s.round == s.request.count) live.erase(id);
  };
  auto admit = [&](GenerationRequest r) {
    checkAdmission(r, live.count(r.id) != 0);
    const int64_t id = r.id;
    const Tensor x = toDeviceI32(be, {1, static_cast<int64_t>(r.prompt.size())}, r.prompt);
    const uint64_t seed = r.sampling.seed;
    live.emplace(id, Sequence{std::move(r), DecodeState{}, 0, Rng(seed)});
    advance(id, x);
  };
  bool ended = false;
  auto idle_since = Clock::now();
  for (;;) {
    // New requests while there is room: waiting for one only when nothing is in flight.
    while (!ended && static_cast<int>(live.size()) < options_.max_in_flight) {
      const bool idle = live.empty();
      RequestPoll p = source(idle ? std::chrono::milliseconds(100) : std::chrono::milliseconds(0));
      if (p.request) {
        admit(std::move(*p.request));
        idle_since = Clock::now();
        continue;
      }
      if (p.ended) {
        ended = true;
      } else if (!idle) {
        break;
      } else if (Clock::now() - idle_since >= options_.keepalive) {
        pass(header(kKeepAlive));
        idle_since = Clock::now();
      }
    }
    if (awaiting.empty()) {  // nothing in flight (every live sequence awaits its token)
      if (ended) break;
      continue;
    }
    const auto [m, id] = awaiting.front();
    awaiting.pop_front();
    const Tensor token = feedback_->recv({MessageKind::kToken, m}, be);
    TANDEM_CHECK_MSG(
        token.dtype() == DType::kI32 && token.numel() == 1, FormatError,
        "the token for step " << m << " from " << feedback_->peer() << " is not one int32 id");
    const int32_t t = toHostI32(token)[0];
    TANDEM_CHECK_MSG(
        t >= 0 && t < shape_.vocab, FormatError,
        "the token " << t << " for step " << m << " is outside the vocab of " << shape_.vocab);
    idle_since = Clock::now();
    if (cancelled && cancelled(id)) {  // no step of it is in flight now: every stage drops it
      live.erase(id);
      pass(header(kCancel, id));
      continue;
    }
    advance(id, token.reshape({1, 1}));
  }
  pass(header(kEnd));
}

void StageDecoder::serveAlone(const RequestSource& source, const TokenSink& sink,
                              const CancelCheck& cancelled) {
  Backend& be = model_.backend();
  std::map<int64_t, Sequence> live;
  std::vector<std::pair<int64_t, int32_t>> ready;  // (sequence, its next input token)
  // The token of `s` from its logits row: handed to the sink, and queued unless it was
  // the sequence's last (which then leaves).
  auto choose = [&](int64_t id, const std::vector<float>& row,
                    std::vector<std::pair<int64_t, int32_t>>& next) {
    Sequence& s = live.at(id);
    const int32_t token = chooseToken(row, s.request.sampling, s.rng);
    if (sink) sink(ChosenToken{id, s.round, s.request.count, token, row});
    if (++s.round == s.request.count) {
      live.erase(id);
    } else {
      next.push_back({id, token});
    }
  };
  bool ended = false;
  for (;;) {
    // New requests while there is room, each prefilled alone (its prompt at once).
    while (!ended && static_cast<int>(live.size()) < options_.max_in_flight) {
      RequestPoll p =
          source(live.empty() ? std::chrono::milliseconds(100) : std::chrono::milliseconds(0));
      if (!p.request) {
        ended = p.ended;
        break;
      }
      GenerationRequest& r = *p.request;
      checkAdmission(r, live.count(r.id) != 0);
      const int64_t id = r.id;
      const Tensor x = toDeviceI32(be, {1, static_cast<int64_t>(r.prompt.size())}, r.prompt);
      const uint64_t seed = r.sampling.seed;
      Sequence& s =
          live.emplace(id, Sequence{std::move(r), DecodeState{}, 0, Rng(seed)}).first->second;
      const std::vector<float> all = toHost(model_.decode(x, s.state, range_.begin, range_.end));
      choose(id, std::vector<float>(all.end() - shape_.vocab, all.end()), ready);
    }
    std::vector<std::pair<int64_t, int32_t>> step;
    for (const auto& [id, token] : ready) {
      if (cancelled && cancelled(id)) {
        live.erase(id);
      } else {
        step.push_back({id, token});
      }
    }
    ready.clear();
    if (step.empty()) {
      if (ended && live.empty()) return;
      continue;
    }
    // One token of every sequence in flight, in one pass over the layers.
    std::vector<int32_t> tokens;
    std::vector<DecodeState*> states;
    for (const auto& [id, token] : step) {
      tokens.push_back(token);
      states.push_back(&live.at(id).state);
    }
    const auto batch = static_cast<int64_t>(step.size());
    const std::vector<float> all = toHost(
        model_.decodeEach(toDeviceI32(be, {batch, 1}, tokens), states, range_.begin, range_.end));
    const auto vocab = static_cast<size_t>(shape_.vocab);
    for (size_t b = 0; b < step.size(); ++b)
      choose(step[b].first,
             std::vector<float>(all.begin() + static_cast<long>(b * vocab),
                                all.begin() + static_cast<long>((b + 1) * vocab)),
             ready);
  }
}

void StageDecoder::serveRest(const TokenSink& sink) {
  Backend& be = model_.backend();
  std::map<int64_t, Sequence> live;
  for (int64_t n = 0;; ++n) {
    const Tensor m = prev_->recv({MessageKind::kActivation, n}, be);
    TANDEM_CHECK_MSG(m.dtype() == DType::kI32 && m.shape().rank() == 1 && m.numel() >= kFields,
                     FormatError,
                     "step " << n << " from " << prev_->peer() << " is not a header of " << kFields
                             << " int32 values and an activation");
    const std::vector<int32_t> message = toHostI32(m);
    const std::vector<int32_t> head(message.begin(), message.begin() + kFields);
    auto bad = [&](const std::string& what) {
      throw FormatError("step " + std::to_string(n) + "'s header from " + prev_->peer() + ": " +
                        what);
    };
    if (head[kOp] == kKeepAlive || head[kOp] == kEnd) {
      if (next_) next_->send({MessageKind::kActivation, n}, toDeviceI32(be, {kFields}, head));
      if (head[kOp] == kEnd) {
        if (!live.empty())
          bad("the end came with " + std::to_string(live.size()) + " sequences unfinished");
        return;
      }
      continue;
    }
    if (head[kOp] == kCancel) {
      if (live.erase(head[kId]) == 0)
        bad("cancels sequence " + std::to_string(head[kId]) + ", which is not in flight");
      if (next_) next_->send({MessageKind::kActivation, n}, toDeviceI32(be, {kFields}, head));
      continue;
    }
    if (head[kOp] != kStep) bad("unknown operation " + std::to_string(head[kOp]));
    const int64_t id = head[kId], round = head[kRound];
    if (id < 0) bad("sequence id " + std::to_string(id));
    auto it = live.find(id);
    if (round == 0) {
      if (it != live.end()) bad("sequence " + std::to_string(id) + " began twice");
      GenerationRequest r;
      r.id = id;
      r.count = head[kCount];
      r.sampling.top_k = head[kTopK];
      r.sampling.seed = static_cast<uint64_t>(static_cast<uint32_t>(head[kSeedLow])) |
                        static_cast<uint64_t>(static_cast<uint32_t>(head[kSeedHigh])) << 32;
      r.sampling.temperature = std::bit_cast<float>(head[kTemperature]);
      r.sampling.top_p = std::bit_cast<float>(head[kTopP]);
      if (r.count < 1 || r.count > shape_.context)
        bad("sequence " + std::to_string(id) + " of " + std::to_string(r.count) + " tokens");
      const uint64_t seed = r.sampling.seed;
      it = live.emplace(id, Sequence{std::move(r), DecodeState{}, 0, Rng(seed)}).first;
    } else if (it == live.end() || it->second.round != round) {
      bad("sequence " + std::to_string(id) + " round " + std::to_string(round) +
          (it == live.end() ? " is not in flight" : " is out of order"));
    }
    Sequence& s = it->second;
    const int64_t length = head[kLength], values = m.numel() - kFields;
    if (length < 1 || length > shape_.context || values % length != 0 || values == 0)
      bad("an activation of " + std::to_string(values) + " values for " + std::to_string(length) +
          " tokens");
    std::vector<float> activation(static_cast<size_t>(values));
    std::memcpy(activation.data(), message.data() + kFields, activation.size() * sizeof(float));
    const Tensor x = toDevice(be, {1, length, values / length}, activation);
    step(s, x, n, head, sink);
    if (++s.round == s.request.count) live.erase(it);
  }
}

std::vector<Generation> StageDecoder::run(const std::vector<GenerationRequest>& requests) {
  size_t next = 0;
  RequestSource source = [&](std::chrono::milliseconds) {
    RequestPoll p;
    if (next == requests.size()) {
      p.ended = true;
    } else {
      p.request = requests[next];
      p.request->id = static_cast<int64_t>(next++);
    }
    return p;
  };
  std::vector<Generation> out(range_.last() ? requests.size() : 0);
  std::vector<Clock::time_point> last(out.size());
  const auto t0 = Clock::now();
  TokenSink sink = [&](const ChosenToken& c) {
    Generation& g = out.at(static_cast<size_t>(c.id));
    const auto now = Clock::now();
    if (c.index == 0) {
      g.first_token_s = std::chrono::duration<double>(now - t0).count();
    } else {
      g.intervals_s.push_back(
          std::chrono::duration<double>(now - last[static_cast<size_t>(c.id)]).count());
    }
    last[static_cast<size_t>(c.id)] = now;
    g.tokens.push_back(c.token);
    g.logits.push_back(c.logits);
  };
  serve(source, sink);
  return out;
}

}  // namespace tandem
