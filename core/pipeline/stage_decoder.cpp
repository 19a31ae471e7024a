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

// A step message, the same on every link: its entry count B, B headers of kFields int32
// values (one per sequence it advances), then the entries' activations in order
// ([1, length, width] floats for one entry, [B, 1, width] for a batch), their bits as
// int32 (an int32 message travels raw, so the headers survive whatever codec the link
// has). A keep-alive, the end and a cancel are one header and no activation.
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

// The most sequences one step message may advance: a bound on what a peer's header makes
// a stage allocate before the activation is checked against it.
constexpr int64_t kMaxBatch = 4096;

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

// The message of `heads` (each with its kLength set) and their activations' values.
std::vector<int32_t> stepMessage(const std::vector<std::vector<int32_t>>& heads,
                                 const std::vector<float>& values) {
  std::vector<int32_t> m{static_cast<int32_t>(heads.size())};
  for (const auto& h : heads) m.insert(m.end(), h.begin(), h.end());
  const size_t at = m.size();
  m.resize(at + values.size());
  if (!values.empty()) std::memcpy(m.data() + at, values.data(), values.size() * sizeof(float));
  return m;
}

// `ready` split into ceil(size / most) runs of near-equal size, in order.
std::vector<std::vector<std::pair<int64_t, int32_t>>> chunks(
    const std::vector<std::pair<int64_t, int32_t>>& ready, size_t most) {
  const size_t k = (ready.size() + most - 1) / most;
  std::vector<std::vector<std::pair<int64_t, int32_t>>> out(k);
  for (size_t c = 0, at = 0; c < k; ++c) {
    const size_t size = ready.size() / k + (c < ready.size() % k ? 1 : 0);
    out[c].assign(ready.begin() + static_cast<long>(at),
                  ready.begin() + static_cast<long>(at + size));
    at += size;
  }
  return out;
}

// The request a sequence's first header describes (its id, count and sampling).
template <typename Bad>
GenerationRequest requestOf(const std::vector<int32_t>& h, int64_t context, const Bad& bad) {
  GenerationRequest r;
  r.id = h[kId];
  r.count = h[kCount];
  r.sampling.top_k = h[kTopK];
  r.sampling.seed = static_cast<uint64_t>(static_cast<uint32_t>(h[kSeedLow])) |
                    static_cast<uint64_t>(static_cast<uint32_t>(h[kSeedHigh])) << 32;
  r.sampling.temperature = std::bit_cast<float>(h[kTemperature]);
  r.sampling.top_p = std::bit_cast<float>(h[kTopP]);
  if (r.count < 1 || r.count > context)
    bad("sequence " + std::to_string(r.id) + " of " + std::to_string(r.count) + " tokens");
  return r;
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
  began_ = reported_ = Clock::now();
  reported_steps_ = stats_.steps;
  if (range_.stages == 1) {
    serveAlone(source, sink, cancelled);
  } else if (range_.first()) {
    serveFirst(source, sink, cancelled);
  } else {
    serveRest(sink);
  }
  reported_ = began_ - options_.report_every;  // due
  maybeReport();
}

void StageDecoder::maybeReport(bool idle) {
  const auto t = Clock::now();
  if (t - reported_ < options_.report_every && !(idle && stats_.steps != reported_steps_)) return;
  reported_ = t;
  reported_steps_ = stats_.steps;
  stats_.elapsed_s = std::chrono::duration<double>(t - began_).count();
  if (options_.report) options_.report(stats_);
}

