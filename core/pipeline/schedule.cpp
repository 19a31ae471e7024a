#include "core/pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "core/error.h"

namespace tandem {

std::string_view scheduleName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kForwardOnly:
      return "forward";
    case ScheduleKind::kZeroBubbleH1:
      return "zb-h1";
    case ScheduleKind::kInterleaved1F1B:
      return "interleaved";
  }
  return "invalid";
}

ScheduleKind parseSchedule(std::string_view name) {
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kZeroBubbleH1,
                         ScheduleKind::kInterleaved1F1B, ScheduleKind::kForwardOnly})
    if (name == scheduleName(k)) return k;
  std::ostringstream os;
  os << "unknown schedule '" << name << "' (expected gpipe, 1f1b, zb-h1, interleaved or forward)";
  throw InvalidArgument(os.str());
}

bool isTraining(ScheduleKind kind) { return kind != ScheduleKind::kForwardOnly; }

int64_t interleavedWarmup(int stage, int stages, int chunks) {
  return 2 * static_cast<int64_t>(stages - stage - 1) + static_cast<int64_t>(chunks - 1) * stages;
}

namespace {

// The actions around one forward or backward of microbatch k at stage s of p, on chunk c
// of v (virtual stage c * p + s of p * v; one chunk for every kind but the interleaved).
void addForward(std::vector<Action>& out, int s, int p, int64_t k, int32_t c = 0, int v = 1) {
  const int64_t vs = static_cast<int64_t>(c) * p + s, last = static_cast<int64_t>(p) * v - 1;
  if (vs > 0) out.push_back({ActionType::kRecvActivation, k, c});
  out.push_back({ActionType::kForward, k, c});
  if (vs < last) out.push_back({ActionType::kSendActivation, k, c});
}

void addBackward(std::vector<Action>& out, int s, int p, int64_t k, int32_t c = 0, int v = 1) {
  const int64_t vs = static_cast<int64_t>(c) * p + s, last = static_cast<int64_t>(p) * v - 1;
  if (vs < last) out.push_back({ActionType::kRecvGradient, k, c});
  out.push_back({ActionType::kBackward, k, c});
  if (vs > 0) {
    out.push_back({ActionType::kSendGradient, k, c});
    out.push_back({ActionType::kWeightGradient, k, c});
  }
}

// ZB-H1's lists (ScheduleKind::kZeroBubbleH1): every stage run in unit ticks, each
// choosing its next compute action as the kind's comment says; the communication actions
// go around them as in the other schedules.
std::vector<std::vector<Action>> zeroBubbleH1(int p, int64_t m) {
  struct St {
    int64_t next_f = 0, next_b = 0, held = 0;
    std::vector<int64_t> weights;  // backwards whose weight gradient is pending, in order
    int64_t busy_until = 0;        // the tick its current action ends
    std::vector<Action> out;
  };
  const int64_t limit = std::min<int64_t>(p, m);  // what 1F1B's first stage holds
  std::vector<St> st(static_cast<size_t>(p));
  constexpr int64_t kNever = -1;
  // When stage s's forward / backward of microbatch k ended (kNever: not yet).
  std::vector<std::vector<int64_t>> f_end(static_cast<size_t>(p),
                                          std::vector<int64_t>(static_cast<size_t>(m), kNever));
  std::vector<std::vector<int64_t>> b_end = f_end;
  auto ended = [](const std::vector<int64_t>& ends, int64_t k, int64_t t) {
    return ends[static_cast<size_t>(k)] != kNever && ends[static_cast<size_t>(k)] <= t;
  };
  auto done = [&] {
    for (const St& x : st)
      if (x.next_b < m || !x.weights.empty()) return false;
    return true;
  };
  for (int64_t t = 0; !done(); ++t) {
    for (int s = 0; s < p; ++s) {
      St& x = st[static_cast<size_t>(s)];
      if (x.busy_until > t) continue;
      const bool grad_in =
          x.next_b < m && (s == p - 1 || ended(b_end[static_cast<size_t>(s + 1)], x.next_b, t));
      const bool act_in =
          x.next_f < m && (s == 0 || ended(f_end[static_cast<size_t>(s - 1)], x.next_f, t));
      if (x.next_b < x.next_f && grad_in) {
        const int64_t k = x.next_b++;
        if (s < p - 1) x.out.push_back({ActionType::kRecvGradient, k});
        x.out.push_back({ActionType::kBackward, k});
        if (s > 0) x.out.push_back({ActionType::kSendGradient, k});
        x.weights.push_back(k);
        x.busy_until = t + 1;
        b_end[static_cast<size_t>(s)][static_cast<size_t>(k)] = x.busy_until;
      } else if (x.held < limit && act_in) {
        const int64_t k = x.next_f++;
        ++x.held;
        if (s > 0) x.out.push_back({ActionType::kRecvActivation, k});
        x.out.push_back({ActionType::kForward, k});
        if (s < p - 1) x.out.push_back({ActionType::kSendActivation, k});
        x.busy_until = t + 1;
        f_end[static_cast<size_t>(s)][static_cast<size_t>(k)] = x.busy_until;
      } else if (!x.weights.empty()) {
        x.out.push_back({ActionType::kWeightGradient, x.weights.front()});
        x.weights.erase(x.weights.begin());
        --x.held;
        x.busy_until = t + 1;
      }
    }
  }
  std::vector<std::vector<Action>> lists;
  for (St& x : st) {
    x.out.push_back({ActionType::kStep, 0});
    lists.push_back(std::move(x.out));
  }
  return lists;
}

// Interleaved 1F1B's order of (microbatch, chunk) forwards: groups of p microbatches (the
// last one smaller when p does not divide m), each through chunk 0, then chunk 1, ...;
// backwards the same with the chunks in reverse.
std::vector<std::pair<int64_t, int32_t>> interleavedOrder(int p, int64_t m, int v, bool backward) {
  std::vector<std::pair<int64_t, int32_t>> order;
  for (int64_t g = 0; g < m; g += p)
    for (int c = 0; c < v; ++c)
      for (int64_t k = g; k < std::min<int64_t>(m, g + p); ++k)
        order.emplace_back(k, static_cast<int32_t>(backward ? v - 1 - c : c));
  return order;
}

// Interleaved 1F1B's list for stage s of p with v chunks (ScheduleKind::kInterleaved1F1B).
// `warmup`: forwards before the first backward (-1: the kind's own count).
std::vector<Action> interleaved(int s, int p, int64_t m, int v, int64_t warmup) {
  const int64_t total = v * m;
  const auto forwards = interleavedOrder(p, m, v, false);
  const auto backwards = interleavedOrder(p, m, v, true);
  auto forward = [&](std::vector<Action>& out, int64_t i) {
    const auto [k, c] = forwards[static_cast<size_t>(i)];
    addForward(out, s, p, k, c, v);
  };
  auto backward = [&](std::vector<Action>& out, int64_t i) {
    const auto [k, c] = backwards[static_cast<size_t>(i)];
    addBackward(out, s, p, k, c, v);
  };
  if (warmup < 0) warmup = interleavedWarmup(s, p, v);
  warmup = std::min(warmup, total);
  std::vector<Action> out;
  for (int64_t i = 0; i < warmup; ++i) forward(out, i);
  for (int64_t i = 0; i < total - warmup; ++i) {
    forward(out, warmup + i);
    backward(out, i);
  }
  for (int64_t i = total - warmup; i < total; ++i) backward(out, i);
  out.push_back({ActionType::kStep, 0});
  return out;
}

// Whether interleaved 1F1B's own warm-up holds for p, m and v: always when p divides m;
// with a smaller last group the lists are run against each other once (and cached).
bool interleavedWarmupHolds(int p, int64_t m, int v) {
  if (m % p == 0) return true;
  static std::mutex mu;
  static std::map<std::tuple<int, int64_t, int>, bool> known;
  std::lock_guard lock(mu);
  const auto key = std::make_tuple(p, m, v);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < p; ++s) lists.push_back(interleaved(s, p, m, v, -1));
  bool holds = true;
  try {
    validateSchedule(lists, m, true);
  } catch (const InvalidArgument&) {
    holds = false;
  }
  return known[key] = holds;
}

}  // namespace

