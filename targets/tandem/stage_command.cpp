// tandem stage: one pipeline stage's worker process, started by `tandem run`. It builds
// its slice of the model, binds its links, says hello on the control channel, waits to
// be told its neighbours' endpoints, then trains and evaluates in step with the other
// stages and reports (the last stage: progress, losses and accuracy; every stage: its
// counters). Any error is reported on the control channel before the process exits 1.
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <memory>

#include "backends/registry.h"
#include "core/error.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "core/pipeline/job.h"
#include "core/pipeline/stage_trainer.h"
#include "targets/tandem/commands.h"
#include "targets/tandem/control.h"
#include "targets/tandem/planning.h"
#include "transport/socket_group.h"
#include "transport/zmq_link.h"

namespace tandem::cli {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct StageArgs {
  std::string job, control, run_dir;
  std::string mode = "train";  // or "infer": stream the test set forward-only
  std::string spans;           // if set: record a span per action and write them here (JSON)
  std::string plan;            // the plan `tandem run` made for `partition: auto`
  int stage = 0, replica = 0;
};

Json countersJson(const StageCounters& c) {
  return {{"busy_s", c.busy_s},
          {"step_s", c.step_s},
          {"compute_cpu_s", c.compute_cpu_s},
          {"recv_wait_s", c.recv_wait_s},
          {"send_s", c.send_s},
          {"allreduce_s", c.allreduce_s},
          {"peak_stash", c.peak_stash},
          {"microbatches", c.microbatches}};
}

StageCounters minus(StageCounters a, const StageCounters& b) {
  a.busy_s -= b.busy_s;
  a.step_s -= b.step_s;
  a.compute_cpu_s -= b.compute_cpu_s;
  a.recv_wait_s -= b.recv_wait_s;
  a.send_s -= b.send_s;
  a.allreduce_s -= b.allreduce_s;
  a.microbatches -= b.microbatches;
  return a;
}

void runStage(const StageArgs& a, ControlOut& report, transport::Context& ctx) {
  const JobSpec job = loadJobSpec(a.job);
  const ModelSpec spec = loadModelSpec(job.model);
  const auto stages = jobStages(job, Model(spec), a.plan);
  const int p = static_cast<int>(stages.size()), s = a.stage;
  TANDEM_CHECK_MSG(s >= 0 && s < p, InvalidArgument,
                   "--stage " << s << " but the job has " << p << " stages");
  const StagePlacement& place = stages[static_cast<size_t>(s)];
  const int replica = a.replica, replicas = place.replicas;
  TANDEM_CHECK_MSG(replica >= 0 && replica < replicas, InvalidArgument,
                   "--replica " << replica << " but stage " << s << " has " << replicas);
  auto replicasOf = [&](int stage) { return stages[static_cast<size_t>(stage)].replicas; };
  const size_t begin = place.begin, end = place.end;
  // The backend outlives everything that holds its memory (declared first).
  auto backend = makeBackend(place.backendOf(replica), BackendOptions{place.threads});
  Model model(spec);
  model.build(*backend, job.seed, begin, end);
  if (!job.weights.empty()) loadWeights(model, readModelFile(job.weights), false);
  Optimizer optimizer(*backend, job.optimizer);

  // One link to each replica of each neighbouring stage (one each when unreplicated): the
  // previous stage's carry gradients out, the next stage's activations.
  auto linkOptions = [&](const std::string& side, const std::string& codec, int peer) {
    transport::LinkOptions o;
    o.bind = job.transport == "ipc" ? "ipc://" + a.run_dir + "/s" + std::to_string(s) + "r" +
                                          std::to_string(replica) + side
                                    : std::string("tcp://127.0.0.1:*");
    o.codec = transport::parseCodec(codec);
    o.timeout = std::chrono::seconds(job.timeout_s);
    o.stage = s;
    o.peer_stage = peer;
    return o;
  };
  std::vector<std::unique_ptr<transport::ZmqLink>> prev_links, next_links;
  Json prev_endpoints = Json::array(), next_endpoints = Json::array();
  for (int i = 0; s > 0 && i < replicasOf(s - 1); ++i) {
    prev_links.push_back(std::make_unique<transport::ZmqLink>(
        ctx, linkOptions("-prev" + std::to_string(i), job.gradient_codec, s - 1)));
    prev_endpoints.push_back(prev_links.back()->endpoint());
  }
  for (int j = 0; s < p - 1 && j < replicasOf(s + 1); ++j) {
    next_links.push_back(std::make_unique<transport::ZmqLink>(
        ctx, linkOptions("-next" + std::to_string(j), job.activation_codec, s + 1)));
    next_endpoints.push_back(next_links.back()->endpoint());
  }
  ControlIn in(ctx, "tcp://127.0.0.1:*");

  Dataset train, test;
  if (s == 0) {  // every replica of the first stage reads the data (each its microbatches)
    if (a.mode == "train") train = loadDataset(job.data, job.data_dir, true, job.train_limit);
    test = loadDataset(job.data, job.data_dir, false, job.test_limit);
  }
  report.send({{"type", "hello"},
               {"stage", s},
               {"replica", replica},
               {"pid", static_cast<int64_t>(getpid())},
               {"prev", prev_endpoints},
               {"next", next_endpoints},
               {"control", in.endpoint()},
               {"layers", Json::array({begin, end})},
               {"device", backend->info().name},
               {"train_samples", s == 0 ? train.size() : int64_t{-1}},
               {"test_samples", s == 0 ? test.size() : int64_t{-1}}});
  const auto peers = in.recv(std::chrono::seconds(job.timeout_s));
  if (!peers) throw Timeout("stage " + std::to_string(s) + ": no peers from `tandem run`");
  if (field<std::string>(*peers, "type") != "peers")
    throw FormatError("stage " + std::to_string(s) + ": expected a peers message");
  const std::string who = "stage " + std::to_string(s) + " replica " + std::to_string(replica);
  auto connect = [&](const char* key, std::vector<std::unique_ptr<transport::ZmqLink>>& links) {
    const Json& eps = peers->at(key);
    if (!eps.is_array() || eps.size() != links.size())
      throw FormatError(who + ": the peers message's '" + key + "' must list " +
                        std::to_string(links.size()) + " endpoints");
    std::vector<Link*> out;
    for (size_t i = 0; i < links.size(); ++i) {
      if (!eps[i].is_string())
        throw FormatError(who + ": the peers message's '" + key + "' holds a non-string");
      links[i]->connect(eps[i].get<std::string>());
      out.push_back(links[i].get());
    }
    return out.empty() ? nullptr : std::make_unique<ReplicaLinks>(out);
  };
  if (!peers->contains("prev") || !peers->contains("next"))
    throw FormatError(who + ": the peers message lacks 'prev' or 'next'");
  const std::unique_ptr<ReplicaLinks> prev = connect("prev", prev_links);
  const std::unique_ptr<ReplicaLinks> next = connect("next", next_links);
  // The stage's replicas sum their gradients over a group of their own, over plain
  // sockets (its rendezvous directory is new in this run's directory).
  std::unique_ptr<Group> group;
  if (replicas > 1) {
    transport::SocketGroupOptions go;
    go.rank = replica;
    go.size = replicas;
    go.transport = job.transport;
    go.ipc_dir = a.run_dir;
    go.connect_timeout = std::chrono::seconds(job.timeout_s);
    go.job = static_cast<uint64_t>(s);
    group = transport::makeSocketGroup(
        go, transport::fileExchange(a.run_dir + "/group-s" + std::to_string(s), replica, replicas,
                                    std::chrono::seconds(job.timeout_s)));
  }
  const int64_t train_samples = field<int64_t>(*peers, "train_samples");
  const int64_t test_samples = field<int64_t>(*peers, "test_samples");

  PipelineOptions po;
  po.schedule = job.schedule;
  po.microbatches = job.microbatches;
  po.batch = job.batch;
  po.seed = job.seed;
  po.recompute = job.recompute;
  po.record_spans = !a.spans.empty();
  po.replicas = group.get();
  po.collective_timeout = std::chrono::seconds(job.timeout_s);
  StageTrainer trainer(model, StageRange{s, p, begin, end}, prev.get(), next.get(), &optimizer, po);
  // Replicas of the last stage all hold the step's whole loss; the first reports it.
  const bool last = s == p - 1 && replica == 0;
  StageCounters counters;  // over training (train) or the stream (infer)
  double run_s = 0;
  if (a.mode == "infer") {
    const auto t0 = Clock::now();
    const EvalResult ev = trainer.evaluate(s == 0 ? &test : nullptr, test_samples, job.batch);
    run_s = std::chrono::duration<double>(Clock::now() - t0).count();
    counters = trainer.executor().counters();
    if (last)
      report.send({{"type", "infer"},
                   {"samples", ev.samples},
                   {"loss", ev.loss},
                   {"accuracy", ev.accuracy},
                   {"seconds", run_s}});
  }
  for (int64_t e = 0; a.mode == "train" && e < job.epochs; ++e) {
    auto sent = Clock::now() - 1h;
    auto progress = [&](const StepReport& r) {
      if (!last || (Clock::now() - sent < 250ms && r.step < r.steps)) return;
      sent = Clock::now();
      report.send({{"type", "progress"},
                   {"epoch", r.epoch},
                   {"step", r.step},
                   {"steps", r.steps},
                   {"loss", r.loss},
                   {"samples_per_s", r.samples_per_s},
                   {"elapsed_s", r.elapsed_s}});
    };
    const StageCounters before = trainer.executor().counters();
    const EpochReport r = trainer.trainEpoch(s == 0 ? &train : nullptr, train_samples, e, progress);
    const StageCounters delta = minus(trainer.executor().counters(), before);
    counters.busy_s += delta.busy_s;
    counters.step_s += delta.step_s;
    counters.compute_cpu_s += delta.compute_cpu_s;
    counters.recv_wait_s += delta.recv_wait_s;
    counters.send_s += delta.send_s;
    counters.allreduce_s += delta.allreduce_s;
    counters.microbatches += delta.microbatches;
    run_s += r.seconds;
    const EvalResult ev = trainer.evaluate(s == 0 ? &test : nullptr, test_samples, job.batch);
    if (last)
      report.send({{"type", "epoch"},
                   {"epoch", e},
                   {"loss", r.train_loss},
                   {"seconds", r.seconds},
                   {"samples_per_s", r.samples_per_s},
                   {"test_loss", ev.loss},
                   {"test_accuracy", ev.accuracy}});
  }
  counters.peak_stash = trainer.executor().counters().peak_stash;
  if (a.mode == "train" && !job.save.empty() && replica == 0)  // replicas are identical
    saveModel(job.save + ".stage" + std::to_string(s), model, &optimizer);
  if (!a.spans.empty()) writeSpans(a.spans, trainer.executor().spans());
  Json done = countersJson(counters);
  done["type"] = "done";
  done["stage"] = s;
  done["replica"] = replica;
  done["run_s"] = run_s;
  uint64_t sent_bytes = 0, received_bytes = 0;
  for (const auto* links : {&prev_links, &next_links}) {
    for (const auto& l : *links) {
      sent_bytes += l->stats().bytes_sent_wire;
      received_bytes += l->stats().bytes_received_wire;
    }
  }
  done["bytes_sent"] = sent_bytes;
  done["bytes_received"] = received_bytes;
  report.send(done);
}

}  // namespace

