// What `tandem run` and `tandem infer` print of a run (run_report.h).
#include "targets/tandem/run_report.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"
#include "core/model_spec.h"

namespace tandem::cli {

using runtime::JobSpec;
using runtime::StagePlacement;

namespace {

// A plan's stages as "[0, 7) n0/cpu, [7, 10) n1/cpu".
std::string stageRanges(const partitioner::Plan& plan, const std::vector<std::string>& devices) {
  std::string out;
  for (const partitioner::PlanStage& st : plan.stages) {
    out += (out.empty() ? "[" : ", [") + std::to_string(st.at.begin) + ", " +
           std::to_string(st.at.end) + ")";
    for (size_t i = 0; i < st.at.devices.size(); ++i)
      out += (i ? "+" : " ") + devices.at(static_cast<size_t>(st.at.devices[i]));
    if (st.at.tensor) out += " (tensor-split)";
  }
  return out;
}

// "fp16" when both directions carry it, else "int8/fp16" (activations/gradients).
std::string pair(WireCodec activations, WireCodec gradients) {
  const std::string act(wireCodecName(activations)), grad(wireCodecName(gradients));
  return act == grad ? act : act + "/" + grad;
}

// What a `partition: auto` run prints beside its plan: the search's plan (when a baseline
// runs) and every baseline that does not.
std::vector<const partitioner::Plan*> planAlternatives(const runtime::PlannedJob& planned) {
  std::vector<const partitioner::Plan*> out;
  if (planned.plan.algorithm != planned.searched.algorithm) out.push_back(&planned.searched);
  if (!planned.layer_only.stages.empty()) out.push_back(&planned.layer_only);
  for (const partitioner::Plan& b : planned.baselines)
    if (b.algorithm != planned.plan.algorithm) out.push_back(&b);
  return out;
}

}  // namespace

void writeTimeline(const std::string& dir, const std::vector<StageSpans>& all) {
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream out(dir + "/" + name, std::ios::trunc);
    out << text;
    TANDEM_CHECK_MSG(out.good(), IoError,
                     "cannot write the timeline to '" << dir << "/" << name << "'");
  };
  write("trace.json", chromeTrace(all));
  std::vector<double> steps;  // the first stage's optimizer steps end each training step
  for (const Span& s : all.front().spans)
    if (s.type == ActionType::kStep) steps.push_back(s.end_s);
  double begin = std::numeric_limits<double>::max(), end = 0;
  for (const StageSpans& st : all)
    for (const Span& s : st.spans) {
      begin = std::min(begin, s.start_s);
      end = std::max(end, s.end_s);
    }
  if (steps.size() >= 5) {
    const size_t i = steps.size() / 2;
    begin = steps[i - 1];
    end = steps[std::min(i + 2, steps.size() - 1)];
  }
  write("timeline.svg", timelineSvg(all, begin, end));
  spdlog::info("timeline: {}/trace.json (Perfetto, chrome://tracing) and {}/timeline.svg", dir,
               dir);
}

