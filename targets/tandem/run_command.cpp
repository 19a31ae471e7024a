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
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/file.h"
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
  int stage = 0, replica = 0;
  std::string name;  // "stage 1", or "stage 1 replica 0" when the stage has replicas
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
std::string describeExit(const Worker& w, int status, const char* when) {
  std::string what = WIFSIGNALED(status)
                         ? "was killed by signal " + std::to_string(WTERMSIG(status))
                         : "exited with code " + std::to_string(WEXITSTATUS(status));
  return w.name + " (pid " + std::to_string(w.pid) + ") " + what + " " + when;
}

// The workers: one per replica of each stage, in stage order.
class Workers {
 public:
  explicit Workers(const std::vector<StagePlacement>& stages) {
    for (size_t s = 0; s < stages.size(); ++s) {
      first_.push_back(all.size());
      for (int r = 0; r < stages[s].replicas; ++r) {
        Worker w;
        w.stage = static_cast<int>(s);
        w.replica = r;
        w.name = "stage " + std::to_string(s);
        if (stages[s].replicas > 1) w.name += " replica " + std::to_string(r);
        all.push_back(std::move(w));
      }
    }
  }
  int replicas(int stage) const {
    const auto s = static_cast<size_t>(stage);
    return static_cast<int>((s + 1 < first_.size() ? first_[s + 1] : all.size()) - first_[s]);
  }
  // The worker a control message names; FormatError if there is none such.
  Worker& named(const Json& m) {
    const int64_t stage = field<int64_t>(m, "stage");
    const int64_t replica = m.contains("replica") ? field<int64_t>(m, "replica") : 0;
    if (stage < 0 || stage >= static_cast<int64_t>(first_.size()) || replica < 0 ||
        replica >= replicas(static_cast<int>(stage)))
      throw FormatError("a control message names stage " + std::to_string(stage) + " replica " +
                        std::to_string(replica));
    return at(static_cast<int>(stage), static_cast<int>(replica));
  }
  Worker& at(int stage, int replica) {
    return all[first_[static_cast<size_t>(stage)] + static_cast<size_t>(replica)];
  }
  std::vector<Worker> all;

 private:
  std::vector<size_t> first_;  // each stage's first worker
};

// True if the worker, running until now, has exited (its `status`); it is marked so.
bool reapedNow(Worker& w, int& status) {
  if (w.exited || waitpid(w.pid, &status, WNOHANG) != w.pid) return false;
  w.exited = true;
  return true;
}

