// tandem run: a pipeline job on this machine — one `tandem stage` worker process per
// stage, wired over tcp or ipc loopback. Prints the last stage's progress and per-epoch
// summary, then a table per stage and the measured bubble beside (p-1)/(m+p-1). A worker
// that fails or dies ends the run: the others are stopped, the failure is named, and the
// exit code is non-zero.
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "core/pipeline/job.h"
#include "core/pipeline/timeline.h"
#include "targets/tandem/commands.h"
#include "targets/tandem/control.h"
#include "targets/tandem/planning.h"
#include "targets/tandem/progress.h"

namespace tandem::cli {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Worker {
  pid_t pid = -1;
  bool exited = false, done = false;
  Json hello, report;
};

// Stops every worker still running.
void stopAll(std::vector<Worker>& workers) {
  std::vector<pid_t> running;
  for (Worker& w : workers)
    if (!w.exited) running.push_back(w.pid), w.exited = true;
  stopChildren(running);
}

// "stage 1 (pid 42) was killed by signal 9 before finishing"
std::string describeExit(size_t stage, pid_t pid, int status, const char* when) {
  std::string what = WIFSIGNALED(status)
                         ? "was killed by signal " + std::to_string(WTERMSIG(status))
                         : "exited with code " + std::to_string(WEXITSTATUS(status));
  return "stage " + std::to_string(stage) + " (pid " + std::to_string(pid) + ") " + what + " " +
         when;
}

// A worker's error report: "stage 1 failed: <its message>".
std::string describeError(const Json& report) {
  return "stage " + std::to_string(field<int64_t>(report, "stage")) +
         " failed: " + field<std::string>(report, "message");
}

// Combines the stages' saved slices into one model file.
void mergeSaved(const JobSpec& job, int stages) {
  cpu::CpuBackend be;
  Model model(loadModelSpec(job.model));
  model.build(be, job.seed);
  std::vector<std::pair<std::string, Tensor>> state;
  int64_t steps = 0;
  ModelFile all;
  for (int s = 0; s < stages; ++s) {
    const std::string part = job.save + ".stage" + std::to_string(s);
    const ModelFile f = readModelFile(part);
    all.params.insert(all.params.end(), f.params.begin(), f.params.end());
    if (f.optimizer) {
      steps = f.optimizer->steps;
      for (const HostTensor& t : f.optimizer->tensors)
        state.push_back({t.name, toDevice(be, t.shape, t.data)});
    }
    std::filesystem::remove(part);
  }
  loadWeights(model, all, true);  // every parameter, from exactly one stage
  Optimizer optimizer(be, job.optimizer);
  optimizer.restore(state, steps);
  saveModel(job.save, model, &optimizer, {{"seed", static_cast<int64_t>(job.seed)}});
}

// Writes DIR/trace.json and DIR/timeline.svg (three training steps from the middle of
// the run, or all of it when shorter).
void writeTimeline(const std::string& dir, const std::vector<StageSpans>& all) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/trace.json") << chromeTrace(all);
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
  std::ofstream(dir + "/timeline.svg") << timelineSvg(all, begin, end);
  spdlog::info("timeline: {}/trace.json (Perfetto, chrome://tracing) and {}/timeline.svg", dir,
               dir);
}

