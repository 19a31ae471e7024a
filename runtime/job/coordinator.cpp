#include "runtime/job/coordinator.h"

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "runtime/control/listener.h"
#include "runtime/job/mailbox.h"
#include "runtime/node/chunks.h"
#include "runtime/node/node_info.h"

namespace tandem::runtime {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class Run {
 public:
  Run(const std::vector<Assign>& assignments, const std::vector<std::string>& names,
      Launcher& launcher, const RunCallbacks& callbacks, const RunOptions& options)
      : assignments_(assignments),
        names_(names),
        launcher_(launcher),
        callbacks_(callbacks),
        options_(options),
        n_(static_cast<int>(assignments.size())) {
    TANDEM_CHECK_MSG(
        names.size() == assignments.size(), InvalidArgument,
        "coordinate: " << names.size() << " names for " << assignments.size() << " assignments");
    for (int i = 0; i < n_; ++i) {
      const Assign& a = assignments[static_cast<size_t>(i)];
      slot_of_[{a.stage, a.replica}] = i;
    }
  }

  RunResult run() {
    try {
      connectAll();
      exchange();
      // Every worker has reported: they may close their links now (awaitRunEnd).
      for (const std::unique_ptr<Channel>& c : channels_) {
        try {
          c->send(Leave{"the run is over"}, 1s);
        } catch (const Error&) {  // it has gone already
        }
      }
      const std::string ended = launcher_.finish(30s);
      if (!ended.empty()) throw Error(ended);
      std::erase_if(in_flight_, [](const auto& f) { return f.second.cancelled; });
      if (!in_flight_.empty())
        throw Error("the run ended with " + std::to_string(in_flight_.size()) +
                    " prompts unanswered (the first: request " +
                    std::to_string(in_flight_.begin()->first) + ")");
      return std::move(result_);
    } catch (...) {
      mailbox_.reset();
      launcher_.stopAll();
      throw;
    }
  }

 private:
  // Starts every worker and waits for each to connect, say which it is and take its
  // assignment.
  void connectAll() {
    checkInterrupt();
    const ClusterKey key = generateClusterKey();
    HandshakeOptions ho;
    ho.build = buildName();
    Listener listener(options_.listen, key, ho);
    for (int i = 0; i < n_; ++i) {
      const int64_t pid = launcher_.start(i, listener.endpoint(), key);
      if (callbacks_.started) callbacks_.started(i, pid);
    }
    channels_.resize(static_cast<size_t>(n_));
    const auto deadline = Clock::now() + options_.connect_timeout;
    for (int connected = 0; connected < n_;) {
      checkInterrupt();
      if (Clock::now() > deadline)
        throw Timeout(std::to_string(n_ - connected) + " of " + std::to_string(n_) +
                      " workers did not connect within " +
                      std::to_string(options_.connect_timeout.count() / 1000) + " s");
      if (const auto e = launcher_.ended())
        throw Error(names_[static_cast<size_t>(e->slot)] + " " + e->how + " before connecting");
      // (Connections without the run's key are refused and logged by the listener: they
      // do not end the run.)
      std::unique_ptr<Channel> c = listener.accept(200ms);
      if (!c) continue;
      const std::optional<Message> m = c->recv(10s);
      const auto* hello = m ? std::get_if<WorkerHello>(&*m) : nullptr;
      if (!hello || hello->slot >= n_ || channels_[static_cast<size_t>(hello->slot)])
        throw FormatError("a worker connected from " + c->peer() + " without saying which of the " +
                          std::to_string(n_) + " workers it is");
      const auto slot = static_cast<size_t>(hello->slot);
      c->send(assignments_[slot]);
      channels_[slot] = std::move(c);
      ++connected;
    }
    mailbox_ = std::make_unique<Mailbox>(channels_, options_.prompts);
  }