std::vector<Action> stageActions(ScheduleKind kind, int stage, int stages, int64_t microbatches,
                                 int chunks) {
  TANDEM_CHECK_MSG(stages > 0 && stage >= 0 && stage < stages, InvalidArgument,
                   "stage " << stage << " of " << stages << " does not exist");
  TANDEM_CHECK_MSG(microbatches > 0, InvalidArgument,
                   "a schedule needs at least 1 microbatch, got " << microbatches);
  TANDEM_CHECK_MSG(
      chunks == 1 || kind == ScheduleKind::kInterleaved1F1B || kind == ScheduleKind::kForwardOnly,
      InvalidArgument,
      "schedule '" << scheduleName(kind) << "' runs one chunk per stage, not " << chunks
                   << " (chunks are for interleaved)");
  TANDEM_CHECK_MSG(chunks >= 1 && chunks <= 64, InvalidArgument,
                   "chunks per stage must be 1 to 64, got " << chunks);
  const int s = stage, p = stages;
  const int64_t m = microbatches;
  std::vector<Action> out;
  switch (kind) {
    case ScheduleKind::kForwardOnly:
      if (chunks == 1) {
        for (int64_t k = 0; k < m; ++k) addForward(out, s, p, k);
        return out;
      }
      // Interleaved stages: in interleaved 1F1B's order of forwards.
      for (const auto& [k, c] : interleavedOrder(p, m, chunks, false))
        addForward(out, s, p, k, c, chunks);
      return out;
    case ScheduleKind::kZeroBubbleH1:
      return zeroBubbleH1(p, m)[static_cast<size_t>(s)];
    case ScheduleKind::kInterleaved1F1B:
      // A last group smaller than p (a step's microbatches not a multiple of the stages)
      // may not fit the kind's warm-up: then every forward goes first.
      return interleaved(s, p, m, chunks, interleavedWarmupHolds(p, m, chunks) ? -1 : chunks * m);
    case ScheduleKind::kGPipe:
      for (int64_t k = 0; k < m; ++k) addForward(out, s, p, k);
      for (int64_t k = 0; k < m; ++k) addBackward(out, s, p, k);
      break;
    case ScheduleKind::k1F1B: {
      // Warm-up: enough forwards to fill the stages after this one; then one forward and
      // one backward in turn; then the remaining backwards.
      const int64_t warmup = std::min<int64_t>(p - s - 1, m);
      for (int64_t k = 0; k < warmup; ++k) addForward(out, s, p, k);
      for (int64_t k = warmup; k < m; ++k) {
        addForward(out, s, p, k);
        addBackward(out, s, p, k - warmup);
      }
      for (int64_t k = m - warmup; k < m; ++k) addBackward(out, s, p, k);
      break;
    }
  }
  out.push_back({ActionType::kStep, 0});
  return out;
}

