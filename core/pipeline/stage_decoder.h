// Pipelined generation: a language model's layers split into stages, each stage decoding
// its own layers with a key/value cache per sequence (Layer::decode), several sequences
// in flight so that every stage has work while the others run.
//
// Stage 0 feeds each sequence's prompt, then each token the last stage chose for it; the
// last stage chooses tokens (core/generate.h's chooseToken, a seeded Rng per sequence)
// and sends each back to stage 0 over a feedback link. Sequences take turns in a fixed
// order: step r of sequence q is message r * S + q (S sequences) on every link, so each
// stage runs the same order and the tokens and logits are bitwise those of generating
// each sequence alone in one process (tests/pipeline/generation_test.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "core/generate.h"
#include "core/pipeline/executor.h"
#include "core/pipeline/link.h"

namespace tandem {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t count = 0;  // new tokens
  SamplingOptions sampling;
};

class StageDecoder {
 public:
  // `prev`/`next`: the neighbouring stages' links (null at the ends); `feedback`: at the
  // last stage the link to stage 0, at stage 0 the link from the last stage (null
  // elsewhere). A pipeline needs at least 2 stages; one process uses generate().
  StageDecoder(Model& model, StageRange range, Link* prev, Link* next, Link* feedback);

  // Runs every request to the end. The last stage returns one Generation per request
  // (tokens, logits, first-token time and intervals measured from this call's start at
  // the last stage); the other stages return an empty list. Every stage must be given
  // the same requests (only stage 0 reads the prompts, only the last the sampling).
  std::vector<Generation> run(const std::vector<GenerationRequest>& requests);

 private:
  Model& model_;
  StageRange range_;
  Link *prev_, *next_, *feedback_;
};

}  // namespace tandem
