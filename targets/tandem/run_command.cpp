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
#include "targets/tandem/run_report.h"

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
  std::string answers;                               // infer: write every sample's answer here
  double rate = 0;  // infer: requests per second fed in (0: as fast as they go)
};

// The run's options from the command's; the timeline's folder made now, so that a path
// that cannot be one is named before anything runs.
runtime::JobRunOptions runOptions(const RunArgs& args) {
  if (!args.timeline.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(args.timeline, ec);
    TANDEM_CHECK_MSG(
        !ec, IoError,
        "cannot make the timeline directory '" << args.timeline << "': " << ec.message());
    checkWritable(args.timeline + "/trace.json", "the timeline");
  }
  runtime::JobRunOptions jo;
  jo.cluster = args.cluster;
  jo.key = args.key;
  jo.mode = args.mode;
  jo.spans = args.mode == runtime::RunMode::kInfer || !args.timeline.empty();
  jo.resume = args.resume;
  jo.request_rate = args.rate;
  if (args.launcher == "fork")  // kept to measure the daemon path against
    jo.fork = {std::filesystem::read_symlink("/proc/self/exe").string(), "stage"};
  else
    jo.tandemd = tandemdProgram();
  return jo;
}

// A run that ended in an error: named, with what was kept (the checkpoints written so
// far); Interrupted when a signal ended it.
int runFailed(const runtime::JobRun& jr, const Error& e) {
  const JobSpec& job = jr.job();
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

int runJob(const RunArgs& args) {
  const InterruptGuard interrupt_guard;
  const auto started = std::chrono::steady_clock::now();
  const std::string& timeline = args.timeline;
  const bool infer = args.mode == runtime::RunMode::kInfer;
  const runtime::JobRunOptions jo = runOptions(args);
  // Everything is checked, planned and placed here, before any worker starts.
  runtime::JobRun jr(runtime::loadJobSpec(args.job), jo);
  const JobSpec& job = jr.job();
  if (infer && !jr.startsFromWeights())
    spdlog::warn("{} names no 'weights': serving freshly initialised (untrained) parameters",
                 job.source);
  printChosenPlan(jr);
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
                 layersOf(a), a.slice.device, a.slice.threads, pid);
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
    return runFailed(jr, e);
  }

  const int p = static_cast<int>(stages.size());
  const int n = static_cast<int>(as.size());
  if (jr.startsFromWeights()) printWeightsShipped(result, n);
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

  printStages(jr, result, p);
  printMemory(jr, result, args.mode);
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
