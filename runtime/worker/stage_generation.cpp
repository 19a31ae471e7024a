#include "runtime/worker/stage_generation.h"

#include <chrono>
#include <deque>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/pipeline/stage_decoder.h"

namespace tandem::runtime {

namespace {

// Cancels kept for sequences not yet asked about (those that had ended never are).
constexpr size_t kMaxCancels = 4096;

}  // namespace

namespace {

// A stage's decoder options from its assignment: its stats go to the coordinator about
// once a second (StageBusy).
DecoderOptions decoderOptions(Channel& coordinator, const Assign& a) {
  DecoderOptions o;
  o.max_in_flight = a.in_flight;
  o.keepalive = std::chrono::milliseconds(a.wire.timeout_s * 1000 / 4);
  o.report = [&coordinator,
              timeout = std::chrono::seconds(a.wire.timeout_s)](const DecoderStats& s) {
    coordinator.send(StageBusy{s.steps, s.rows, s.busy_s, s.elapsed_s}, timeout);
  };
  return o;
}

// The token a last stage chose, to the coordinator.
TokenSink tokensTo(Channel& coordinator, const Assign& a) {
  return [&coordinator, timeout = std::chrono::seconds(a.wire.timeout_s)](const ChosenToken& c) {
    coordinator.send(Token{c.id, c.index, c.token, c.logits.at(static_cast<size_t>(c.token))},
                     timeout);
  };
}

}  // namespace

void generateTensorStage(Channel& coordinator, const Assign& a,
                         const std::vector<TensorRank>& ranks, Link* prev, Link* next) {
  Link* feedback = a.stage == a.stages - 1 ? std::exchange(next, nullptr) : nullptr;
  const TokenSink tokens = tokensTo(coordinator, a);
  // Only rank 0's tokens go out (the others' are the same choice, or on unlike devices at a
  // near tie their own: the first stage feeds back rank 0's).
  onTensorDecoders(ranks, StageRange{a.stage, a.stages, a.slice.layers.begin, a.slice.layers.end},
                   prev, next, feedback, decoderOptions(coordinator, a),
                   std::chrono::milliseconds(int64_t{a.wire.timeout_s} * 1000),
                   [&](int r, StageDecoder& decoder) {
                     decoder.serve({}, r == 0 ? tokens : TokenSink([](const ChosenToken&) {}));
                   });
}

void generateStage(Channel& coordinator, const Assign& a, Model& model, Link* prev, Link* next) {
  Link* feedback = nullptr;
  if (a.stages > 1 && a.stage == 0) feedback = std::exchange(prev, nullptr);
  if (a.stages > 1 && a.stage == a.stages - 1) feedback = std::exchange(next, nullptr);
  const DecoderOptions o = decoderOptions(coordinator, a);
  StageDecoder decoder(model,
                       StageRange{a.stage, a.stages, a.slice.layers.begin, a.slice.layers.end},
                       prev, next, feedback, o);
  // The coordinator's messages: prompts and their end for the source, cancels for the
  // check. Stage 0 asks its source only while it has room for another sequence, so the
  // check (asked as each token comes back) reads whatever has come and keeps what is not
  // a cancel for the source.
  std::deque<Message> unread;
  std::set<int64_t> cancels;
  auto note = [&](Message m) {
    if (const auto* c = std::get_if<CancelPrompt>(&m)) {
      cancels.insert(c->id);
      // Cancels of sequences that had ended are never asked about: keep the newest.
      if (cancels.size() > kMaxCancels) cancels.erase(cancels.begin());
    } else {
      unread.push_back(std::move(m));
    }
  };
  const CancelCheck cancelled = [&](int64_t id) {
    while (coordinator.queuedBytes() > 0) {
      std::optional<Message> m = coordinator.recv(std::chrono::milliseconds(0));
      if (!m) break;
      note(std::move(*m));
    }
    return cancels.erase(id) > 0;
  };
  const RequestSource prompts = [&](std::chrono::milliseconds wait) {
    RequestPoll poll;
    std::optional<Message> m;
    while (!m) {
      if (!unread.empty()) {
        m = std::move(unread.front());
        unread.pop_front();
      } else if (std::optional<Message> in = coordinator.recv(wait)) {
        note(std::move(*in));
        wait = std::chrono::milliseconds(0);  // a cancel read: look again, without waiting
        continue;
      } else {
        return poll;
      }
    }
    if (const auto* p = std::get_if<Prompt>(&*m)) {
      poll.request = GenerationRequest{
          p->tokens, p->count, {p->temperature, p->top_k, p->seed, p->top_p}, p->id};
    } else if (std::holds_alternative<PromptsDone>(*m)) {
      poll.ended = true;
    } else if (const auto* l = std::get_if<Leave>(&*m)) {
      throw Error("the coordinator stopped the stage: " + l->reason);
    } else {
      throw FormatError("the coordinator sent '" + std::string(messageName(*m)) +
                        "' where a prompt was due");
    }
    return poll;
  };
  decoder.serve(prompts, tokensTo(coordinator, a), cancelled);
}

}  // namespace tandem::runtime