  // Wires the workers together and relays what they say until every one has reported.
  void exchange() {
    result_.ready.resize(static_cast<size_t>(n_));
    result_.reports.resize(static_cast<size_t>(n_));
    result_.slices.resize(static_cast<size_t>(n_));
    slices_.resize(static_cast<size_t>(n_));
    std::vector<bool> ready(static_cast<size_t>(n_)), reported(static_cast<size_t>(n_));
    int readies = 0, reports = 0;
    std::map<int, std::map<int, std::string>> groups;  // stage -> replica -> address
    auto last_word = Clock::now();
    // A worker that exited before reporting: its `failed` message, if it sent one, says
    // more than its exit code, and may still be on its way.
    std::optional<Launcher::Ended> gone;
    auto gone_at = Clock::now();
    while (reports < n_) {
      checkInterrupt();
      if (!gone) {
        if (const auto e = launcher_.ended(); e && !reported[static_cast<size_t>(e->slot)]) {
          if (e->killed)
            throw WorkerLost(
                names_[static_cast<size_t>(e->slot)] + " " + e->how + " before finishing", e->slot);
          gone = e;
          gone_at = Clock::now();
        }
      } else if (Clock::now() - gone_at > 1s) {
        throw Error(names_[static_cast<size_t>(gone->slot)] + " " + gone->how +
                    " before finishing");
      }
      const std::optional<Mailbox::Item> item = mailbox_->next(200ms);
      if (!item) {
        if (options_.silence.count() > 0 && Clock::now() - last_word > options_.silence)
          throw Timeout("no word from any worker for " +
                        std::to_string(options_.silence.count() / 1000) + " s");
        continue;
      }
      last_word = Clock::now();
      if (item->slot < 0) {  // a prompt, or their end: for stage 0 once it has started
        prompts_.push_back(std::move(*item->message));
        if (started_) passPrompts();
        continue;
      }
      const int slot = item->slot;
      const auto s = static_cast<size_t>(slot);
      if (!item->message) {
        if (reported[s]) continue;  // it said all it had to say, then went
        fail(slot, item->error);
      }
      const Message& m = *item->message;
      if (const auto* r = std::get_if<Ready>(&m)) {
        if (ready[s]) fail(slot, "said it was ready twice");
        ready[s] = true;
        result_.ready[s] = *r;
        if (++readies == n_) startAll();
      } else if (const auto* g = std::get_if<GroupAddress>(&m)) {
        const Assign& a = assignments_[s];
        groups[a.stage][a.replica] = g->address;
        if (static_cast<int>(groups[a.stage].size()) == a.replicas) {
          GroupAddresses all;
          for (const auto& [replica, address] : groups[a.stage]) all.addresses.push_back(address);
          for (int r = 0; r < a.replicas; ++r) sendTo(slotOf(a.stage, r), all);
          groups.erase(a.stage);
        }
      } else if (const auto* w = std::get_if<WeightsRequest>(&m)) {
        ship(slot, w->hash);
      } else if (const auto* c = std::get_if<WeightsChunk>(&m)) {
        if (reported[s]) fail(slot, "sent a trained slice after its report");
        gather(slot, *c);
      } else if (const auto* p = std::get_if<Progress>(&m)) {
        if (callbacks_.progress) callbacks_.progress(*p);
      } else if (const auto* e = std::get_if<EpochDone>(&m)) {
        if (callbacks_.epoch) callbacks_.epoch(*e);
      } else if (const auto* i = std::get_if<InferDone>(&m)) {
        if (callbacks_.infer) callbacks_.infer(*i);
      } else if (const auto* report = std::get_if<StageReport>(&m)) {
        if (reported[s]) fail(slot, "reported twice");
        takeSlice(slot, *report);
        reported[s] = true;
        if (gone && gone->slot == slot) gone.reset();  // it reported, then exited
        result_.reports[s] = *report;
        const double offset = launcher_.clockOffset(slot);
        for (Span& span : result_.reports[s].spans) {
          span.start_s -= offset;
          span.end_s -= offset;
        }
        ++reports;
      } else if (const auto* k = std::get_if<Checkpointed>(&m)) {
        checkpointed(slot, *k);
      } else if (const auto* an = std::get_if<Answer>(&m)) {
        answered(slot, *an);
      } else if (const auto* t = std::get_if<Token>(&m)) {
        generated(slot, *t);
      } else if (const auto* b = std::get_if<StageBusy>(&m)) {
        const Assign& a = assignments_[static_cast<size_t>(slot)];
        if (a.mode != RunMode::kGenerate)
          fail(slot, "sent 'stage busy', not being a generation stage");
        if (callbacks_.stage_busy) callbacks_.stage_busy(a.stage, *b);
      } else if (const auto* f = std::get_if<Failed>(&m)) {
        // A worker whose link's peer went away reports after, or before, that peer's own
        // failure: the peer's is the cause, named first when it arrives within a second.
        if (Mailbox::failedOnAPeer(f->message))
          if (const auto cause = mailbox_->causeBeside(slot, 1s))
            fail(cause->first, "failed: " + cause->second + "; then " +
                                   names_[static_cast<size_t>(slot)] + " failed: " + f->message);
        fail(slot, "failed: " + f->message);
      } else {
        fail(slot, std::string("sent an unexpected '") + messageName(m) + "' message");
      }
    }
  }

