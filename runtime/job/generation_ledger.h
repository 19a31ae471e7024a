// What a generation run was asked and has answered, kept across its restarts (JobRun):
// every prompt passed on to the stages, its sampling, the tokens it was answered so far,
// and whether its client cancelled it. When a stage is lost, each sequence still in flight
// resumes on the stages placed anew as a prompt of its own tokens and those answered
// (prefilled again, which rebuilds its caches), for the tokens it still lacks, its
// generator taken up where it was (Rng::seedAfter: chooseToken draws once per sampled
// token). The tokens of a resumed sequence are numbered on from those answered before the
// loss, so the caller sees one stream with a pause in it: a greedy sequence's text is the
// text of a run without the loss (its logits to the BLAS's rounding: a prefill sums in
// another order than one token at a time), a sampled one draws the numbers it would have.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "runtime/job/coordinator.h"

namespace tandem::runtime {

class GenerationLedger : public PromptSource {
 public:
  // The caller's prompts and cancels (`from`, read in order).
  explicit GenerationLedger(PromptSource& from) : from_(from) {}

  // For the run's coordinator: the resumed sequences first (after resume()), then what
  // `from` brings, each prompt and cancel noted on the way; PromptsDone once `from` said
  // it and nothing is left to resume.
  std::optional<Message> pop(std::chrono::milliseconds wait) override;

  // A token the stages answered, numbered for the caller (on from those its sequence was
  // answered before a loss), and noted. A token of a request the ledger never passed on
  // comes back as it is.
  Token answered(Token t);

  // After a loss: every sequence in flight (passed on, not cancelled, not answered in
  // full, counting what the caller sent since that no run read) comes again ahead of the
  // caller's next prompts, each with its prompt and the
  // tokens answered so far as its prompt, the tokens it still lacks as its count, and its
  // sampler's seed advanced past the draws made. Cancelled ones are forgotten. Returns how
  // many sequences resume. Call it while no coordinator reads pop().
  int64_t resume();

  // Sequences passed on and not yet answered in full nor cancelled.
  int64_t inFlight() const;

 private:
  struct Sequence {
    Prompt prompt;                  // as the caller gave it
    std::vector<int32_t> answered;  // the tokens answered so far, in order
    int64_t offset = 0;             // answered before the run now going (its index 0)
    bool cancelled = false;
  };
  // Notes a prompt, cancel or end read from `from_` (mu_ held).
  void note(const Message& m);

  PromptSource& from_;
  mutable std::mutex mu_;
  std::map<int64_t, Sequence> sequences_;  // by request id
  std::deque<Message> resumed_;            // for pop(), ahead of `from_`
  bool done_ = false;                      // `from_` said PromptsDone
};

}  // namespace tandem::runtime
