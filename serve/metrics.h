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

}  // namespace tandem::serve