  // Sends worker `slot` the weights of `hash`, in order, in chunks.
  void ship(int slot, const std::string& hash) {
    const auto it = options_.weights.find(hash);
    if (it == options_.weights.end()) fail(slot, "asked for weights the run does not have");
    try {
      sendChunks(*channels_[static_cast<size_t>(slot)], hash, *it->second,
                 std::chrono::seconds(60));
    } catch (const IoError& e) {
      failSending(slot, e);
    }
  }

  // A piece of worker `slot`'s trained slice, which comes before its report.
  void gather(int slot, const WeightsChunk& c) {
    const auto s = static_cast<size_t>(slot);
    if (!assignments_[s].save && assignments_[s].checkpoint.every_steps == 0)
      fail(slot, "sent a trained slice it was not asked for");
    std::optional<ChunkGatherer>& g = slices_[s];
    try {
      if (!g) g.emplace(names_[s] + "'s trained slice", c.hash, c.total);
      g->add(c);
    } catch (const FormatError& e) {
      fail(slot, std::string("sent a bad trained slice: ") + e.what());
    }
  }

  // Worker `slot`'s slice at a checkpoint is in: once every stage's is, the caller gets
  // them all (slices by slot, empty for the replicas that send none).
  void checkpointed(int slot, const Checkpointed& c) {
    const auto s = static_cast<size_t>(slot);
    const Assign& a = assignments_[s];
    if (!sendsCheckpoints(a) || c.step % a.checkpoint.every_steps != 0)
      fail(slot, "sent a checkpoint at step " + std::to_string(c.step) + " it was not asked for");
    std::optional<ChunkGatherer>& g = slices_[s];
    if (!g || !g->done() || g->hash() != c.hash || g->total() != c.bytes)
      fail(slot, "sent a checkpoint without the whole slice it names (" + std::to_string(c.bytes) +
                     " bytes)");
    // Only replicas of the whole model cut their own batches, so only they have shares.
    if (!c.shares.empty() &&
        (a.stages != 1 || a.replicas < 2 || c.shares.size() != static_cast<size_t>(a.replicas)))
      fail(slot, "sent " + std::to_string(c.shares.size()) + " replicas' shares with its " +
                     "checkpoint at step " + std::to_string(c.step) + ", being " +
                     (a.stages != 1 ? "one of " + std::to_string(a.stages) + " stages"
                                    : "one of " + std::to_string(a.replicas) + " replicas"));
    Pending& at = checkpoints_[c.step];
    at.slices.resize(static_cast<size_t>(n_));
    if (!at.slices[s].empty())
      fail(slot, "sent its checkpoint at step " + std::to_string(c.step) + " twice");
    at.slices[s] = g->take();
    if (!c.shares.empty()) at.shares = c.shares;
    g.reset();
    for (int i = 0; i < n_; ++i) {
      const Assign& other = assignments_[static_cast<size_t>(i)];
      if (sendsCheckpoints(other) && at.slices[static_cast<size_t>(i)].empty())
        return;  // still on its way
    }
    if (callbacks_.checkpoint) callbacks_.checkpoint(c.step, at.slices, at.shares);
    checkpoints_.erase(c.step);
  }

  // Worker `slot` answered a request of an inference stream: passed on once checked
  // against the stream (the caller drops what it has already).
  void answered(int slot, const Answer& an) {
    const Assign& a = assignments_[static_cast<size_t>(slot)];
    if (a.mode != RunMode::kInfer || a.stage != a.stages - 1)
      fail(slot, "sent an answer, not being the last stage of an inference stream");
    if (test_samples_ < 0 || an.first < a.infer_from || an.first + an.count > test_samples_)
      fail(slot, "answered samples [" + std::to_string(an.first) + ", " +
                     std::to_string(an.first + an.count) + "), outside the stream's [" +
                     std::to_string(a.infer_from) + ", " + std::to_string(test_samples_) + ")");
    if (callbacks_.answer) callbacks_.answer(an);
  }