std::vector<std::vector<Action>> scheduleActions(ScheduleKind kind, int stages,
                                                 int64_t microbatches, int chunks) {
  if (kind == ScheduleKind::kZeroBubbleH1) {  // every stage's list comes out of one run
    stageActions(kind, 0, stages, microbatches, chunks);  // the argument checks
    return zeroBubbleH1(stages, microbatches);
  }
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < stages; ++s)
    lists.push_back(stageActions(kind, s, stages, microbatches, chunks));
  return lists;
}

std::string describe(const Action& a) {
  std::string_view name = "step";
  switch (a.type) {
    case ActionType::kForward:
      name = "forward ";
      break;
    case ActionType::kBackward:
      name = "backward ";
      break;
    case ActionType::kWeightGradient:
      name = "weight gradient ";
      break;
    case ActionType::kSendActivation:
      name = "send activation ";
      break;
    case ActionType::kRecvActivation:
      name = "receive activation ";
      break;
    case ActionType::kSendGradient:
      name = "send gradient ";
      break;
    case ActionType::kRecvGradient:
      name = "receive gradient ";
      break;
    case ActionType::kStep:
      return "step";
  }
  // Appends: GCC 12 at -O3 warns falsely (-Wrestrict) on a literal plus a string.
  std::string out = std::string(name).append(std::to_string(a.microbatch));
  if (a.chunk != 0) out.append(" of chunk ").append(std::to_string(a.chunk));
  return out;
}