void StageDecoder::step(const std::vector<Sequence*>& seqs, const Tensor& x, int64_t n,
                        std::vector<std::vector<int32_t>> heads, const TokenSink& sink) {
  Backend& be = model_.backend();
  const auto t0 = Clock::now();
  const bool batch = seqs.size() > 1;
  Tensor y;
  if (batch) {
    std::vector<DecodeState*> states;
    for (Sequence* s : seqs) states.push_back(&s->state);
    y = model_.decodeEach(x, states, range_.begin, range_.end);
  } else {
    y = model_.decode(x, seqs[0]->state, range_.begin, range_.end);
  }
  const auto b = static_cast<int64_t>(seqs.size());
  TANDEM_CHECK_MSG(
      y.shape().rank() == 3 && y.shape()[0] == (batch ? b : 1) && (!batch || y.shape()[1] == 1),
      InvalidArgument,
      "stage " << range_.stage << " decodes " << b << " sequences to " << y.shape() << ", not ["
               << (batch ? b : 1) << ", tokens, width]");
  const std::vector<float> values = toHost(y);
  ++stats_.steps;
  stats_.rows += b;
  if (!range_.last()) {
    for (auto& h : heads) h[kLength] = static_cast<int32_t>(y.shape()[1]);
    const std::vector<int32_t> message = stepMessage(heads, values);
    stats_.busy_s += std::chrono::duration<double>(Clock::now() - t0).count();
    next_->send({MessageKind::kActivation, n},
                toDeviceI32(be, {static_cast<int64_t>(message.size())}, message));
    return;
  }
  // The last stage: each sequence's token from the last row of its logits; those that go
  // on go back to stage 0 together (the last of several stages: feedback_ is there).
  const auto vocab = static_cast<size_t>(shape_.vocab);
  const size_t each = values.size() / seqs.size();
  std::vector<std::vector<float>> rows;
  std::vector<int32_t> chosen, back;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto end = values.begin() + static_cast<long>((i + 1) * each);
    rows.emplace_back(end - static_cast<long>(vocab), end);
    Sequence& s = *seqs[i];
    chosen.push_back(chooseToken(rows.back(), s.request.sampling, s.rng));
    if (s.round + 1 < s.request.count) back.push_back(chosen.back());
  }
  stats_.busy_s += std::chrono::duration<double>(Clock::now() - t0).count();
  if (!back.empty())
    feedback_->send({MessageKind::kToken, n},
                    toDeviceI32(be, {static_cast<int64_t>(back.size())}, back));
  if (!sink) return;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = *seqs[i];
    sink(ChosenToken{s.request.id, s.round, s.request.count, chosen[i], rows[i]});
  }
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
  std::map<int64_t, Sequence> live;  // admitted, not every step sent yet
  // The step messages whose tokens come back, in order: (step, the sequences going on).
  std::deque<std::pair<int64_t, std::vector<int64_t>>> awaiting;
  std::vector<std::pair<int64_t, int32_t>> ready;  // (sequence, its next input token)
  int64_t n = 0;
  auto pass = [&](const std::vector<int32_t>& head) {  // a header with no activation
    if (next_)
      next_->send({MessageKind::kActivation, n++},
                  toDeviceI32(be, {1 + kFields}, stepMessage({head}, {})));
  };
  // Runs the next step of sequences `ids` on `x` as one message; each leaves once its
  // last is sent.
  auto advance = [&](const std::vector<int64_t>& ids, const Tensor& x) {
    std::vector<Sequence*> seqs;
    std::vector<std::vector<int32_t>> heads;
    std::vector<int64_t> going;
    for (const int64_t id : ids) {
      Sequence& s = live.at(id);
      seqs.push_back(&s);
      heads.push_back(header(kStep, id, s.round, s.round == 0 ? &s.request : nullptr));
      if (s.round + 1 < s.request.count) going.push_back(id);
    }
    step(seqs, x, n, std::move(heads), sink);
    if (!going.empty()) awaiting.push_back({n, std::move(going)});
    ++n;
    for (const int64_t id : ids) {
      Sequence& s = live.at(id);
      if (++s.round == s.request.count) live.erase(id);
    }
  };
  auto admit = [&](GenerationRequest r) {
    checkAdmission(r, live.count(r.id) != 0);
    const int64_t id = r.id;
    const Tensor x = toDeviceI32(be, {1, static_cast<int64_t>(r.prompt.size())}, r.prompt);
    const uint64_t seed = r.sampling.seed;
    live.emplace(id, Sequence{std::move(r), DecodeState{}, 0, Rng(seed)});
    advance({id}, x);
  };
  bool ended = false;
  auto idle_since = Clock::now();
  for (;;) {
    maybeReport(live.empty());
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
    if (awaiting.empty()) {  // nothing in flight (and nothing held: see below)
      if (ended) break;
      continue;
    }
    const auto [m, ids] = std::move(awaiting.front());
    awaiting.pop_front();
    const Tensor tokens = feedback_->recv({MessageKind::kToken, m}, be);
    TANDEM_CHECK_MSG(tokens.dtype() == DType::kI32 && tokens.shape().rank() == 1 &&
                         tokens.numel() == static_cast<int64_t>(ids.size()),
                     FormatError,
                     "the tokens for step " << m << " from " << feedback_->peer() << " are not "
                                            << ids.size() << " int32 ids");
    const std::vector<int32_t> t = toHostI32(tokens);
    idle_since = Clock::now();
    for (size_t i = 0; i < ids.size(); ++i) {
      TANDEM_CHECK_MSG(
          t[i] >= 0 && t[i] < shape_.vocab, FormatError,
          "the token " << t[i] << " for step " << m << " is outside the vocab of " << shape_.vocab);
      if (cancelled && cancelled(ids[i])) {  // no step of it is in flight: every stage drops it
        live.erase(ids[i]);
        pass(header(kCancel, ids[i]));
      } else {
        ready.push_back({ids[i], t[i]});
      }
    }
    // About one batch per stage travels, of equal size, so that every stage has one to
    // run while the others run theirs: a smaller one (a new sequence's first token, or
    // one thinned by sequences that ended) waits for the next to come back and joins it.
    const size_t most = (live.size() + range_.stages - 1) / static_cast<size_t>(range_.stages);
    if (ready.empty() || (ready.size() < most && !awaiting.empty())) continue;
    for (const auto& batch : chunks(ready, most)) {
      std::vector<int64_t> batch_ids;
      std::vector<int32_t> inputs;
      for (const auto& [id, token] : batch) {
        batch_ids.push_back(id);
        inputs.push_back(token);
      }
      advance(batch_ids, toDeviceI32(be, {static_cast<int64_t>(inputs.size()), 1}, inputs));
    }
    ready.clear();
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
    maybeReport(live.empty());
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
      const auto t0 = Clock::now();
      const std::vector<float> all = toHost(model_.decode(x, s.state, range_.begin, range_.end));
      stats_.busy_s += std::chrono::duration<double>(Clock::now() - t0).count();
      ++stats_.steps;
      ++stats_.rows;
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
    const auto t0 = Clock::now();
    const std::vector<float> all = toHost(
        model_.decodeEach(toDeviceI32(be, {batch, 1}, tokens), states, range_.begin, range_.end));
    stats_.busy_s += std::chrono::duration<double>(Clock::now() - t0).count();
    ++stats_.steps;
    stats_.rows += batch;
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
    maybeReport(live.empty());
    const Tensor m = prev_->recv({MessageKind::kActivation, n}, be);
    auto bad = [&](const std::string& what) {
      throw FormatError("step " + std::to_string(n) + " from " + prev_->peer() + ": " + what);
    };
    if (m.dtype() != DType::kI32 || m.shape().rank() != 1 || m.numel() < 1 + kFields)
      bad("not an entry count, headers of " + std::to_string(kFields) +
          " int32 values and activations");
    const std::vector<int32_t> message = toHostI32(m);
    const int64_t b = message[0];
    if (b < 1 || b > kMaxBatch || 1 + b * kFields > m.numel())
      bad("an entry count of " + std::to_string(b) + " in a message of " +
          std::to_string(m.numel()) + " values");
    std::vector<std::vector<int32_t>> heads;
    for (int64_t i = 0; i < b; ++i)
      heads.emplace_back(message.begin() + 1 + i * kFields,
                         message.begin() + 1 + (i + 1) * kFields);
    const std::vector<int32_t>& head = heads[0];
    const int64_t values = m.numel() - 1 - b * kFields;
    if (b == 1 && head[kOp] != kStep) {
      if (values != 0) bad("a control header with an activation");
      if (head[kOp] == kKeepAlive || head[kOp] == kEnd) {
        if (next_) next_->send({MessageKind::kActivation, n}, m);
        if (head[kOp] == kEnd) {
          if (!live.empty())
            bad("the end came with " + std::to_string(live.size()) + " sequences unfinished");
          return;
        }
        continue;
      }
      if (head[kOp] != kCancel) bad("unknown operation " + std::to_string(head[kOp]));
      if (live.erase(head[kId]) == 0)
        bad("cancels sequence " + std::to_string(head[kId]) + ", which is not in flight");
      if (next_) next_->send({MessageKind::kActivation, n}, m);
      continue;
    }
    std::vector<Sequence*> seqs;
    int64_t length = 0;
    for (const auto& h : heads) {
      const int64_t id = h[kId], round = h[kRound];
      if (h[kOp] != kStep) bad("operation " + std::to_string(h[kOp]) + " in a batch of steps");
      if (id < 0) bad("sequence id " + std::to_string(id));
      if (h[kLength] < 1 || h[kLength] > shape_.context || (b > 1 && h[kLength] != 1))
        bad("sequence " + std::to_string(id) + " of " + std::to_string(h[kLength]) +
            " tokens in a step of " + std::to_string(b));
      length += h[kLength];
      for (const Sequence* s : seqs)
        if (s->request.id == id) bad("sequence " + std::to_string(id) + " twice in one step");
      auto it = live.find(id);
      if (round == 0) {
        if (it != live.end()) bad("sequence " + std::to_string(id) + " began twice");
        it = live.emplace(id, Sequence{requestOf(h, shape_.context, bad), DecodeState{}, 0, Rng(0)})
                 .first;
        it->second.rng = Rng(it->second.request.sampling.seed);
      } else if (it == live.end() || it->second.round != round) {
        bad("sequence " + std::to_string(id) + " round " + std::to_string(round) +
            (it == live.end() ? " is not in flight" : " is out of order"));
      }
      seqs.push_back(&it->second);
    }
    if (values == 0 || values % length != 0)
      bad("an activation of " + std::to_string(values) + " values for " + std::to_string(length) +
          " tokens");
    std::vector<float> activation(static_cast<size_t>(values));
    std::memcpy(activation.data(), message.data() + 1 + b * kFields,
                activation.size() * sizeof(float));
    const int64_t width = values / length;
    const Tensor x = toDevice(be, b > 1 ? Shape{b, 1, width} : Shape{1, length, width}, activation);
    step(seqs, x, n, std::move(heads), sink);
    for (Sequence* s : seqs)
      if (++s->round == s->request.count) live.erase(s->request.id);
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
