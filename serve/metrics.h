// What `GET /metrics` reports, in Prometheus' text format (version 0.0.4): requests by
// endpoint and status, prompt and generated tokens, time to first token and inter-token
// latency as histograms, and the engine's queue and sequences in flight (read when
// scraped). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tandem::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double x);
  // Its lines: NAME_bucket{le="..."} (cumulative), NAME_sum, NAME_count.
  std::string text(const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, the last +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void request(const std::string& endpoint, int status);
  void tokens(int64_t prompt, int64_t generated);
  void firstToken(double seconds);
  void interToken(double seconds);
  std::string text(int queued, int running) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  Histogram first_token_, inter_token_;
};

// What each stage of the pipeline reports of its work (core/pipeline/stage_decoder.h's
// DecoderStats, a job's stages through the coordinator's StageBusy): the share of the last
// report's interval (about a second) it spent running its layers, and its busy seconds.
// Thread-safe.
class StageLoads {
 public:
  // Stage `stage` was busy `busy_s` of the `elapsed_s` since it began serving. A report
  // not after the stage's last (the stage begun anew) starts it over.
  void report(int stage, double busy_s, double elapsed_s);
  // Its lines: tandem_stage_busy_share{stage="S"} and tandem_stage_busy_seconds_total.
  std::string text() const;
  // Stage `stage`'s last share (-1 if it has not reported).
  double share(int stage) const;

 private:
  struct Load {
    double busy_s = 0, elapsed_s = 0, share = 0;
  };
  mutable std::mutex mu_;
  std::map<int, Load> stages_;
};

}  // namespace tandem::serve