// Inference figures from the spans: each request (microbatch) from the start of its
// first-stage forward (which takes the input) to the end of its last-stage forward.
void printInference(const std::vector<StageSpans>& all, const Json& result, int64_t batch,
                    int64_t microbatches) {
  std::map<int64_t, double> start;
  for (const Span& s : all.front().spans)
    if (s.type == ActionType::kForward) start[s.microbatch] = s.start_s;
  std::vector<double> latency;
  double first = std::numeric_limits<double>::max(), last = 0;
  for (const Span& s : all.back().spans) {
    if (s.type != ActionType::kForward) continue;
    auto it = start.find(s.microbatch);
    if (it == start.end()) continue;
    latency.push_back(s.end_s - it->second);
    first = std::min(first, it->second);
    last = std::max(last, s.end_s);
  }
  if (latency.empty()) throw Error("inference: no request went through every stage");
  std::sort(latency.begin(), latency.end());
  auto pct = [&](double q) {
    const auto i = static_cast<size_t>(q * static_cast<double>(latency.size() - 1) + 0.5);
    return latency[std::min(i, latency.size() - 1)] * 1e3;
  };
  const auto samples = field<int64_t>(result, "samples");
  const double wall = std::max(last - first, 1e-9);
  std::printf("inference: %lld samples as %zu requests (microbatches of ~%lld)\n",
              static_cast<long long>(samples), latency.size(),
              static_cast<long long>((batch + microbatches - 1) / microbatches));
  std::printf("throughput: %.0f samples/s, %.1f requests/s\n", static_cast<double>(samples) / wall,
              static_cast<double>(latency.size()) / wall);
  std::printf("latency per request: p50 %.2f ms, p95 %.2f ms, p99 %.2f ms\n", pct(0.5), pct(0.95),
              pct(0.99));
  std::printf("test accuracy: %.4f\n", field<double>(result, "accuracy"));
}

struct RunArgs {
  std::string job, timeline;
  bool infer = false;
};