void printInference(const std::vector<StageSpans>& all, const runtime::InferDone& result,
                    const runtime::StreamTotals& stream, int64_t batch, int64_t microbatches) {
  // Replicas of the first and last stage each hold their own requests' spans.
  std::map<int64_t, double> start;
  for (const StageSpans& st : all)
    for (const Span& s : st.spans)
      if (st.stage == all.front().stage && s.type == ActionType::kForward)
        start[s.microbatch] = s.start_s;
  std::vector<double> latency;
  double first = std::numeric_limits<double>::max(), last = 0;
  for (const StageSpans& st : all) {
    if (st.stage != all.back().stage) continue;
    for (const Span& s : st.spans) {
      if (s.type != ActionType::kForward) continue;
      auto it = start.find(s.microbatch);
      if (it == start.end()) continue;
      latency.push_back(s.end_s - it->second);
      first = std::min(first, it->second);
      last = std::max(last, s.end_s);
    }
  }
  if (latency.empty()) throw Error("inference: no request went through every stage");
  std::sort(latency.begin(), latency.end());
  auto pct = [&](double q) {
    const auto i = static_cast<size_t>(q * static_cast<double>(latency.size() - 1) + 0.5);
    return latency[std::min(i, latency.size() - 1)] * 1e3;
  };
  const double wall = std::max(last - first, 1e-9);
  std::printf(
      "inference: %lld samples as %lld requests (microbatches of ~%lld), each answered once",
      static_cast<long long>(stream.samples), static_cast<long long>(stream.requests),
      static_cast<long long>((batch + microbatches - 1) / microbatches));
  if (stream.repeated > 0)
    std::printf("; %lld answered again after a recovery were dropped",
                static_cast<long long>(stream.repeated));
  std::printf("\n%s", latency.size() < static_cast<size_t>(stream.requests)
                          ? "on the last placement: "
                          : "");
  std::printf("throughput: %.0f samples/s, %.1f requests/s\n",
              static_cast<double>(result.samples) / wall,
              static_cast<double>(latency.size()) / wall);
  std::printf("latency per request: p50 %.2f ms, p95 %.2f ms, p99 %.2f ms\n", pct(0.5), pct(0.95),
              pct(0.99));
  std::printf("test loss: %.4f, test accuracy: %.4f\n",
              stream.loss_sum / static_cast<double>(std::max<int64_t>(stream.samples, 1)),
              static_cast<double>(stream.correct) /
                  static_cast<double>(std::max<int64_t>(stream.samples, 1)));
}

std::string layersOf(const runtime::Assign& a) {
  if (a.slice.chunks.empty())
    return "[" + std::to_string(a.slice.layers.begin) + ", " + std::to_string(a.slice.layers.end) +
           ")";
  std::string out;
  for (const LayerRange& c : a.slice.chunks)
    out += (out.empty() ? "[" : "+[") + std::to_string(c.begin) + "," + std::to_string(c.end) + ")";
  return out;
}

std::string linkCodecs(const std::vector<runtime::Assign>& as) {
  std::map<int, const runtime::Assign*> first;  // each stage's first replica
  for (const runtime::Assign& a : as) first.emplace(a.stage, &a);
  std::vector<std::string> links;
  for (auto it = first.begin(); std::next(it) != first.end(); ++it) {
    links.push_back(pair(it->second->wire.activations, std::next(it)->second->wire.gradients));
  }
  if (links.empty())  // one stage: the job's, unused
    return pair(as.front().wire.activations, as.front().wire.gradients);
  // Interleaved stages are a ring: the last stage's chunks pass on to the first's.
  const bool ring = !as.front().slice.chunks.empty();
  if (ring)
    links.push_back(
        pair(first.rbegin()->second->wire.activations, first.begin()->second->wire.gradients));
  if (std::all_of(links.begin(), links.end(), [&](const std::string& l) { return l == links[0]; }))
    return links[0];
  std::string out;
  for (size_t s = 0; s < links.size(); ++s)
    out += (s ? ", " : "") + std::to_string(s) + "->" +
           std::to_string(s + 1 < first.size() ? s + 1 : 0) + " " + links[s];
  return out;
}