  // Generation: the prompts that came so far go to stage 0, each noted as in flight; a
  // cancel goes after its prompt, unless that has ended.
  void passPrompts() {
    for (; !prompts_.empty(); prompts_.pop_front()) {
      const Message& m = prompts_.front();
      if (const auto* p = std::get_if<Prompt>(&m))
        if (!in_flight_.emplace(p->id, InFlight{0, p->count, false}).second)
          throw InvalidArgument("prompt " + std::to_string(p->id) +
                                " was given while one of that id is in flight");
      if (const auto* c = std::get_if<CancelPrompt>(&m)) {
        const auto it = in_flight_.find(c->id);
        if (it == in_flight_.end() || it->second.cancelled) continue;
        it->second.cancelled = true;
        ++result_.cancelled;
      }
      sendTo(slotOf(0, 0), m);
    }
  }

  // Worker `slot` chose a token: passed on once checked to be the next of a prompt in
  // flight.
  void generated(int slot, const Token& t) {
    const Assign& a = assignments_[static_cast<size_t>(slot)];
    if (a.mode != RunMode::kGenerate || a.stage != a.stages - 1)
      fail(slot, "sent a token, not being the last stage of a generation run");
    const auto it = in_flight_.find(t.id);
    if (it == in_flight_.end())
      fail(slot, "sent a token for request " + std::to_string(t.id) + ", which is not in flight");
    auto& [next, count, cancelled] = it->second;
    if (t.index != next)
      fail(slot, "sent token " + std::to_string(t.index) + " of request " + std::to_string(t.id) +
                     " where token " + std::to_string(next) + " was due");
    const bool wanted = !cancelled;  // a cancelled one's tokens on their way still come
    if (cancelled) ++result_.tokens_after_cancel;
    if (++next == count) in_flight_.erase(it);
    if (wanted && callbacks_.token) callbacks_.token(t);
  }

  // Worker `slot` reported: its trained slice, if it was asked for one, must be whole.
  void takeSlice(int slot, const StageReport& report) {
    const auto s = static_cast<size_t>(slot);
    if (!assignments_[s].save) return;
    std::optional<ChunkGatherer>& g = slices_[s];
    if (!g || !g->done() || g->hash() != report.model_hash || g->total() != report.model_bytes)
      fail(slot, "reported without the whole trained slice it names (" +
                     std::to_string(report.model_bytes) + " bytes)");
    result_.slices[s] = g->take();
    g.reset();
  }

  // Every worker is ready: replica r of stage s learns, from every replica of the stages
  // beside it, the endpoint that replica bound for r. (Generating, the first stage's
  // `prev` is the last stage and the last's `next` the first.)
  void startAll() {
    int64_t train_samples = 0, test_samples = 0;
    for (int i = 0; i < n_; ++i)
      if (assignments_[static_cast<size_t>(i)].stage == 0) {
        train_samples = result_.ready[static_cast<size_t>(i)].train_samples;
        test_samples = result_.ready[static_cast<size_t>(i)].test_samples;
      }
    test_samples_ = test_samples;
    for (int i = 0; i < n_; ++i) {
      const Assign& a = assignments_[static_cast<size_t>(i)];
      Start start;
      start.train_samples = train_samples;
      start.test_samples = test_samples;
      const int before = (a.stage + a.stages - 1) % a.stages, after = (a.stage + 1) % a.stages;
      for (int j = 0; j < a.prev_replicas; ++j)
        start.prev.push_back(endpointFor(before, j, &Ready::next, a.replica));
      for (int j = 0; j < a.next_replicas; ++j)
        start.next.push_back(endpointFor(after, j, &Ready::prev, a.replica));
      sendTo(i, start);
    }
    started_ = true;
    if (callbacks_.wired) callbacks_.wired();
    passPrompts();
  }

  std::string endpointFor(int stage, int replica, std::vector<std::string> Ready::*side,
                          int index) {
    const int slot = slotOf(stage, replica);
    const std::vector<std::string>& list = result_.ready[static_cast<size_t>(slot)].*side;
    if (index >= static_cast<int>(list.size()))
      fail(slot, "listed " + std::to_string(list.size()) + " endpoints, too few");
    return list[static_cast<size_t>(index)];
  }

  void checkInterrupt() const {
    if (!options_.interrupt) return;
    const int s = options_.interrupt->load();
    if (s == 0) return;
    throw Interrupted(std::string("interrupted by ") + (s == SIGINT ? "SIGINT"
                                                        : s == SIGTERM
                                                            ? "SIGTERM"
                                                            : "signal " + std::to_string(s)));
  }

