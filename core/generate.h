// Text generation with a language model (input [T] token ids, output [T, vocab] logits):
// the prompt is decoded at once (prefill), then one token at a time, each step choosing
// the next token from the last position's logits. With the key/value cache
// (Layer::decode) a step computes the new token only; without it, each step runs the
// whole prefix again (the reference the cache must equal, and the cache's gain).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/random.h"

namespace tandem {

struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy (the first largest logit)
  int64_t top_k = 0;         // > 0: draw among the k largest logits only
  uint64_t seed = 1;
  // < 1: draw among the most likely tokens (after top_k) whose probabilities first reach
  // top_p together (nucleus sampling); 1: all of them
  float top_p = 1.0f;
};

// The next token from one position's logits; InvalidArgument for a negative temperature
// or top_k, or a top_p outside (0, 1]. Draws from `rng` only when temperature > 0, and
// then one number (Rng::next) exactly: after n sampled tokens a sequence's generator is
// Rng(Rng::seedAfter(seed, n)), which is how a sequence resumes elsewhere.
int32_t chooseToken(const std::vector<float>& logits, const SamplingOptions& o, Rng& rng);

// What generation needs of a model: [T] token ids in, [T, vocab] logits out, and an
// embedding that takes every id its head can choose (a chosen token is fed back).
struct TextShape {
  int64_t context = 0, vocab = 0;
  std::string model;  // its name, for messages
};
// InvalidArgument naming the model and its shapes when it is no such model.
TextShape textShape(const Model& model);
// InvalidArgument, after `who` (e.g. "request 3: "), when `prompt` and `count` new tokens
// do not fit a model of `shape`: an empty prompt, an id outside the vocab, a count below
// 0 or past the context.
void checkRequest(const TextShape& shape, const std::vector<int32_t>& prompt, int64_t count,
                  const std::string& who = "");

struct Generation {
  std::vector<int32_t> tokens;             // the new tokens, in order
  std::vector<std::vector<float>> logits;  // the logits each new token was chosen from
  double first_token_s = 0;                // prompt in, first new token chosen
  std::vector<double> intervals_s;         // between consecutive new tokens
};

// Generates `count` tokens after `prompt` (ids in [0, vocab)). The prompt and the new
// tokens must fit the model's context: InvalidArgument naming both lengths otherwise.
// `on_token` (may be empty) hears each token as it is chosen. `agree` (may be empty) turns
// each choice into the token fed back and reported: a tensor rank's, rank 0's choice
// broadcast, so ranks whose logits differ by their devices' rounding still decode one text.
// A token among `end_tokens` (the model's end of text: hf::TextCodec::endTokens) is the
// last: generation stops after it, with fewer than `count` tokens.
Generation generate(Model& model, const std::vector<int32_t>& prompt, int64_t count,
                    const SamplingOptions& o, bool cache = true,
                    const std::function<void(int32_t)>& on_token = {},
                    const std::function<int32_t(int32_t)>& agree = {},
                    const std::vector<int32_t>& end_tokens = {});

}  // namespace tandem