void printChosenPlan(const runtime::JobRun& jr) {
  const JobSpec& job = jr.job();
  const auto& planned = jr.planned();
  if (!planned) return;
  const partitioner::Plan& p = planned->plan;
  spdlog::info(
      "partition: auto: {} stages{} by the {} {} ({}), predicted {:.3f} ms per "
      "microbatch ({}), a step {:.3f} ms, {:.0f} samples/s",
      p.stages.size() / static_cast<size_t>(p.chunks),
      p.chunks > 1 ? fmt::format(" of {} chunks", p.chunks) : std::string(), p.algorithm,
      job.baseline.empty() ? "search" : "baseline", stageRanges(p, planned->devices),
      p.seconds * 1e3, p.bottleneck, p.step_s * 1e3, p.samples_per_s);
  for (const partitioner::LeftOut& l : planned->searched.left_out)
    spdlog::info("  {}: {}", planned->devices.at(static_cast<size_t>(l.device)), l.reason);
  if (!planned->candidates.empty()) {
    std::string priced;
    for (const runtime::PlanCandidate& c : planned->candidates) {
      priced += "; " + std::to_string(c.microbatches) + " " + std::string(scheduleName(c.schedule));
      if (c.chunks > 1) priced += " x" + std::to_string(c.chunks);
      if (c.infeasible.empty()) {
        char buf[64];
        std::snprintf(buf, sizeof buf, ": %.3f ms, %.0f samples/s", c.step_s * 1e3,
                      c.samples_per_s);
        priced += buf;
      } else {
        priced += c.refused ? ": not planned: " + c.infeasible : ": does not fit";
      }
    }
    spdlog::info("  chose {} microbatches, {}{} (predicted step per candidate{})",
                 planned->microbatches, scheduleName(planned->schedule),
                 planned->chunks > 1 ? fmt::format(" x{}", planned->chunks) : std::string(),
                 priced);
  }
  // The other splits on the same cost model, for comparison.
  for (const partitioner::Plan* other : planAlternatives(*planned)) {
    if (!other->infeasible.empty()) {
      spdlog::info("  beside it: {} does not fit ({})", other->algorithm, other->infeasible);
      continue;
    }
    spdlog::info(
        "  beside it: {} {}: predicted {:.3f} ms per microbatch ({}), a step {:.3f} ms, "
        "{:.0f} samples/s ({:.2f}x this plan's step)",
        other->algorithm, stageRanges(*other, planned->devices), other->seconds * 1e3,
        other->bottleneck, other->step_s * 1e3, other->samples_per_s, other->step_s / p.step_s);
  }
}

void printWeightsShipped(const runtime::RunResult& result, int n) {
  int64_t shipped = 0;
  double ship_s = 0;
  int cached = 0, corrupted = 0;
  for (const runtime::StageReport& r : result.reports) {
    shipped += r.weights_shipped;
    ship_s = std::max(ship_s, r.weights_ship_s);
    cached += r.weights_cached;
    corrupted += r.weights_corrupted;
  }
  std::printf("weights: %lld bytes shipped to %d of %d workers (%.3f s), found cached by %d\n",
              static_cast<long long>(shipped), n - cached, n, ship_s, cached);
  if (corrupted > 0)
    spdlog::warn("{} node cache copies of the weights failed verification and were fetched again",
                 corrupted);
}

namespace {

// Unequal replicas: the share of the run's samples each one took, beside its planned
// share (or the one its checkpoint carried), and whether the shares followed the replicas'
// measured speed.
void printShares(const runtime::JobRun& jr, const runtime::RunResult& result) {
  const std::vector<runtime::Assign>& as = jr.assignments();
  std::vector<size_t> rows;  // the first stage with unequal replicas
  int64_t total = 0;
  for (size_t i = 0; i < as.size(); ++i)
    if (!as[i].train.microbatch_shares.empty() && as[i].replicas > 1 &&
        (rows.empty() || as[i].stage == as[rows.front()].stage)) {
      rows.push_back(i);
      total += result.reports[i].counters.samples;
    }
  if (rows.empty() || total <= 0) return;
  const std::vector<double>& planned = as[rows.front()].train.microbatch_shares;
  double planned_total = 0;
  for (double s : planned) planned_total += s;
  std::printf("replicas' shares of the samples:");
  for (size_t i : rows)
    std::printf(" %d.%d %.1f%% (%s %.1f%%)", as[i].stage, as[i].replica,
                100.0 * static_cast<double>(result.reports[i].counters.samples) /
                    static_cast<double>(total),
                jr.sharesCarried() ? "carried" : "planned",
                100.0 * planned.at(static_cast<size_t>(as[i].replica)) / planned_total);
  const int64_t steps = as[rows.front()].train.rebalance_steps;
  if (jr.sharesCarried())
    std::printf("; the shares the checkpoint at step %lld carried throughout\n",
                static_cast<long long>(jr.startStep()));
  else if (steps > 0)
    std::printf("; the shares were set from the replicas' speed measured in steps 1 to %lld\n",
                static_cast<long long>(steps));
  else
    std::printf("; the planned shares throughout\n");
}

}  // namespace

