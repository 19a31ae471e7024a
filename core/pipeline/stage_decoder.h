// Pipelined generation: a language model's layers split into stages, each stage decoding
// its own layers with a key/value cache per sequence (Layer::decode), several sequences
// in flight so that every stage has work while the others run.
//
// Stage 0 admits requests from its source as they come (up to max_in_flight sequences
// at once) and decides the order of the work. Every step message n (0, 1, 2, ...)
// advances one or more sequences: a new sequence's prompt alone, or one token of each of
// a batch of sequences, the tokens the last stage chose for them at their steps before.
// Its header says, per sequence, which one, which round and (at its first) the sampling
// options; then come the activations, all as int32 (so the message goes raw: the link's
// codec does not apply to generation). Every stage runs a batch as one pass over its
// layers (Model::decodeEach: one read of the weights for all its rows), the steps in the
// order they arrive. The last stage chooses each token (core/generate.h's chooseToken, a
// seeded Rng per sequence), hands it to its sink and, for the sequences that go on, sends
// the batch's tokens back to stage 0 as one (token, n) message over the feedback link.
// Stage 0 keeps about one batch per stage travelling, of equal size, so that every stage
// has one to run while the others run theirs: a batch that comes back smaller than that
// (a new sequence, or one thinned by sequences that ended) waits for the next and joins
// it. Each sequence is computed exactly as generating it alone in one process: the tokens
// and logits are bitwise those of generate() on the CPU backend, where a B-row GEMM rounds
// each row as a 1-row one (tests/pipeline/generation_test.cpp).
//
// One stage alone (no links) decodes the sequences in flight as one batch the same way:
// each pass over the layers advances every sequence by a token; a new request is
// prefilled alone and joins the next step.
//
// A sequence may be cancelled (CancelCheck): stage 0 asks as each of its tokens comes
// back, when none of its steps is in flight, and sends a cancel header down the stages,
// each of which drops its cache.
//
// While stage 0 has nothing in flight and waits for requests, it sends a keep-alive
// header every `keepalive`, so that the other stages' link time limits mark a peer that
// is gone, not an idle one.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "core/comm/link.h"
#include "core/generate.h"
#include "core/pipeline/executor.h"

namespace tandem {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t count = 0;  // new tokens, >= 1
  SamplingOptions sampling;
  int64_t id = 0;  // names its tokens; in [0, 2^31), unique among the sequences in flight
};

// What stage 0's source answers: a request, none yet, or that none will come any more.
struct RequestPoll {
  std::optional<GenerationRequest> request;
  bool ended = false;
};
// Waits up to the given time for the next request.
using RequestSource = std::function<RequestPoll(std::chrono::milliseconds)>;

// A token the last stage chose: the `index`th new token of request `id`, and the logits
// it was chosen from.
struct ChosenToken {
  int64_t id = 0, index = 0, count = 0;  // count: the request's new tokens
  int32_t token = 0;
  const std::vector<float>& logits;
};
using TokenSink = std::function<void(const ChosenToken&)>;
// Whether the sequence of request `id` is to end now (its client left, a stop string
// came): asked at stage 0 as each of its tokens comes back; a yes frees its caches on
// every stage, and no more of its tokens come.
using CancelCheck = std::function<bool(int64_t id)>;

// What a stage has run so far.
struct DecoderStats {
  int64_t steps = 0;     // passes over its layers (each one sequence's step, or a batch's)
  int64_t rows = 0;      // sequence steps in them
  double busy_s = 0;     // time spent running its layers and choosing tokens, not waiting
  double elapsed_s = 0;  // since serve() began (as of the last report, or serve's end)
};

struct DecoderOptions {
  int max_in_flight = 8;  // sequences stage 0 keeps going at once
  std::chrono::milliseconds keepalive{5000};
  // Called with the stats about every `report_every` while serving (between steps, and
  // as keep-alives pass while idle), as the stage runs out of work after some, and once
  // as serve() ends; may be empty.
  std::function<void(const DecoderStats&)> report;
  std::chrono::milliseconds report_every{1000};
};

class StageDecoder {
 public:
  // `prev`/`next`: the neighbouring stages' links (null at the ends); `feedback`: at the
  // last stage the link to stage 0, at stage 0 the link from the last stage (null
  // elsewhere, and with one stage).
  StageDecoder(Model& model, StageRange range, Link* prev, Link* next, Link* feedback,
               DecoderOptions options = {});

  // Serves requests until stage 0's source has ended and every sequence is done. Only
  // stage 0 calls `source`, only the last stage `sink` (each may be empty elsewhere). A
  // request that does not fit the model (an empty prompt, ids outside the vocab, more
  // tokens than the context, an id in use) raises InvalidArgument at stage 0; a header
  // that does not follow the protocol raises FormatError naming the peer. Only stage 0
  // asks `cancelled` (may be empty).
  void serve(const RequestSource& source, const TokenSink& sink, const CancelCheck& cancelled = {});

  // All of `requests` at once (ids are replaced by their indices). The last stage
  // returns one Generation per request (tokens, logits, first-token time and intervals
  // measured from this call's start at the last stage); the other stages return an
  // empty list. Every stage must be given the same requests (only stage 0 reads them).
  std::vector<Generation> run(const std::vector<GenerationRequest>& requests);

  // Read on the thread that serves (or after serve returns).
  const DecoderStats& stats() const { return stats_; }

 private:
  struct Sequence;
  void serveFirst(const RequestSource& source, const TokenSink& sink, const CancelCheck& cancelled);
  void serveRest(const TokenSink& sink);
  // One stage alone: every sequence in flight advances one token per pass over the
  // layers, decoded as one batch (Model::decodeEach); a new request is prefilled alone.
  void serveAlone(const RequestSource& source, const TokenSink& sink, const CancelCheck& cancelled);
  // InvalidArgument, naming the request, for one that does not fit the model or whose id
  // is `in_flight` already.
  void checkAdmission(const GenerationRequest& r, bool in_flight) const;
  // options_.report with the stats, if one is due: report_every since the last, or
  // `idle` (nothing in flight here) with steps run since the last.
  void maybeReport(bool idle = false);
  // Runs one step of `seqs` on input `x` (one sequence's [1, tokens, ...], or one token
  // of each, [B, 1, ...], decoded as one batch) and passes it on as one message, or at
  // the last stage chooses their tokens; `heads` are their headers.
  void step(const std::vector<Sequence*>& seqs, const Tensor& x, int64_t n,
            std::vector<std::vector<int32_t>> heads, const TokenSink& sink);

  Model& model_;
  StageRange range_;
  Link *prev_, *next_, *feedback_;
  DecoderOptions options_;
  TextShape shape_;
  DecoderStats stats_;
  std::chrono::steady_clock::time_point began_, reported_;
  int64_t reported_steps_ = 0;
};

}  // namespace tandem
