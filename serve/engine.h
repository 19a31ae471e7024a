// The engine behind `tandem serve`: one pipeline (a model in this process, or a job's
// stages) serving every client's sequences, up to `in_flight` at once decoding and
// `max_queue` more waiting; a request beyond those is refused (the server answers 429).
// Each request is a Ticket its HTTP session reads tokens from as they come and may
// cancel (its client left, a stop string came): a cancelled sequence leaves the pipeline
// at its next token and frees its caches (core/pipeline/stage_decoder.h). So does one
// past the engine's deadline.
//
// The engine's own thread runs the pipeline; tokens reach a ticket under its lock and its
// `wake` is called (from that thread) so the session can take them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/pipeline/stage_decoder.h"

namespace tandem::serve {

class Engine;

// One request's sequence, shared by its session and the engine.
class Ticket {
 public:
  using Clock = std::chrono::steady_clock;
  // What the session takes at once: the tokens not taken before, whether the sequence
  // has ended (every token given, cancelled, or failed: `error` then says why).
  struct Taken {
    std::vector<int32_t> tokens;
    std::vector<double> at_s;  // when each of them was chosen, after submission
    bool ended = false;
    std::string error;
  };
  Taken take();
  // Asks the engine to end the sequence (at its next token, or before it starts).
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  // When it was submitted, began decoding (left the queue), and its first token came.
  Clock::time_point submitted() const { return submitted_; }

 private:
  friend class Engine;
  Ticket(GenerationRequest r, std::function<void()> wake)
      : request_(std::move(r)), wake_(std::move(wake)), submitted_(Clock::now()) {}
  void give(int32_t token, bool last);
  void end(const std::string& error = {});

  GenerationRequest request_;
  std::function<void()> wake_;
  Clock::time_point submitted_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::vector<int32_t> tokens_;
  std::vector<double> at_s_;
  bool ended_ = false;
  std::string error_;
};

// Runs the pipeline: serves what `source` gives, tokens to `sink`, asking `cancelled`
// (StageDecoder::serve's contract) until the source ends.
using PipelineServe =
    std::function<void(const RequestSource&, const TokenSink&, const CancelCheck&)>;

struct EngineOptions {
  int in_flight = 8;   // sequences decoding at once (the pipeline's limit, told here)
  int max_queue = 32;  // requests waiting beyond those
  // How long a request may take from its submission to its last token; past it the
  // sequence ends where it is (waiting, or at its next token), its ticket ended without
  // an error, as a length-capped answer (0: no deadline).
  std::chrono::milliseconds deadline{0};
};

class Engine {
 public:
  // Starts the engine's thread on `serve`.
  Engine(PipelineServe serve, EngineOptions options);
  // Ends every sequence (cancelled) and stops the thread.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request (its id is the engine's); null when in_flight + max_queue
  // requests are taken already. `wake` hears each change of the ticket.
  std::shared_ptr<Ticket> submit(std::vector<int32_t> prompt, int64_t count,
                                 const SamplingOptions& sampling, std::function<void()> wake);

  int queued() const { return queued_; }
  int running() const { return running_; }
  // Why the pipeline stopped, if it did (the server then answers 503).
  std::optional<std::string> failure() const;

 private:
  RequestPoll poll(std::chrono::milliseconds wait);
  // Whether `t` is past the deadline (EngineOptions::deadline).
  bool overdue(const Ticket& t) const;
  void loop();

  PipelineServe serve_;
  EngineOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Ticket>> queue_;
  bool stopping_ = false;
  std::optional<std::string> failure_;
  int64_t next_id_ = 0;
  std::atomic<int> queued_{0}, running_{0};
  // The engine thread's own: the sequences in the pipeline, by id.
  std::map<int64_t, std::shared_ptr<Ticket>> live_;
  std::thread thread_;
};

}  // namespace tandem::serve