void printStages(const runtime::JobRun& jr, const runtime::RunResult& result, int p) {
  const JobSpec& job = jr.job();
  const std::vector<StagePlacement>& stages = jr.stages();
  const std::vector<runtime::Assign>& as = jr.assignments();
  const int n = static_cast<int>(as.size());
  const bool infer = as.front().mode == runtime::RunMode::kInfer;
  // Compute per microbatch: the stage's forward and backward time (busy less the
  // optimizer) over the microbatches it ran, the thread CPU time of the same (what the
  // stage computed, without the time other processes took its core), beside the plan's
  // prediction if there is one.
  // A replicated stage has a row per replica ("1.0", "1.1"), with the share of its time
  // spent summing gradients with the other replicas (sync %); a tensor-split stage a row
  // per rank after its worker's (rank 0's): "1/t1", "1/t2".
  std::printf("\n%-6s %-10s %-8s %7s %9s %9s %6s %6s %11s %11s %10s %8s %8s %10s\n", "stage",
              "layers", "device", "busy %", "waiting %", "sending %", "sync %", "stash", "MB sent",
              "MB received", "ms/micro", "cpu ms", "all cpu", "predicted");
  double busy = 0, span = 0;
  for (int i = 0; i < n; ++i) {
    const runtime::Assign& a = as[static_cast<size_t>(i)];
    const runtime::StageReport& r = result.reports[static_cast<size_t>(i)];
    const StageCounters& c = r.counters;
    const std::string row = a.replicas > 1
                                ? std::to_string(a.stage) + "." + std::to_string(a.replica)
                                : std::to_string(a.stage);
    const double t = std::max(r.run_s, 1e-9);
    const std::string range = layersOf(a);
    const double predicted = stages[static_cast<size_t>(a.stage)].predicted_compute_s;
    const std::string predicted_text =
        predicted >= 0 ? std::to_string(predicted * 1e3).substr(0, 6) : "-";
    // A row: the worker's (a tensor-split stage's rank 0), then its other tensor ranks'
    // ("0/t1": their links' bytes are rank 0's, their CPU the worker's).
    auto print = [&](const std::string& label, const std::string& device, const StageCounters& rc,
                     bool worker) {
      const double micro = static_cast<double>(std::max<int64_t>(1, rc.microbatches));
      const std::string all_cpu =
          worker ? fmt::format("{:.3f}", r.process_cpu_s / micro * 1e3) : "-";
      std::printf(
          "%-6s %-10s %-8s %7.1f %9.1f %9.1f %6.1f %6lld %11.2f %11.2f %10.3f %8.3f %8s %10s\n",
          label.c_str(), range.c_str(), device.c_str(), 100 * rc.busy_s / t,
          100 * rc.recv_wait_s / t, 100 * rc.send_s / t, 100 * rc.allreduce_s / t,
          static_cast<long long>(rc.peak_stash),
          worker ? static_cast<double>(r.bytes_sent) / 1e6 : 0.0,
          worker ? static_cast<double>(r.bytes_received) / 1e6 : 0.0,
          (rc.busy_s - rc.step_s) / micro * 1e3, rc.compute_cpu_s / micro * 1e3, all_cpu.c_str(),
          predicted_text.c_str());
    };
    const std::string& device = result.ready[static_cast<size_t>(i)].device;
    print(row, device, c, true);
    for (size_t k = 0; k < r.tensor_ranks.size(); ++k)
      print(row + "/t" + std::to_string(k + 1),
            k + 1 < a.slice.tensor_devices.size() ? a.slice.tensor_devices[k + 1] : device,
            r.tensor_ranks[k], false);
    busy += c.busy_s;
    span = std::max(span, t);
  }
  const double m = static_cast<double>(job.train.microbatches);
  if (!infer) {
    if (job.chunks > 1)
      std::printf(
          "bubble: measured %.3f (idle share of stage time), formula (p-1)/(vm+p-1) = %.3f\n",
          1.0 - busy / (n * span),
          bubbleFormula(job.train.schedule, static_cast<int>(p), job.train.microbatches,
                        job.chunks));
    else
      std::printf(
          "bubble: measured %.3f (idle share of stage time), formula (p-1)/(m+p-1) = %.3f\n",
          1.0 - busy / (n * span), (p - 1) / (m + p - 1));
    // The steady step: stage 0's median (every stage's period is the same: a step flushes).
    const runtime::StageReport& first = result.reports.front();
    if (first.steps_timed > 0) {
      std::printf("step: measured %.3f ms (mean of %lld steps)", first.step_mean_s * 1e3,
                  static_cast<long long>(first.steps_timed));
      if (const auto& planned = jr.planned(); planned && planned->plan.step_s > 0)
        std::printf(", predicted %.3f ms: measured / predicted %.2f", planned->plan.step_s * 1e3,
                    first.step_mean_s / planned->plan.step_s);
      std::printf("\n");
    }
    printShares(jr, result);
  }
}

