#include "serve/engine.h"

#include <limits>
#include <map>

#include "core/error.h"

namespace tandem::serve {

Ticket::Taken Ticket::take() {
  std::lock_guard lock(mu_);
  Taken t;
  t.tokens.swap(tokens_);
  t.at_s.swap(at_s_);
  t.ended = ended_;
  t.error = error_;
  return t;
}

void Ticket::give(int32_t token, bool last) {
  {
    std::lock_guard lock(mu_);
    tokens_.push_back(token);
    at_s_.push_back(std::chrono::duration<double>(Clock::now() - submitted_).count());
    ended_ = ended_ || last;
  }
  if (wake_) wake_();
}

void Ticket::end(const std::string& error) {
  {
    std::lock_guard lock(mu_);
    if (ended_) return;
    ended_ = true;
    error_ = error;
  }
  if (wake_) wake_();
}

Engine::Engine(PipelineServe serve, EngineOptions options)
    : serve_(std::move(serve)), options_(options) {
  TANDEM_CHECK_MSG(options.in_flight >= 1 && options.max_queue >= 0, InvalidArgument,
                   "in flight " << options.in_flight << " and queue " << options.max_queue
                                << ": need at least 1 in flight and a queue of 0 or more");
  TANDEM_CHECK_MSG(options.deadline.count() >= 0, InvalidArgument,
                   "a negative deadline (" << options.deadline.count() << " ms)");
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (auto& t : queue_) t->cancel();
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<Ticket> Engine::submit(std::vector<int32_t> prompt, int64_t count,
                                       const SamplingOptions& sampling,
                                       std::function<void()> wake) {
  std::lock_guard lock(mu_);
  if (stopping_ || failure_ || queued_ + running_ >= options_.in_flight + options_.max_queue)
    return nullptr;
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.count = count;
  r.sampling = sampling;
  r.id = next_id_;
  next_id_ = (next_id_ + 1) % std::numeric_limits<int32_t>::max();
  std::shared_ptr<Ticket> t(new Ticket(std::move(r), std::move(wake)));
  queue_.push_back(t);
  ++queued_;
  cv_.notify_all();
  return t;
}

std::optional<std::string> Engine::failure() const {
  std::lock_guard lock(mu_);
  return failure_;
}

bool Engine::overdue(const Ticket& t) const {
  return options_.deadline.count() > 0 && Ticket::Clock::now() - t.submitted() > options_.deadline;
}

RequestPoll Engine::poll(std::chrono::milliseconds wait) {
  std::unique_lock lock(mu_);
  RequestPoll p;
  for (;;) {
    // Requests cancelled while they waited, or past the deadline (the oldest first: every
    // request has the same), leave the queue here.
    while (!queue_.empty() && (queue_.front()->cancelled() || overdue(*queue_.front()))) {
      queue_.front()->end();
      queue_.pop_front();
      --queued_;
    }
    if (!queue_.empty()) {
      std::shared_ptr<Ticket> t = std::move(queue_.front());
      queue_.pop_front();
      --queued_;
      ++running_;
      live_[t->request_.id] = t;
      p.request = t->request_;
      return p;
    }
    if (stopping_) {
      p.ended = true;
      return p;
    }
    if (wait.count() == 0 || cv_.wait_for(lock, wait) == std::cv_status::timeout) return p;
    wait = std::chrono::milliseconds(0);  // once woken, take what came (or nothing)
  }
}

void Engine::loop() {
  const RequestSource source = [this](std::chrono::milliseconds w) { return poll(w); };
  const TokenSink sink = [this](const ChosenToken& c) {
    auto it = live_.find(c.id);
    if (it == live_.end()) return;
    const bool last = c.index + 1 == c.count;
    it->second->give(c.token, last);
    if (last) {
      live_.erase(it);
      --running_;
    }
  };
  const CancelCheck cancelled = [this](int64_t id) {
    auto it = live_.find(id);
    const bool stop = it == live_.end() || it->second->cancelled() || overdue(*it->second) || [&] {
      std::lock_guard lock(mu_);
      return stopping_;
    }();
    if (stop && it != live_.end()) {
      it->second->end();
      live_.erase(it);
      --running_;
    }
    return stop;
  };
  try {
    serve_(source, sink, cancelled);
  } catch (const std::exception& e) {
    std::lock_guard lock(mu_);
    failure_ = e.what();
  }
  // Whatever is left (a failed pipeline's sequences, requests still queued) ends now.
  std::deque<std::shared_ptr<Ticket>> left;
  {
    std::lock_guard lock(mu_);
    left.swap(queue_);
    queued_ = 0;
  }
  const std::string why = failure_ ? "the pipeline failed: " + *failure_ : "the server stopped";
  for (auto& t : left) t->end(why);
  for (auto& [id, t] : live_) t->end(why);
  live_.clear();
  running_ = 0;
}

}  // namespace tandem::serve
