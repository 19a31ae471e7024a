#include "runtime/job/generation_ledger.h"

#include "core/random.h"

namespace tandem::runtime {

std::optional<Message> GenerationLedger::pop(std::chrono::milliseconds wait) {
  {
    std::lock_guard lock(mu_);
    if (!resumed_.empty()) {
      Message m = std::move(resumed_.front());
      resumed_.pop_front();
      return m;
    }
    if (done_) return Message{PromptsDone{}};
  }
  std::optional<Message> m = from_.pop(wait);
  if (!m) return m;
  std::lock_guard lock(mu_);
  note(*m);
  return m;
}

void GenerationLedger::note(const Message& m) {
  if (const auto* p = std::get_if<Prompt>(&m)) {
    // (A prompt of an id in flight is the coordinator's to refuse; the first is kept. One
    // of no tokens has nothing to resume.)
    if (p->count > 0) sequences_.emplace(p->id, Sequence{*p, {}, 0, false});
  } else if (const auto* c = std::get_if<CancelPrompt>(&m)) {
    const auto it = sequences_.find(c->id);
    if (it != sequences_.end()) it->second.cancelled = true;
  } else if (std::holds_alternative<PromptsDone>(m)) {
    done_ = true;
  }
}

Token GenerationLedger::answered(Token t) {
  std::lock_guard lock(mu_);
  const auto it = sequences_.find(t.id);
  if (it == sequences_.end()) return t;
  Sequence& s = it->second;
  t.index += s.offset;
  s.answered.push_back(t.token);
  if (static_cast<int64_t>(s.answered.size()) == s.prompt.count) sequences_.erase(it);
  return t;
}

int64_t GenerationLedger::resume() {
  std::lock_guard lock(mu_);
  resumed_.clear();
  // What the caller sent that no run read yet goes after the resumed sequences: its
  // cancels (a client gone, an end-of-text token) keep theirs from resuming.
  std::vector<int64_t> was;
  for (const auto& [id, s] : sequences_) was.push_back(id);
  std::deque<Message> unread;
  while (!done_) {
    std::optional<Message> m = from_.pop(std::chrono::milliseconds(0));
    if (!m) break;
    note(*m);
    if (!std::holds_alternative<PromptsDone>(*m)) unread.push_back(std::move(*m));
  }
  for (const int64_t id : was) {
    const auto it = sequences_.find(id);
    Sequence& s = it->second;
    if (s.cancelled) {
      sequences_.erase(it);
      continue;
    }
    const auto n = static_cast<int64_t>(s.answered.size());
    Prompt p = s.prompt;
    p.tokens.insert(p.tokens.end(), s.answered.begin(), s.answered.end());
    p.count = s.prompt.count - n;
    if (p.temperature > 0) p.seed = Rng::seedAfter(s.prompt.seed, static_cast<uint64_t>(n));
    s.offset = n;
    resumed_.push_back(Message{std::move(p)});
  }
  const auto resumed = static_cast<int64_t>(resumed_.size());
  for (Message& m : unread) resumed_.push_back(std::move(m));
  return resumed;
}

int64_t GenerationLedger::inFlight() const {
  std::lock_guard lock(mu_);
  int64_t n = 0;
  for (const auto& [id, s] : sequences_) n += s.cancelled ? 0 : 1;
  return n;
}

}  // namespace tandem::runtime