namespace {

// One stage's state while the lists run against each other. Per (chunk, microbatch)
// flags are indexed chunk * m + microbatch.
struct StageState {
  size_t pc = 0;
  int64_t clock = 0;
  std::vector<char> forwarded, backwarded, weighted, act_in, grad_in;
  // Per chunk: any weight gradient, so every backward of that chunk must have one.
  std::vector<char> splits;
  std::vector<int64_t> act_out, grad_out;  // tick the message was sent; -1: not sent
  int64_t stash = 0, peak = 0, steps = 0;
};

class Simulation {
 public:
  Simulation(const std::vector<std::vector<Action>>& lists, int64_t m, bool training, int bticks,
             int wticks)
      : lists_(lists),
        m_(m),
        training_(training),
        bticks_(bticks),
        wticks_(wticks),
        p_(static_cast<int64_t>(lists.size())),
        st_(lists.size()) {
    for (size_t i = 0; i < lists.size(); ++i)
      for (size_t a = 0; a < lists[i].size(); ++a) {
        TANDEM_CHECK_MSG(lists[i][a].chunk >= 0 && lists[i][a].chunk < 64, InvalidArgument,
                         "schedule: stage " << i << ", action " << a << " ("
                                            << describe(lists[i][a]) << "): chunk outside 0..63");
        chunks_ = std::max<int64_t>(chunks_, lists[i][a].chunk + 1);
      }
    const auto cells = static_cast<size_t>(chunks_ * m);
    for (size_t i = 0; i < st_.size(); ++i) {
      StageState& s = st_[i];
      s.forwarded.assign(cells, 0);
      s.backwarded = s.weighted = s.act_in = s.grad_in = s.forwarded;
      s.act_out.assign(cells, -1);
      s.grad_out = s.act_out;
      s.splits.assign(static_cast<size_t>(chunks_), 0);
      for (const Action& a : lists[i])
        if (a.type == ActionType::kWeightGradient) s.splits[static_cast<size_t>(a.chunk)] = 1;
    }
    report_.ticks.resize(lists.size());
  }

  ScheduleReport run() {
    for (;;) {
      bool progress = false, done = true;
      for (size_t s = 0; s < st_.size(); ++s) {
        while (st_[s].pc < lists_[s].size() && advance(s)) progress = true;
        done = done && st_[s].pc == lists_[s].size();
      }
      if (done) break;
      if (!progress) deadlock();
    }
    checkComplete();
    int64_t busy = 0;
    for (size_t s = 0; s < st_.size(); ++s) {
      report_.makespan = std::max(report_.makespan, st_[s].clock);
      report_.peak_stash.push_back(st_[s].peak);
      for (const auto& c : report_.ticks[s]) busy += c.busy;
    }
    for (auto& row : report_.ticks) row.resize(static_cast<size_t>(report_.makespan));
    const int64_t total = p_ * report_.makespan;
    report_.bubble = total ? 1.0 - static_cast<double>(busy) / static_cast<double>(total) : 0.0;
    return report_;
  }

 private:
  [[noreturn]] void fail(size_t s, const std::string& why) const {
    std::ostringstream os;
    os << "schedule: stage " << s << ", action " << st_[s].pc << " ("
       << describe(lists_[s][st_[s].pc]) << "): " << why;
    throw InvalidArgument(os.str());
  }

  void compute(size_t s, const Action& a, int64_t ticks) {
    StageState& st = st_[s];
    auto& row = report_.ticks[s];
    row.resize(static_cast<size_t>(st.clock + ticks));
    for (int64_t t = st.clock; t < st.clock + ticks; ++t)
      row[static_cast<size_t>(t)] = {true, a.type, a.microbatch, a.chunk};
    st.clock += ticks;
  }

  // Virtual stage `vs` (chunk vs / p of stage vs % p): its stage, and the flag index of
  // microbatch k there.
  size_t stageOf(int64_t vs) const { return static_cast<size_t>(vs % p_); }
  size_t at(int64_t vs, int64_t k) const { return static_cast<size_t>((vs / p_) * m_ + k); }

