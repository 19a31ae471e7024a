#include "serve/metrics.h"

#include <algorithm>
#include <cstdio>

namespace tandem::serve {

namespace {

std::string number(double x) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", x);
  return b;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double x) {
  const auto at = std::lower_bound(bounds_.begin(), bounds_.end(), x) - bounds_.begin();
  ++counts_[static_cast<size_t>(at)];
  sum_ += x;
  ++count_;
}

std::string Histogram::text(const std::string& name) const {
  std::string out;
  uint64_t below = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    below += counts_[i];
    out += name + "_bucket{le=\"" + (i < bounds_.size() ? number(bounds_[i]) : "+Inf") + "\"} " +
           std::to_string(below) + "\n";
  }
  out += name + "_sum " + number(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
  return out;
}

Metrics::Metrics()
    : first_token_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      inter_token_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}) {}

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::tokens(int64_t prompt, int64_t generated) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

void Metrics::firstToken(double seconds) {
  std::lock_guard lock(mu_);
  first_token_.observe(seconds);
}

void Metrics::interToken(double seconds) {
  std::lock_guard lock(mu_);
  inter_token_.observe(seconds);
}

std::string Metrics::text(int queued, int running) const {
  std::lock_guard lock(mu_);
  std::string out =
      "# HELP tandem_requests_total HTTP requests answered, by endpoint and status.\n"
      "# TYPE tandem_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    out += "tandem_requests_total{endpoint=\"" + key.first + "\",code=\"" +
           std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
  out +=
      "# HELP tandem_prompt_tokens_total Prompt tokens of the completions served.\n"
      "# TYPE tandem_prompt_tokens_total counter\n"
      "tandem_prompt_tokens_total " +
      std::to_string(prompt_tokens_) +
      "\n"
      "# HELP tandem_generated_tokens_total Tokens generated for clients.\n"
      "# TYPE tandem_generated_tokens_total counter\n"
      "tandem_generated_tokens_total " +
      std::to_string(generated_tokens_) +
      "\n"
      "# HELP tandem_time_to_first_token_seconds From a request's submission to its first token.\n"
      "# TYPE tandem_time_to_first_token_seconds histogram\n" +
      first_token_.text("tandem_time_to_first_token_seconds") +
      "# HELP tandem_inter_token_seconds Between consecutive tokens of a sequence.\n"
      "# TYPE tandem_inter_token_seconds histogram\n" +
      inter_token_.text("tandem_inter_token_seconds") +
      "# HELP tandem_queue_depth Requests waiting for a place in the pipeline.\n"
      "# TYPE tandem_queue_depth gauge\n"
      "tandem_queue_depth " +
      std::to_string(queued) +
      "\n"
      "# HELP tandem_sequences_in_flight Sequences decoding in the pipeline.\n"
      "# TYPE tandem_sequences_in_flight gauge\n"
      "tandem_sequences_in_flight " +
      std::to_string(running) + "\n";
  return out;
}

void StageLoads::report(int stage, double busy_s, double elapsed_s) {
  std::lock_guard lock(mu_);
  auto [it, fresh] = stages_.try_emplace(stage);
  Load& l = it->second;
  double busy = busy_s, span = elapsed_s;
  if (!fresh && elapsed_s > l.elapsed_s) {
    busy -= l.busy_s;
    span -= l.elapsed_s;
  }
  if (span > 0) l.share = std::clamp(busy / span, 0.0, 1.0);
  l.busy_s = busy_s;
  l.elapsed_s = elapsed_s;
}

double StageLoads::share(int stage) const {
  std::lock_guard lock(mu_);
  const auto it = stages_.find(stage);
  return it == stages_.end() ? -1 : it->second.share;
}

std::string StageLoads::text() const {
  std::lock_guard lock(mu_);
  std::string out =
      "# HELP tandem_stage_busy_share Share of its last report's interval (about a second) each "
      "pipeline stage spent running its layers.\n"
      "# TYPE tandem_stage_busy_share gauge\n";
  for (const auto& [stage, l] : stages_)
    out += "tandem_stage_busy_share{stage=\"" + std::to_string(stage) + "\"} " + number(l.share) +
           "\n";
  out +=
      "# HELP tandem_stage_busy_seconds_total Seconds each pipeline stage spent running its layers "
      "since it began serving.\n"
      "# TYPE tandem_stage_busy_seconds_total counter\n";
  for (const auto& [stage, l] : stages_)
    out += "tandem_stage_busy_seconds_total{stage=\"" + std::to_string(stage) + "\"} " +
           number(l.busy_s) + "\n";
  return out;
}

}  // namespace tandem::serve
