// tandem run and tandem infer: options in, figures out. The runtime does the run
// (runtime/job/job_run.h): one worker process per stage (per replica of a replicated
// stage), started by the nodes' daemons and given its assignment in-band. Printed here:
// the plan, the last stage's progress and per-epoch summary, then a table per stage and
// the measured bubble beside (p-1)/(m+p-1), or the inference figures. A worker that fails
// or dies ends the run: the others are stopped, the failure is named, and the exit code
// is 1; SIGINT or SIGTERM stop it with 130 (docs/cli.md).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/file.h"
#include "core/model_spec.h"
#include "core/pipeline/timeline.h"
#include "runtime/job/job.h"
#include "runtime/job/job_run.h"
#include "targets/tandem/commands.h"
#include "targets/tandem/interrupt.h"
#include "targets/tandem/progress.h"

namespace tandem::cli {

using runtime::JobSpec;
using runtime::StagePlacement;

std::string tandemdProgram() {
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  for (const std::filesystem::path& p :
       {self.parent_path() / "tandemd", self.parent_path().parent_path() / "tandemd" / "tandemd"}) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) return p.string();
  }
  throw Error("cannot find tandemd beside " + self.string() +
              " (nor in ../tandemd/): tandem starts its workers through it");
}

namespace {

// Writes DIR/trace.json and DIR/timeline.svg (three training steps from the middle of
// the run, or all of it when shorter).
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

// Inference figures from the spans: each request (microbatch) from the start of its
// first-stage forward (which takes the input) to the end of its last-stage forward.
// After a recovery the spans are the last placement's: its requests only.
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

// A worker's layers: "[0, 7)", or an interleaved stage's chunks "[0,2)+[5,7)" (one word,
// as the table's column is).
std::string layersOf(const runtime::Assign& a) {
  if (a.chunks.empty())
    return "[" + std::to_string(a.layer_begin) + ", " + std::to_string(a.layer_end) + ")";
  std::string out;
  for (const LayerRange& c : a.chunks)
    out += (out.empty() ? "[" : "+[") + std::to_string(c.begin) + "," + std::to_string(c.end) + ")";
  return out;
}

// A plan's stages as "[0, 7) n0/cpu, [7, 10) n1/cpu".
std::string stageRanges(const partitioner::Plan& plan, const std::vector<std::string>& devices) {
  std::string out;
  for (const partitioner::PlanStage& st : plan.stages) {
    out += (out.empty() ? "[" : ", [") + std::to_string(st.at.begin) + ", " +
           std::to_string(st.at.end) + ")";
    for (size_t i = 0; i < st.at.devices.size(); ++i)
      out += (i ? "+" : " ") + devices.at(static_cast<size_t>(st.at.devices[i]));
  }
  return out;
}

// The links' codecs as the workers were given them: "fp32" (or "fp16/fp32": activations,
// gradients) when every link has the same, else each link's ("0->1 int8/fp32, 1->2 fp32").
// "fp16" when both directions carry it, else "int8/fp16" (activations/gradients).
std::string pair(WireCodec activations, WireCodec gradients) {
  const std::string act(wireCodecName(activations)), grad(wireCodecName(gradients));
  return act == grad ? act : act + "/" + grad;
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
  const bool ring = !as.front().chunks.empty();
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

// What a `partition: auto` run prints beside its plan: the search's plan (when a baseline
// runs) and every baseline that does not.
std::vector<const partitioner::Plan*> planAlternatives(const runtime::PlannedJob& planned) {
  std::vector<const partitioner::Plan*> out;
  if (planned.plan.algorithm != planned.searched.algorithm) out.push_back(&planned.searched);
  for (const partitioner::Plan& b : planned.baselines)
    if (b.algorithm != planned.plan.algorithm) out.push_back(&b);
  return out;
}

// `tandem infer --answers FILE`: one line per sample, in stream order, written as the
// answers come (a reader may follow the file): the sample's index, the class of its
// largest output, and every output (%.9g: each float exactly) — after the softmax or
// log-softmax an imported ONNX model ended in (`activation`), when it did.
class AnswerWriter {
 public:
  AnswerWriter(const std::string& path, std::string activation)
      : path_(path), activation_(std::move(activation)) {
    if (path.empty()) return;
    file_ = std::fopen(path.c_str(), "w");
    TANDEM_CHECK_MSG(file_ != nullptr, IoError,
                     "cannot write the answers to '" << path << "': " << std::strerror(errno));
  }
  ~AnswerWriter() {
    if (file_) std::fclose(file_);
  }
  AnswerWriter(const AnswerWriter&) = delete;
  AnswerWriter& operator=(const AnswerWriter&) = delete;

  void write(const runtime::Answer& a) {
    if (!file_) return;
    for (int64_t r = 0; r < a.count; ++r) {
      const float* row = a.outputs.data() + r * a.columns;
      std::fprintf(file_, "%lld %lld", static_cast<long long>(a.first + r),
                   static_cast<long long>(std::max_element(row, row + a.columns) - row));
      const std::vector<float> out = activated(row, a.columns);
      for (float v : out) std::fprintf(file_, " %.9g", v);
      std::fputc('\n', file_);
    }
    std::fflush(file_);
    if (std::ferror(file_)) throw IoError("writing the answers to '" + path_ + "' failed");
  }

 private:
  // The row as served: softmax / log-softmax over it (in double, from its largest value).
  std::vector<float> activated(const float* row, int32_t n) const {
    std::vector<float> out(row, row + n);
    if (activation_.empty() || n == 0) return out;
    const double top = *std::max_element(row, row + n);
    double sum = 0;
    for (int32_t c = 0; c < n; ++c) sum += std::exp(double(row[c]) - top);
    for (int32_t c = 0; c < n; ++c)
      out[static_cast<size_t>(c)] = activation_ == "softmax"
                                        ? static_cast<float>(std::exp(double(row[c]) - top) / sum)
                                        : static_cast<float>(double(row[c]) - top - std::log(sum));
    return out;
  }

  std::string path_;
  std::string activation_;  // "softmax", "log_softmax" or ""
  std::FILE* file_ = nullptr;
};

struct RunArgs {
  std::string job, timeline, cluster, key, resume;
  std::string launcher = "daemon";  // or "fork": workers forked by tandem run itself
  runtime::RunMode mode = runtime::RunMode::kTrain;  // or kInfer
  std::string answers;  // infer: write every sample's answer here
  double rate = 0;      // infer: requests per second fed in (0: as fast as they go)
};

int runJob(const RunArgs& args) {
  const InterruptGuard interrupt_guard;
  const auto started = std::chrono::steady_clock::now();
  const std::string& timeline = args.timeline;
  const bool infer = args.mode == runtime::RunMode::kInfer;
  const bool spans_wanted = infer || !timeline.empty();
  if (!timeline.empty()) {  // made now, so that a path that cannot be one is named at once
    std::error_code ec;
    std::filesystem::create_directories(timeline, ec);
    TANDEM_CHECK_MSG(!ec, IoError,
                     "cannot make the timeline directory '" << timeline << "': " << ec.message());
    checkWritable(timeline + "/trace.json", "the timeline");
  }
  runtime::JobRunOptions jo;
  jo.cluster = args.cluster;
  jo.key = args.key;
  jo.mode = args.mode;
  jo.spans = spans_wanted;
  jo.resume = args.resume;
  jo.request_rate = args.rate;
  if (args.launcher == "fork")  // kept to measure the daemon path against
    jo.fork = {std::filesystem::read_symlink("/proc/self/exe").string(), "stage"};
  else
    jo.tandemd = tandemdProgram();
  // Everything is checked, planned and placed here, before any worker starts.
  runtime::JobRun jr(runtime::loadJobSpec(args.job), jo);
  const JobSpec& job = jr.job();
  if (infer && !jr.startsFromWeights())
    spdlog::warn("{} names no 'weights': serving freshly initialised (untrained) parameters",
                 job.source);
  if (const auto& planned = jr.planned()) {
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
  // The placement: after a recovery (runtime::JobRun::run) the one the run ended on.
  const std::vector<StagePlacement>& stages = jr.stages();
  const std::vector<runtime::Assign>& as = jr.assignments();
  const std::vector<std::string>& names = jr.workerNames();

  Progress progress(job.train.epochs);
  double accuracy = -1;
  std::optional<runtime::InferDone> infer_result;
  runtime::RunCallbacks cb;
  cb.started = [&](int slot, int64_t pid) {
    const runtime::Assign& a = as[static_cast<size_t>(slot)];
    spdlog::info("{}: layers {} on {} ({} threads), pid {}", names[static_cast<size_t>(slot)],
                 layersOf(a), a.device, a.threads, pid);
  };
  cb.wired = [&] {
    const std::string codecs = linkCodecs(as);
    spdlog::info(
        "{} stages ({} workers) up: {} schedule, {} microbatches of a {}-sample batch, {} over {}",
        stages.size(), as.size(), infer ? "forward" : scheduleName(job.train.schedule),
        job.train.microbatches, job.train.batch, codecs,
        as.front().transport + (as.front().encrypt ? " (encrypted)" : ""));
  };
  bool stepped = false;
  cb.progress = [&](const runtime::Progress& m) {
    if (!stepped) {
      stepped = true;
      spdlog::info(
          "first step done {:.3f} s after the run started",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    }
    progress.update({m.epoch, m.step, m.steps, m.loss, m.samples_per_s, m.elapsed_s});
  };
  cb.epoch = [&](const runtime::EpochDone& m) {
    progress.finishEpoch();
    accuracy = m.test_accuracy;
    // Text data: the losses are per token, and the held-out perplexity is e^loss.
    const std::string perplexity =
        job.data.name.rfind("text:", 0) == 0
            ? fmt::format(", test perplexity {:.2f}", std::exp(m.test_loss))
            : std::string();
    std::printf(
        "epoch %lld/%lld: train loss %.4f, test loss %.4f, test accuracy %.4f%s, "
        "%.2f s (%.0f samples/s)\n",
        static_cast<long long>(m.epoch + 1), static_cast<long long>(job.train.epochs), m.loss,
        m.test_loss, accuracy, perplexity.c_str(), m.seconds, m.samples_per_s);
    std::fflush(stdout);
  };
  cb.infer = [&](const runtime::InferDone& m) { infer_result = m; };
  AnswerWriter answers(args.answers, jr.outputActivation());
  cb.answer = [&](const runtime::Answer& a) { answers.write(a); };
  runtime::RunResult result;
  try {
    result = jr.run(cb, &g_interrupt);
  } catch (const Error& e) {
    progress.finishEpoch();
    // Ctrl-C in a terminal reaches the workers too: what they report dying of is the
    // interruption.
    // What is kept: the checkpoints written so far, if any.
    const std::string kept = jr.lastCheckpoint().empty()
                                 ? "nothing was saved"
                                 : "the newest checkpoint is " + jr.lastCheckpoint() +
                                       " (continue with --resume " + job.checkpoint.dir + ")";
    if (const int s = g_interrupt.load(); s != 0) {
      spdlog::warn("interrupted by {}: every worker was stopped; {}",
                   s == SIGINT ? "SIGINT" : "SIGTERM", kept);
      throw Interrupted("the run was interrupted");
    }
    spdlog::error("{}", e.what());
    if (!jr.lastCheckpoint().empty()) spdlog::info("{}", kept);
    return 1;
  }

  const int p = static_cast<int>(stages.size());
  const int n = static_cast<int>(as.size());
  if (jr.startsFromWeights()) {  // what the nodes had to be sent, and what they held already
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
  std::vector<StageSpans> spans;
  for (int i = 0; i < n; ++i) {
    const runtime::Assign& a = as[static_cast<size_t>(i)];
    spans.push_back(
        {a.stage, result.reports[static_cast<size_t>(i)].spans, a.replicas > 1 ? a.replica : -1});
  }
  if (!timeline.empty()) writeTimeline(timeline, spans);
  if (infer) {
    if (!infer_result) {
      spdlog::error("the last stage reported no inference result");
      return 1;
    }
    printInference(spans, *infer_result, jr.streamTotals(), job.train.batch,
                   job.train.microbatches);
    if (!args.answers.empty())
      spdlog::info("answers: {} ({} samples{})", args.answers, jr.streamTotals().samples,
                   jr.outputActivation().empty()
                       ? std::string()
                       : ", outputs after the model's " + jr.outputActivation());
  }

  // Compute per microbatch: the stage's forward and backward time (busy less the
  // optimizer) over the microbatches it ran, the thread CPU time of the same (what the
  // stage computed, without the time other processes took its core), beside the plan's
  // prediction if there is one.
  // A replicated stage has a row per replica ("1.0", "1.1"), with the share of its time
  // spent summing gradients with the other replicas (sync %).
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
    const double micro = static_cast<double>(std::max<int64_t>(1, c.microbatches));
    const double per_micro = (c.busy_s - c.step_s) / micro;
    const double cpu_per_micro = c.compute_cpu_s / micro;
    const double predicted = stages[static_cast<size_t>(a.stage)].predicted_compute_s;
    const std::string predicted_text =
        predicted >= 0 ? std::to_string(predicted * 1e3).substr(0, 6) : "-";
    std::printf(
        "%-6s %-10s %-8s %7.1f %9.1f %9.1f %6.1f %6lld %11.2f %11.2f %10.3f %8.3f %8.3f %10s\n",
        row.c_str(), range.c_str(), result.ready[static_cast<size_t>(i)].device.c_str(),
        100 * c.busy_s / t, 100 * c.recv_wait_s / t, 100 * c.send_s / t, 100 * c.allreduce_s / t,
        static_cast<long long>(c.peak_stash), static_cast<double>(r.bytes_sent) / 1e6,
        static_cast<double>(r.bytes_received) / 1e6, per_micro * 1e3, cpu_per_micro * 1e3,
        r.process_cpu_s / micro * 1e3, predicted_text.c_str());
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
  }
  // Each worker's memory: what it grew by from before its model was built to its peak,
  // beside the partitioner's model of a stage (weights, gradients, optimizer state,
  // activations in flight, link buffers).
  {
    const Model model(parseModelSpec(jr.modelSpec(), job.source));
    const std::vector<int64_t> predicted = runtime::stageMemory(job, model, stages, args.mode);
    std::printf("memory MiB per worker: tensors at peak / predicted (resident at peak):");
    for (int i = 0; i < n; ++i) {
      const runtime::Assign& a = as[static_cast<size_t>(i)];
      const runtime::StageReport& r = result.reports[static_cast<size_t>(i)];
      const std::string tensors =
          r.peak_tensor_bytes < 0
              ? "-"
              : std::to_string(static_cast<double>(r.peak_tensor_bytes) / (1 << 20)).substr(0, 6);
      std::printf(" %s%s %s/%.1f (%.1f)", std::to_string(a.stage).c_str(),
                  a.replicas > 1 ? ("." + std::to_string(a.replica)).c_str() : "",
                  tensors.c_str(),
                  static_cast<double>(predicted.at(static_cast<size_t>(a.stage))) / (1 << 20),
                  static_cast<double>(r.peak_rss_bytes) / (1 << 20));
    }
    std::printf("\n");
  }
  if (accuracy >= 0) std::printf("test accuracy: %.4f\n", accuracy);
  std::fflush(stdout);
  if (!infer && !job.save.empty()) {
    spdlog::info("saving the trained model to {}", job.save);
    jr.save(result);
    spdlog::info("saved {}", job.save);
  }
  // A signal after the workers finished: the results above are whole (a save is never
  // left half-written), and the run still ends as interrupted.
  if (const int s = g_interrupt.load(); s != 0) {
    spdlog::warn("interrupted by {} after the workers had finished{}",
                 s == SIGINT ? "SIGINT" : "SIGTERM",
                 !infer && !job.save.empty() ? "; the model was saved whole" : "");
    throw Interrupted("the run was interrupted");
  }
  return 0;
}

}  // namespace

void addRun(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* c = app.add_subcommand(
      "run", "Train a pipeline job: one worker process per stage, started by node daemons");
  c->add_option("job", a->job, "Job file (examples/jobs/*.yaml)")->required();
  c->add_option("--cluster", a->cluster,
                "Run on this cluster's node daemons (every node with an `address`)");
  c->add_option("--key", a->key, "Cluster key file (default: the cluster file's `key`)");
  c->add_option("--timeline", a->timeline,
                "Write DIR/trace.json (Chrome trace) and DIR/timeline.svg of the run");
  c->add_option("--resume", a->resume,
                "Continue from the newest checkpoint in DIR (the job's `checkpoint: dir`): its "
                "weights, optimizer state and step");
  c->add_option("--launcher", a->launcher,
                "daemon (default): a node daemon starts the workers; fork: this process does "
                "(kept to measure the daemon path against)")
      ->check(CLI::IsMember({"daemon", "fork"}))
      ->capture_default_str();
  c->callback([a] {
    if (runJob(*a) != 0) throw Error("the run failed (see above)");
  });
}

void addInfer(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  a->mode = runtime::RunMode::kInfer;
  CLI::App* c = app.add_subcommand(
      "infer", "Stream the test set through a pipeline job's stages: throughput, latency");
  c->add_option("job", a->job, "Job file; its `weights` are served (else fresh ones)")->required();
  c->add_option("--answers", a->answers,
                "Write each sample's answer to FILE as it comes: index, class, outputs");
  c->add_option("--rate", a->rate,
                "Feed this many requests (microbatches) per second (default: as fast as the "
                "pipeline takes them)")
      ->check(CLI::Range(0.0, 1e6));
  c->add_option("--cluster", a->cluster,
                "Serve on this cluster's node daemons (every node with an `address`)");
  c->add_option("--key", a->key, "Cluster key file (default: the cluster file's `key`)");
  c->add_option("--timeline", a->timeline,
                "Write DIR/trace.json (Chrome trace) and DIR/timeline.svg of the run");
  c->callback([a] {
    if (runJob(*a) != 0) throw Error("the run failed (see above)");
  });
}

}  // namespace tandem::cli