int runJob(const RunArgs& args) {
  const std::string& path = args.job;
  const std::string& timeline = args.timeline;
  const bool spans_wanted = args.infer || !timeline.empty();
  const JobSpec job = loadJobSpec(path);
  const Model model(loadModelSpec(job.model));
  const std::string run_dir =
      (std::filesystem::temp_directory_path() / ("tandem-run-" + std::to_string(getpid())))
          .string();
  std::filesystem::create_directories(run_dir);
  // Plan (partition: auto) and check the stages before forking.
  std::string plan_file;
  std::vector<StagePlacement> stages;
  try {
    if (job.auto_partition) {
      plan_file = run_dir + "/plan.yaml";
      const partitioner::Plan plan = planJob(job, model, plan_file);
      spdlog::info(
          "partition: auto: {} stages by the {} search, predicted {:.3f} ms per "
          "microbatch ({}), {:.0f} samples/s",
          plan.stages.size(), plan.algorithm, plan.seconds * 1e3, plan.bottleneck,
          plan.samples_per_s);
    }
    stages = jobStages(job, model, plan_file);
  } catch (...) {
    std::filesystem::remove_all(run_dir);
    throw;
  }
  const int p = static_cast<int>(stages.size());
  transport::Context ctx;
  ControlIn in(ctx, "tcp://127.0.0.1:*");
  std::vector<Worker> workers(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) {
    const std::string stage = std::to_string(s);
    std::vector<std::string> argv = {
        "stage",       path,        "--stage", stage,    "--control",
        in.endpoint(), "--run-dir", run_dir,   "--mode", args.infer ? "infer" : "train"};
    if (spans_wanted) argv.insert(argv.end(), {"--spans", spanFile(run_dir, s)});
    if (!plan_file.empty()) argv.insert(argv.end(), {"--plan", plan_file});
    const pid_t pid = spawnSelf(argv);
    workers[static_cast<size_t>(s)].pid = pid;
    const StagePlacement& place = stages[static_cast<size_t>(s)];
    spdlog::info("stage {}: layers [{}, {}) on {} ({} threads), pid {}", s, place.begin, place.end,
                 place.backend, place.threads, pid);
  }
  std::vector<std::unique_ptr<ControlOut>> out;
  Progress progress(job.epochs);
  double accuracy = -1;
  Json infer_result;
  int hellos = 0, done = 0;
  auto fail = [&](const std::string& why) {
    progress.finishEpoch();
    spdlog::error("{}", why);
    stopAll(workers);
    std::filesystem::remove_all(run_dir);
    return 1;
  };
  auto last_message = Clock::now();
  while (done < p) {
    // A worker that exits before reporting done has failed, whatever its code.
    for (size_t s = 0; s < workers.size(); ++s) {
      int status = 0;
      Worker& w = workers[s];
      if (!w.exited && waitpid(w.pid, &status, WNOHANG) == w.pid) {
        w.exited = true;
        if (!w.done && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
          // Its error report, if it sent one, says more than the exit status.
          try {
            while (auto m = in.recv(100ms))
              if (m->value("type", "") == "error") return fail(describeError(*m));
          } catch (const FormatError& e) {
            return fail(e.what());
          }
          return fail(describeExit(s, w.pid, status, "before finishing"));
        }
      }
    }
    // Control messages come from other processes: a malformed one ends the run, named.
    try {
      const std::optional<Json> m = in.recv(200ms);
      if (!m) {
        if (Clock::now() - last_message > std::chrono::seconds(2 * job.timeout_s + 30))
          return fail("no word from any stage for " + std::to_string(2 * job.timeout_s + 30) +
                      " s");
        continue;
      }
      last_message = Clock::now();
      const std::string type = field<std::string>(*m, "type");
      if (type == "error") return fail(describeError(*m));
      const int64_t stage = type == "progress" || type == "epoch" || type == "infer"
                                ? p - 1
                                : field<int64_t>(*m, "stage");
      if (stage < 0 || stage >= p)
        return fail("a control message names stage " + std::to_string(stage));
      Worker& w = workers[static_cast<size_t>(stage)];
      if (type == "hello") {
        w.hello = *m;
        if (++hellos < p) continue;
        // Every stage is up: tell each its neighbours' receive endpoints.
        const int64_t train_samples = field<int64_t>(workers[0].hello, "train_samples");
        const int64_t test_samples = field<int64_t>(workers[0].hello, "test_samples");
        for (int s = 0; s < p; ++s) {
          const auto i = static_cast<size_t>(s);
          out.push_back(
              std::make_unique<ControlOut>(ctx, field<std::string>(workers[i].hello, "control")));
          out.back()->send(
              {{"type", "peers"},
               {"prev", s > 0 ? field<std::string>(workers[i - 1].hello, "next") : ""},
               {"next", s < p - 1 ? field<std::string>(workers[i + 1].hello, "prev") : ""},
               {"train_samples", train_samples},
               {"test_samples", test_samples}});
        }
        spdlog::info("{} stages up: {} schedule, {} microbatches of a {}-sample batch, {} over {}",
                     p, args.infer ? "forward" : scheduleName(job.schedule), job.microbatches,
                     job.batch,
                     job.activation_codec == job.gradient_codec
                         ? job.activation_codec
                         : job.activation_codec + "/" + job.gradient_codec,
                     job.transport);
      } else if (type == "progress") {
        progress.update({field<int64_t>(*m, "epoch"), field<int64_t>(*m, "step"),
                         field<int64_t>(*m, "steps"), field<double>(*m, "loss"),
                         field<double>(*m, "samples_per_s"), field<double>(*m, "elapsed_s")});
      } else if (type == "epoch") {
        progress.finishEpoch();
        accuracy = field<double>(*m, "test_accuracy");
        std::printf(
            "epoch %lld/%lld: train loss %.4f, test loss %.4f, test accuracy %.4f, "
            "%.2f s (%.0f samples/s)\n",
            static_cast<long long>(field<int64_t>(*m, "epoch") + 1),
            static_cast<long long>(job.epochs), field<double>(*m, "loss"),
            field<double>(*m, "test_loss"), accuracy, field<double>(*m, "seconds"),
            field<double>(*m, "samples_per_s"));
        std::fflush(stdout);
      } else if (type == "infer") {
        infer_result = *m;
      } else if (type == "done") {
        w.report = *m;
        w.done = true;
        ++done;
      } else {
        return fail("unknown control message '" + type + "'");
      }
    } catch (const FormatError& e) {
      return fail(e.what());
    }
  }
  for (size_t s = 0; s < workers.size(); ++s) {
    Worker& w = workers[s];
    int status = 0;
    if (w.exited) continue;
    waitpid(w.pid, &status, 0);
    w.exited = true;
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      return fail(describeExit(s, w.pid, status, "after finishing"));
  }
  if (spans_wanted) {
    std::vector<StageSpans> spans;
    for (int s = 0; s < p; ++s) spans.push_back({s, readSpans(spanFile(run_dir, s))});
    if (!timeline.empty()) writeTimeline(timeline, spans);
    if (args.infer) {
      if (infer_result.is_null()) return fail("the last stage reported no inference result");
      printInference(spans, infer_result, job.batch, job.microbatches);
    }
  }
  std::filesystem::remove_all(run_dir);

  // Compute per microbatch: the stage's forward and backward time (busy less the
  // optimizer) over the microbatches it ran, the thread CPU time of the same (what the
  // stage computed, without the time other processes took its core), beside the plan's
  // prediction if there is one.
  std::printf("\n%-6s %-10s %-8s %7s %9s %9s %6s %11s %11s %10s %8s %10s\n", "stage", "layers",
              "device", "busy %", "waiting %", "sending %", "stash", "MB sent", "MB received",
              "ms/micro", "cpu ms", "predicted");
  double busy = 0, span = 0;
  for (int s = 0; s < p; ++s) {
    const Json& r = workers[static_cast<size_t>(s)].report;
    const Json& h = workers[static_cast<size_t>(s)].hello;
    const double t = std::max(field<double>(r, "run_s"), 1e-9);
    const auto layers = h.at("layers");
    const std::string range = "[" + std::to_string(layers.at(0).get<int64_t>()) + ", " +
                              std::to_string(layers.at(1).get<int64_t>()) + ")";
    const double micro =
        static_cast<double>(std::max<int64_t>(1, field<int64_t>(r, "microbatches")));
    const double per_micro = (field<double>(r, "busy_s") - field<double>(r, "step_s")) / micro;
    const double cpu_per_micro = field<double>(r, "compute_cpu_s") / micro;
    const double predicted = stages[static_cast<size_t>(s)].predicted_compute_s;
    const std::string predicted_text =
        predicted >= 0 ? std::to_string(predicted * 1e3).substr(0, 6) : "-";
    std::printf("%-6d %-10s %-8s %7.1f %9.1f %9.1f %6lld %11.2f %11.2f %10.3f %8.3f %10s\n", s,
                range.c_str(), field<std::string>(h, "device").c_str(),
                100 * field<double>(r, "busy_s") / t, 100 * field<double>(r, "recv_wait_s") / t,
                100 * field<double>(r, "send_s") / t,
                static_cast<long long>(field<int64_t>(r, "peak_stash")),
                static_cast<double>(field<int64_t>(r, "bytes_sent")) / 1e6,
                static_cast<double>(field<int64_t>(r, "bytes_received")) / 1e6, per_micro * 1e3,
                cpu_per_micro * 1e3, predicted_text.c_str());
    busy += field<double>(r, "busy_s");
    span = std::max(span, t);
  }
  const double m = static_cast<double>(job.microbatches);
  if (!args.infer)
    std::printf("bubble: measured %.3f (idle share of stage time), formula (p-1)/(m+p-1) = %.3f\n",
                1.0 - busy / (p * span), (p - 1) / (m + p - 1));
  if (accuracy >= 0) std::printf("test accuracy: %.4f\n", accuracy);
  std::fflush(stdout);
  if (!args.infer && !job.save.empty()) {
    mergeSaved(job, p);
    spdlog::info("saved {}", job.save);
  }
  return 0;
}

}  // namespace

void addRun(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* c = app.add_subcommand(
      "run", "Train a pipeline job: one worker process per stage on this machine");
  c->add_option("job", a->job, "Job file (examples/jobs/*.yaml)")->required();
  c->add_option("--timeline", a->timeline,
                "Write DIR/trace.json (Chrome trace) and DIR/timeline.svg of the run");
  c->callback([a] {
    if (runJob(*a) != 0) throw Error("the run failed (see above)");
  });
}

void addInfer(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  a->infer = true;
  CLI::App* c = app.add_subcommand(
      "infer", "Stream the test set through a pipeline job's stages: throughput, latency");
  c->add_option("job", a->job, "Job file; its `weights` are served (else fresh ones)")->required();
  c->add_option("--timeline", a->timeline,
                "Write DIR/trace.json (Chrome trace) and DIR/timeline.svg of the run");
  c->callback([a] {
    if (runJob(*a) != 0) throw Error("the run failed (see above)");
  });
}

}  // namespace tandem::cli
