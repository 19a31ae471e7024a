// The messages of inference streams and generation between a coordinator and its stage
// workers (answers, prompts, tokens, cancels, stage loads): encoders, and a decoder that
// checks every field before it is used.
#include <cmath>
#include <limits>

#include "runtime/control/message_codec.h"

namespace tandem::runtime::detail {

using B = flatbuffers::FlatBufferBuilder;

Message readServingMessage(const fb::Message* msg) {
  switch (msg->body_type()) {
    case fb::Body_Answer: {
      const fb::Answer* a = msg->body_as_Answer();
      const char* m = "answer";
      Answer out;
      out.first = a->first();
      range(m, "first", out.first, 0, int64_t{1} << 40);
      out.count = a->count();
      range(m, "count", out.count, 1, static_cast<int64_t>(kMaxAnswerValues));
      out.columns = a->columns();
      range(m, "columns", out.columns, 1, static_cast<int64_t>(kMaxAnswerValues));
      const auto* v = a->outputs();
      const size_t values = v ? v->size() : 0;
      if (static_cast<int64_t>(values) != out.count * out.columns)
        bad(m, std::to_string(values) + " outputs for " + std::to_string(out.count) + " rows of " +
                   std::to_string(out.columns));
      if (v) out.outputs.assign(v->begin(), v->end());
      out.loss_sum = a->loss_sum();  // (a diverged model's loss is NaN: passed on)
      out.correct = a->correct();
      range(m, "correct", out.correct, 0, out.count);
      return out;
    }
    case fb::Body_Prompt: {
      const fb::Prompt* p = msg->body_as_Prompt();
      const char* m = "prompt";
      Prompt out;
      out.id = p->id();
      range(m, "id", out.id, 0, kMaxRequestId);
      const auto* v = p->tokens();
      if (!v || v->size() == 0) bad(m, "no tokens");
      if (v->size() > kMaxPromptTokens)
        bad(m, std::to_string(v->size()) + " tokens exceed the limit of " +
                   std::to_string(kMaxPromptTokens));
      out.tokens.assign(v->begin(), v->end());
      for (int32_t t : out.tokens)
        if (t < 0) bad(m, "token " + std::to_string(t) + " is negative");
      out.count = p->count();
      range(m, "count", out.count, 1, int64_t{1} << 30);
      out.temperature = p->temperature();
      finiteNonNegative(m, "temperature", out.temperature);
      out.top_k = p->top_k();
      nonNegative(m, "top_k", out.top_k);
      out.seed = p->seed();
      out.top_p = p->top_p();
      if (!(out.top_p > 0 && out.top_p <= 1))
        bad(m, "top_p " + std::to_string(out.top_p) + " is not in (0, 1]");
      return out;
    }
    case fb::Body_PromptsDone:
      return PromptsDone{};
    case fb::Body_CancelPrompt:
      return CancelPrompt{msg->body_as_CancelPrompt()->id()};
    case fb::Body_Token: {
      const fb::Token* t = msg->body_as_Token();
      const char* m = "token";
      Token out{t->id(), t->index(), t->token(), t->logit()};
      range(m, "id", out.id, 0, kMaxRequestId);
      range(m, "index", out.index, 0, int64_t{1} << 30);
      range(m, "token", out.token, 0, std::numeric_limits<int32_t>::max());
      return out;  // (a diverged model's logit is NaN: passed on)
    }
    case fb::Body_StageBusy: {
      const fb::StageBusy* t = msg->body_as_StageBusy();
      const char* m = "stage busy";
      StageBusy out{t->steps(), t->rows(), t->busy_s(), t->elapsed_s()};
      range(m, "steps", out.steps, 0, int64_t{1} << 50);
      range(m, "rows", out.rows, out.steps, int64_t{1} << 50);
      finiteNonNegative(m, "busy_s", out.busy_s);
      finiteNonNegative(m, "elapsed_s", out.elapsed_s);
      return out;
    }
    default:
      throw FormatError("bad control message: not a serving message");
  }
}

flatbuffers::Offset<void> build(B& b, const Answer& m) {
  checkCount("answer", "outputs", m.outputs.size(), kMaxAnswerValues);
  return fb::CreateAnswer(b, m.first, m.count, m.columns, b.CreateVector(m.outputs), m.loss_sum,
                          m.correct)
      .Union();
}

flatbuffers::Offset<void> build(B& b, const Prompt& m) {
  checkCount("prompt", "tokens", m.tokens.size(), kMaxPromptTokens);
  return fb::CreatePrompt(b, m.id, b.CreateVector(m.tokens), m.count, m.temperature, m.top_k,
                          m.seed, m.top_p)
      .Union();
}

flatbuffers::Offset<void> build(B& b, const PromptsDone&) {
  return fb::CreatePromptsDone(b).Union();
}

flatbuffers::Offset<void> build(B& b, const CancelPrompt& m) {
  return fb::CreateCancelPrompt(b, m.id).Union();
}

flatbuffers::Offset<void> build(B& b, const Token& m) {
  return fb::CreateToken(b, m.id, m.index, m.token, m.logit).Union();
}

flatbuffers::Offset<void> build(B& b, const StageBusy& m) {
  return fb::CreateStageBusy(b, m.steps, m.rows, m.busy_s, m.elapsed_s).Union();
}

}  // namespace tandem::runtime::detail