void addStage(CLI::App& app) {
  auto a = std::make_shared<StageArgs>();
  CLI::App* c = app.add_subcommand("stage", "Run one pipeline stage (started by `tandem run`)");
  c->group("");  // internal: not listed in --help
  c->add_option("job", a->job, "Job file")->required();
  c->add_option("--stage", a->stage, "This worker's stage")->required();
  c->add_option("--replica", a->replica, "Which replica of the stage this worker is");
  c->add_option("--control", a->control, "`tandem run`'s control endpoint")->required();
  c->add_option("--run-dir", a->run_dir, "Directory for ipc endpoints")->required();
  c->add_option("--spans", a->spans, "Record the timeline's spans into this file");
  c->add_option("--plan", a->plan, "The plan to run (instead of the job's partition)");
  c->add_option("--mode", a->mode, "train or infer")->check(CLI::IsMember({"train", "infer"}));
  c->callback([a] {
    // Dies with `tandem run`: no stage outlives the run that started it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    transport::Context ctx;
    ControlOut report(ctx, a->control);
    try {
      runStage(*a, report, ctx);
    } catch (const std::exception& e) {
      try {
        report.send({{"type", "error"},
                     {"stage", a->stage},
                     {"replica", a->replica},
                     {"message", e.what()}},
                    2s);
      } catch (const std::exception&) {
        // `tandem run` is gone too; the exit code still says it.
      }
      throw;
    }
  });
}

}  // namespace tandem::cli