void printMemory(const runtime::JobRun& jr, const runtime::RunResult& result,
                 runtime::RunMode mode) {
  const JobSpec& job = jr.job();
  const std::vector<StagePlacement>& stages = jr.stages();
  const std::vector<runtime::Assign>& as = jr.assignments();
  const int n = static_cast<int>(as.size());
  const Model model(parseModelSpec(jr.modelSpec(), job.source));
  const std::vector<int64_t> predicted = runtime::stageMemory(job, model, stages, mode);
  std::printf("memory MiB per worker: tensors at peak / predicted (resident at peak):");
  for (int i = 0; i < n; ++i) {
    const runtime::Assign& a = as[static_cast<size_t>(i)];
    const runtime::StageReport& r = result.reports[static_cast<size_t>(i)];
    const std::string tensors =
        r.peak_tensor_bytes < 0
            ? "-"
            : std::to_string(static_cast<double>(r.peak_tensor_bytes) / (1 << 20)).substr(0, 6);
    std::printf(" %s%s %s/%.1f (%.1f)", std::to_string(a.stage).c_str(),
                a.replicas > 1 ? ("." + std::to_string(a.replica)).c_str() : "", tensors.c_str(),
                static_cast<double>(predicted.at(static_cast<size_t>(a.stage))) / (1 << 20),
                static_cast<double>(r.peak_rss_bytes) / (1 << 20));
  }
  std::printf("\n");
  // What a training worker's state holds: a sharded replica's (ZeRO) are its shards.
  const bool counted =
      std::any_of(result.reports.begin(), result.reports.end(),
                  [](const runtime::StageReport& r) { return r.state_bytes >= 0; });
  if (mode != runtime::RunMode::kTrain || !counted) return;
  std::printf("training state MiB per worker: weights / gradients at most / optimizer state%s:",
              job.train.zero > 0 ? fmt::format(" (zero: {})", job.train.zero).c_str() : "");
  auto mib = [](int64_t bytes) {
    return bytes < 0 ? std::string("-")
                     : fmt::format("{:.2f}", static_cast<double>(bytes) / (1 << 20));
  };
  for (int i = 0; i < n; ++i) {
    const runtime::Assign& a = as[static_cast<size_t>(i)];
    const runtime::StageReport& r = result.reports[static_cast<size_t>(i)];
    std::printf(" %d%s %s/%s/%s", a.stage,
                a.replicas > 1 ? ("." + std::to_string(a.replica)).c_str() : "",
                mib(r.weight_bytes).c_str(), mib(r.gradient_peak_bytes).c_str(),
                mib(r.state_bytes).c_str());
  }
  std::printf("\n");
}

}  // namespace tandem::cli