// Workers killed by a signal, named before another's error report: a replica's peers
// see its connection close the moment it dies, and report that before the kill is seen
// here. Waits up to 1 s for the dead to be reaped: a loaded machine may take that long,
// and a run that has failed can spare it. "" if none.
std::string killedFirst(std::vector<Worker>& workers) {
  std::string named;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (;;) {
    for (Worker& w : workers) {
      int status = 0;
      if (reapedNow(w, status) && WIFSIGNALED(status))
        named += describeExit(w, status, "before finishing") + "; then ";
    }
    if (!named.empty() || std::chrono::steady_clock::now() >= until) return named;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// A worker's error report: "stage 1 failed: <its message>".
std::string describeError(Workers& workers, const Json& report) {
  return workers.named(report).name + " failed: " + field<std::string>(report, "message");
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
void printInference(const std::vector<StageSpans>& all, const Json& result, int64_t batch,
                    int64_t microbatches) {
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
  if (!job.save.empty() && !args.infer) {  // its folder is made, as --timeline's is
    const std::filesystem::path dir = std::filesystem::path(job.save).parent_path();
    std::error_code ec;
    if (!dir.empty()) std::filesystem::create_directories(dir, ec);
    TANDEM_CHECK_MSG(!ec, IoError,
                     "cannot make the folder of save: '" << dir.string() << "': " << ec.message());
    checkWritable(job.save, "model file");
  }
  if (!timeline.empty()) {  // made now, so that a path that cannot be one is named at once
    std::error_code ec;
    std::filesystem::create_directories(timeline, ec);
    TANDEM_CHECK_MSG(!ec, IoError,
                     "cannot make the timeline directory '" << timeline << "': " << ec.message());
    checkWritable(timeline + "/trace.json", "the timeline");
  }
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
  Workers pool(stages);
  std::vector<Worker>& workers = pool.all;
  const int n = static_cast<int>(workers.size());
  for (int i = 0; i < n; ++i) {
    Worker& w = workers[static_cast<size_t>(i)];
    std::vector<std::string> argv = {"stage",     path,
                                     "--stage",   std::to_string(w.stage),
                                     "--replica", std::to_string(w.replica),
                                     "--control", in.endpoint(),
                                     "--run-dir", run_dir,
                                     "--mode",    args.infer ? "infer" : "train"};
    if (spans_wanted) argv.insert(argv.end(), {"--spans", spanFile(run_dir, i)});
    if (!plan_file.empty()) argv.insert(argv.end(), {"--plan", plan_file});
    w.pid = spawnSelf(argv);
    const StagePlacement& place = stages[static_cast<size_t>(w.stage)];
    spdlog::info("{}: layers [{}, {}) on {} ({} threads), pid {}", w.name, place.begin, place.end,
                 place.backendOf(w.replica), place.threads, w.pid);
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
  while (done < n) {
    // A worker that exits before reporting done has failed, whatever its code.
    for (Worker& w : workers) {
      int status = 0;
      if (reapedNow(w, status)) {
        if (!w.done && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
          // Its error report, if it sent one, says more than the exit status; a worker
          // killed meanwhile is likely the cause, and named first.
          const std::string first = WIFSIGNALED(status) ? "" : killedFirst(workers);
          try {
            while (auto m = in.recv(100ms))
              if (m->value("type", "") == "error") return fail(first + describeError(pool, *m));
          } catch (const FormatError& e) {
            return fail(first + e.what());
          }
          return fail(first + describeExit(w, status, "before finishing"));
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
      if (type == "error") return fail(killedFirst(workers) + describeError(pool, *m));
      if (type == "hello") {
        Worker& w = pool.named(*m);
        if (!w.hello.is_null()) return fail(w.name + " said hello twice");
        w.hello = *m;
        if (++hellos < n) continue;
        // Every worker is up: tell each its neighbours' receive endpoints — replica r of
        // stage s gets, from every replica of the stages beside it, the endpoint that
        // replica bound for r.
        const int64_t train_samples = field<int64_t>(workers[0].hello, "train_samples");
        const int64_t test_samples = field<int64_t>(workers[0].hello, "test_samples");
        auto endpoints = [&](int stage, const char* side, int replica) {
          Json list = Json::array();
          for (int j = 0; stage >= 0 && stage < p && j < pool.replicas(stage); ++j) {
            const Json& eps = pool.at(stage, j).hello.at(side);
            if (!eps.is_array() || static_cast<int>(eps.size()) <= replica)
              throw FormatError(pool.at(stage, j).name + "'s hello lists too few '" + side +
                                "' endpoints");
            list.push_back(eps.at(static_cast<size_t>(replica)));
          }
          return list;
        };
        for (Worker& to : workers) {
          out.push_back(std::make_unique<ControlOut>(ctx, field<std::string>(to.hello, "control")));
          out.back()->send({{"type", "peers"},
                            {"prev", endpoints(to.stage - 1, "next", to.replica)},
                            {"next", endpoints(to.stage + 1, "prev", to.replica)},
                            {"train_samples", train_samples},
                            {"test_samples", test_samples}});
        }
        spdlog::info(
            "{} stages ({} workers) up: {} schedule, {} microbatches of a {}-sample batch, {} over "
            "{}",
            p, n, args.infer ? "forward" : scheduleName(job.schedule), job.microbatches, job.batch,
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
        Worker& w = pool.named(*m);
        if (w.done) return fail(w.name + " reported done twice");
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
  for (Worker& w : workers) {
    int status = 0;
    if (w.exited) continue;
    waitpid(w.pid, &status, 0);
    w.exited = true;
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      return fail(describeExit(w, status, "after finishing"));
  }
  if (spans_wanted) {
    std::vector<StageSpans> spans;
    for (int i = 0; i < n; ++i) {
      const Worker& w = workers[static_cast<size_t>(i)];
      spans.push_back(
          {w.stage, readSpans(spanFile(run_dir, i)), pool.replicas(w.stage) > 1 ? w.replica : -1});
    }
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
  // A replicated stage has a row per replica ("1.0", "1.1"), with the share of its time
  // spent summing gradients with the other replicas (sync %).
  std::printf("\n%-6s %-10s %-8s %7s %9s %9s %6s %6s %11s %11s %10s %8s %10s\n", "stage", "layers",
              "device", "busy %", "waiting %", "sending %", "sync %", "stash", "MB sent",
              "MB received", "ms/micro", "cpu ms", "predicted");
  double busy = 0, span = 0;
  for (const Worker& w : workers) {
    const Json& r = w.report;
    const Json& h = w.hello;
    const std::string row = pool.replicas(w.stage) > 1
                                ? std::to_string(w.stage) + "." + std::to_string(w.replica)
                                : std::to_string(w.stage);
    const double t = std::max(field<double>(r, "run_s"), 1e-9);
    const auto layers = h.at("layers");
    const std::string range = "[" + std::to_string(layers.at(0).get<int64_t>()) + ", " +
                              std::to_string(layers.at(1).get<int64_t>()) + ")";
    const double micro =
        static_cast<double>(std::max<int64_t>(1, field<int64_t>(r, "microbatches")));
    const double per_micro = (field<double>(r, "busy_s") - field<double>(r, "step_s")) / micro;
    const double cpu_per_micro = field<double>(r, "compute_cpu_s") / micro;
    const double predicted = stages[static_cast<size_t>(w.stage)].predicted_compute_s;
    const std::string predicted_text =
        predicted >= 0 ? std::to_string(predicted * 1e3).substr(0, 6) : "-";
    std::printf("%-6s %-10s %-8s %7.1f %9.1f %9.1f %6.1f %6lld %11.2f %11.2f %10.3f %8.3f %10s\n",
                row.c_str(), range.c_str(), field<std::string>(h, "device").c_str(),
                100 * field<double>(r, "busy_s") / t, 100 * field<double>(r, "recv_wait_s") / t,
                100 * field<double>(r, "send_s") / t, 100 * field<double>(r, "allreduce_s") / t,
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
                1.0 - busy / (n * span), (p - 1) / (m + p - 1));
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