  // Runs stage s's next action; false if it must wait for a message.
  bool advance(size_t s) {
    StageState& st = st_[s];
    const Action& a = lists_[s][st.pc];
    const int64_t vs = a.chunk * p_ + static_cast<int64_t>(s), last = chunks_ * p_ - 1;
    const size_t i = at(vs, a.microbatch);
    if (a.type != ActionType::kStep && (a.microbatch < 0 || a.microbatch >= m_))
      fail(s, std::string("microbatch outside 0..").append(std::to_string(m_ - 1)));
    if (!training_ && (a.type == ActionType::kBackward || a.type == ActionType::kWeightGradient ||
                       a.type == ActionType::kSendGradient || a.type == ActionType::kRecvGradient ||
                       a.type == ActionType::kStep))
      fail(s, "not allowed in a forward-only schedule");
    switch (a.type) {
      case ActionType::kRecvActivation: {
        if (vs == 0) fail(s, "the first stage has no previous stage");
        if (st.act_in[i]) fail(s, "received twice");
        const int64_t sent = st_[stageOf(vs - 1)].act_out[at(vs - 1, a.microbatch)];
        if (sent < 0) return false;
        st.act_in[i] = 1;
        st.clock = std::max(st.clock, sent);
        break;
      }
      case ActionType::kForward:
        if (st.forwarded[i]) fail(s, "forwarded twice");
        if (vs > 0 && !st.act_in[i]) fail(s, "runs before its activation is received");
        st.forwarded[i] = 1;
        compute(s, a, 1);
        if (training_) st.peak = std::max(st.peak, ++st.stash);
        break;
      case ActionType::kSendActivation:
        if (vs == last) fail(s, "the last stage has no next stage");
        if (!st.forwarded[i]) fail(s, "sends an activation not yet computed");
        if (st.act_out[i] >= 0) fail(s, "sent twice");
        st.act_out[i] = st.clock;
        break;
      case ActionType::kRecvGradient: {
        if (vs == last) fail(s, "the last stage has no next stage");
        if (st.grad_in[i]) fail(s, "received twice");
        const int64_t sent = st_[stageOf(vs + 1)].grad_out[at(vs + 1, a.microbatch)];
        if (sent < 0) return false;
        st.grad_in[i] = 1;
        st.clock = std::max(st.clock, sent);
        break;
      }
      case ActionType::kBackward: {
        const bool splits = st.splits[static_cast<size_t>(a.chunk)];
        if (st.backwarded[i]) fail(s, "backward twice");
        if (!st.forwarded[i]) fail(s, "runs before its forward");
        if (vs < last && !st.grad_in[i]) fail(s, "runs before its gradient is received");
        st.backwarded[i] = 1;
        compute(s, a, splits ? bticks_ : bticks_ + wticks_);
        if (!splits) --st.stash;  // else its weight gradient still needs the stash
        break;
      }
      case ActionType::kWeightGradient:
        if (st.weighted[i]) fail(s, "weight gradient twice");
        if (!st.backwarded[i]) fail(s, "runs before its backward");
        st.weighted[i] = 1;
        if (wticks_ > 0) compute(s, a, wticks_);
        --st.stash;
        break;
      case ActionType::kSendGradient:
        if (vs == 0) fail(s, "the first stage has no previous stage");
        if (!st.backwarded[i]) fail(s, "sends a gradient not yet computed");
        if (st.grad_out[i] >= 0) fail(s, "sent twice");
        st.grad_out[i] = st.clock;
        break;
      case ActionType::kStep:
        if (st.steps++) fail(s, "a second step");
        for (int64_t c = 0; c < chunks_; ++c)
          for (int64_t k = 0; k < m_; ++k) {
            const auto j = static_cast<size_t>(c * m_ + k);
            std::ostringstream os;
            if (!st.backwarded[j])
              os << "a step before the backward of microbatch " << k;
            else if (st.splits[static_cast<size_t>(c)] && !st.weighted[j])
              os << "a step before the weight gradient of microbatch " << k;
            else
              continue;
            if (c > 0) os << " of chunk " << c;
            fail(s, os.str());
          }
        if (st.pc + 1 != lists_[s].size()) fail(s, "the step must be the stage's last action");
        break;
    }
    ++st.pc;
    return true;
  }

  [[noreturn]] void deadlock() const {
    std::ostringstream os;
    os << "schedule: deadlock:";
    for (size_t s = 0; s < st_.size(); ++s)
      if (st_[s].pc < lists_[s].size())
        os << " stage " << s << " waits at action " << st_[s].pc << " ("
           << describe(lists_[s][st_[s].pc]) << ");";
    throw InvalidArgument(os.str());
  }

  void checkComplete() const {
    const int64_t last = chunks_ * p_ - 1;
    for (size_t s = 0; s < st_.size(); ++s) {
      const StageState& st = st_[s];
      for (int64_t c = 0; c < chunks_; ++c) {
        const int64_t vs = c * p_ + static_cast<int64_t>(s);
        auto missing = [&](const char* what, int64_t k = -1) {
          std::ostringstream os;
          os << "schedule: stage " << s << " never " << what;
          if (k >= 0) os << " microbatch " << k;
          if (k >= 0 && c > 0) os << " of chunk " << c;
          throw InvalidArgument(os.str());
        };
        for (int64_t k = 0; k < m_; ++k) {
          const size_t i = at(vs, k);
          if (!st.forwarded[i]) missing("forwards", k);
          if (vs < last && st.act_out[i] < 0) missing("sends the activation of", k);
          if (vs > 0 && !st.act_in[i]) missing("receives the activation of", k);
          if (!training_) continue;
          if (!st.backwarded[i]) missing("runs the backward of", k);
          if (vs > 0 && st.grad_out[i] < 0) missing("sends the gradient of", k);
          if (vs < last && !st.grad_in[i]) missing("receives the gradient of", k);
        }
      }
      if (training_ && st.steps != 1) missingStep(s);
    }
  }
  [[noreturn]] static void missingStep(size_t s) {
    std::ostringstream os;
    os << "schedule: stage " << s << " never steps the optimizer";
    throw InvalidArgument(os.str());
  }