  int slotOf(int stage, int replica) const {
    const auto it = slot_of_.find({stage, replica});
    if (it == slot_of_.end())
      throw InvalidArgument("coordinate: no worker for stage " + std::to_string(stage) +
                            " replica " + std::to_string(replica));
    return it->second;
  }
  // Sends worker `slot` `m`; a channel that has broken fails the run with what the worker
  // said when it failed, if it did, rather than with the broken channel.
  void sendTo(int slot, const Message& m) {
    try {
      channels_[static_cast<size_t>(slot)]->send(m);
    } catch (const IoError& e) {
      failSending(slot, e);
    }
  }
  [[noreturn]] void failSending(int slot, const IoError& e) {
    if (const auto said = mailbox_->failureOf(slot, 1s)) fail(slot, "failed: " + *said);
    fail(slot, std::string("lost its connection: ") + e.what());
  }

  // Raises the failure of `slot`. A worker killed by a signal is the likely cause of
  // what the others report (their links to it break first): when a death by a signal is
  // seen within a second, it is named first, or instead when it is this worker's own.
  [[noreturn]] void fail(int slot, const std::string& what) {
    const auto until = Clock::now() + 1s;
    while (Clock::now() < until) {
      const auto e = launcher_.ended();
      if (!e) {
        std::this_thread::sleep_for(10ms);
        continue;
      }
      if (!e->killed) continue;
      const std::string killed = names_[static_cast<size_t>(e->slot)] + " " + e->how;
      if (e->slot == slot) throw WorkerLost(killed + " before finishing", e->slot);
      throw WorkerLost(
          killed + " before finishing; then " + names_[static_cast<size_t>(slot)] + " " + what,
          e->slot);
    }
    throw Error(names_[static_cast<size_t>(slot)] + " " + what);
  }

  const std::vector<Assign>& assignments_;
  const std::vector<std::string>& names_;
  Launcher& launcher_;
  const RunCallbacks& callbacks_;
  RunOptions options_;
  const int n_;
  std::map<std::pair<int, int>, int> slot_of_;  // (stage, replica) -> slot
  std::vector<std::unique_ptr<Channel>> channels_;
  std::unique_ptr<Mailbox> mailbox_;
  std::vector<std::optional<ChunkGatherer>> slices_;  // by slot, while they come in
  struct Pending {                                    // a checkpoint whose slices are coming in
    std::vector<std::vector<uint8_t>> slices;         // by slot
    std::vector<double> shares;                       // Checkpointed::shares
  };
  std::map<int64_t, Pending> checkpoints_;  // by step
  int64_t test_samples_ = -1;               // the stream's samples, once every worker is ready
  bool started_ = false;                    // every worker was told its neighbours
  // Generation: prompts not yet passed to stage 0 (until it starts), and those in flight
  // (id -> the next token due and the tokens asked for).
  std::deque<Message> prompts_;
  // Generation: per request in flight, its next token's index, its count, and whether its
  // client cancelled it (its sequence ends early on the stages).
  struct InFlight {
    int64_t next = 0, count = 0;
    bool cancelled = false;
  };
  std::map<int64_t, InFlight> in_flight_;
  RunResult result_;
};

}  // namespace

void PromptQueue::push(Prompt p) {
  {
    std::lock_guard lock(mu_);
    TANDEM_CHECK_MSG(!closed_, InvalidArgument, "a prompt was pushed after the queue was closed");
    queue_.push_back(Message{std::move(p)});
  }
  cv_.notify_one();
}

void PromptQueue::cancel(int64_t id) {
  {
    std::lock_guard lock(mu_);
    if (closed_) return;  // it ends anyway
    queue_.push_back(Message{CancelPrompt{id}});
  }
  cv_.notify_one();
}

void PromptQueue::close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  cv_.notify_one();
}

std::optional<Message> PromptQueue::pop(std::chrono::milliseconds wait) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, wait, [&] { return closed_ || !queue_.empty(); })) return std::nullopt;
  if (queue_.empty()) return Message{PromptsDone{}};
  Message m = std::move(queue_.front());
  queue_.pop_front();
  return m;
}

RunResult coordinate(const std::vector<Assign>& assignments, const std::vector<std::string>& names,
                     Launcher& launcher, const RunCallbacks& callbacks, const RunOptions& options) {
  Run run(assignments, names, launcher, callbacks, options);
  return run.run();
}

}  // namespace tandem::runtime