  const std::vector<std::vector<Action>>& lists_;
  int64_t m_;
  bool training_;
  int bticks_, wticks_;
  int64_t p_, chunks_ = 1;
  std::vector<StageState> st_;
  ScheduleReport report_;
};

}  // namespace

ScheduleReport validateSchedule(const std::vector<std::vector<Action>>& lists, int64_t microbatches,
                                bool training, int backward_ticks, int weight_ticks) {
  TANDEM_CHECK_MSG(!lists.empty(), InvalidArgument, "schedule: no stages");
  TANDEM_CHECK_MSG(microbatches > 0, InvalidArgument,
                   "schedule: needs at least 1 microbatch, got " << microbatches);
  TANDEM_CHECK_MSG(backward_ticks > 0 && weight_ticks >= 0, InvalidArgument,
                   "schedule: backward_ticks must be > 0 and weight_ticks >= 0");
  return Simulation(lists, microbatches, training, backward_ticks, weight_ticks).run();
}

double bubbleFormula(ScheduleKind kind, int stages, int64_t microbatches, int chunks) {
  const double p = stages, m = static_cast<double>(microbatches);
  if (kind == ScheduleKind::kZeroBubbleH1) return (p - 1) / (3 * m + p - 1);
  if (kind == ScheduleKind::kInterleaved1F1B) return (p - 1) / (chunks * m + p - 1);
  if (kind == ScheduleKind::kForwardOnly) return (p - 1) / (m + p - 1);
  return (p - 1) / (m + p - 1);
}

std::string renderSchedule(ScheduleKind kind, int stages, int64_t microbatches, int chunks) {
  const auto lists = scheduleActions(kind, stages, microbatches, chunks);
  // GPipe and 1F1B as their papers draw them (a backward one tick, weight gradients in
  // it); ZB-H1 with its weight gradients a tick of their own, as its paper's formula has.
  const bool zb = kind == ScheduleKind::kZeroBubbleH1;
  const ScheduleReport r = validateSchedule(lists, microbatches, isTraining(kind), 1, zb ? 1 : 0);
  std::ostringstream os;
  os << scheduleName(kind) << ": " << stages << " stage(s), " << microbatches << " microbatch(es)";
  if (chunks > 1) os << ", " << chunks << " chunks per stage";
  os << "\n\n";
  for (size_t s = 0; s < lists.size(); ++s) {
    os << "stage " << s << ":";
    for (size_t i = 0; i < lists[s].size(); ++i) os << (i ? ", " : " ") << describe(lists[s][i]);
    os << "\n";
  }
  const size_t width = std::to_string(microbatches - 1).size() + (chunks > 1 ? 2 : 1);
  os << "\n";
  for (size_t s = 0; s < r.ticks.size(); ++s) {
    os << "stage " << s << " |";
    for (const auto& c : r.ticks[s]) {
      std::ostringstream cell;
      if (c.busy)
        cell << (c.type == ActionType::kForward          ? 'F'
                 : c.type == ActionType::kWeightGradient ? 'W'
                                                         : 'B')
             << c.microbatch;
      if (c.busy && chunks > 1) cell << static_cast<char>('a' + c.chunk);
      std::string text = cell.str();
      text.resize(width, c.busy ? ' ' : '.');
      os << text << "|";
    }
    os << "\n";
  }
  os << "\nbubble: " << r.bubble << " of stage time (formula "
     << (kind == ScheduleKind::kZeroBubbleH1      ? "(p-1)/(3m+p-1)"
         : kind == ScheduleKind::kInterleaved1F1B ? "(p-1)/(vm+p-1)"
                                                  : "(p-1)/(m+p-1)")
     << ": " << bubbleFormula(kind, stages, microbatches, chunks) << ")\n";
  os << "peak stashed microbatches per stage:";
  for (int64_t n : r.peak_stash) os << " " << n;
  os << "\n";
  return os.str();
}

}  // namespace tandem
