#include "runtime/job/job_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <utility>

#include <spdlog/spdlog.h>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/file.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "runtime/control/files.h"
#include "runtime/job/model_source.h"
#include "runtime/node/node_info.h"

namespace tandem::runtime {

namespace {

// The job's starting weights, if it names any: read and checked (a bad file is named
// here, once), to be named by their content hash for the workers to fetch; `output` gets
// what serving applies to the answers (the file's metadata "output").
std::shared_ptr<const std::vector<uint8_t>> startingWeights(const JobSpec& job,
                                                            std::string& output) {
  if (job.weights.empty()) return nullptr;
  const std::string text = readFile(job.weights, "weights");
  auto bytes = std::make_shared<std::vector<uint8_t>>(text.begin(), text.end());
  const ModelFile file = parseModelFile(*bytes, job.weights);
  const auto it = file.metadata.find("output");
  if (it != file.metadata.end())
    if (const auto* s = std::get_if<std::string>(&it->second)) output = *s;
  return bytes;
}

// The folder of `save:` made (as --timeline's is) and the file checked writable.
void prepareSave(const std::string& path) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  TANDEM_CHECK_MSG(!ec, IoError,
                   "cannot make the folder of save: '" << dir.string() << "': " << ec.message());
  checkWritable(path, "model file");
}

// The node of each worker on `cluster`: a plan's stage names its devices "node/device";
// a job's own ranges go to the cluster's nodes in turn (stage s to node s mod N).
std::vector<int> nodeOfSlot(const partitioner::Cluster& cluster, const std::vector<Assign>& as,
                            const std::vector<StagePlacement>& stages) {
  auto nodeIndex = [&](const std::string& name) {
    for (size_t i = 0; i < cluster.nodes.size(); ++i)
      if (cluster.nodes[i].name == name) return static_cast<int>(i);
    throw InvalidArgument("the plan places a stage on node '" + name + "', which " +
                          cluster.source + " lacks");
  };
  std::vector<int> out;
  for (const Assign& a : as) {
    const StagePlacement& place = stages[static_cast<size_t>(a.stage)];
    int node = a.stage % static_cast<int>(cluster.nodes.size());
    if (!place.replica_devices.empty()) {
      const std::string& device = place.replica_devices.at(static_cast<size_t>(a.replica));
      node = nodeIndex(device.substr(0, device.find('/')));
    }
    out.push_back(node);
  }
  return out;
}

// A left-out node answered at a checkpoint: the run stops there to take it back.
class NodeRejoins : public Error {
 public:
  NodeRejoins(const std::string& name, int64_t step)
      : Error("node '" + name + "' rejoins at step " + std::to_string(step)), name(name) {}
  std::string name;
};

// Whether the daemon of `node` (of `cluster`) answers: connected, authenticated, told
// who asks, and left again.
bool daemonAnswers(const partitioner::Cluster& cluster, const partitioner::ClusterNode& node,
                   const std::string& key_file) {
  partitioner::Cluster one;
  one.source = cluster.source;
  one.key = cluster.key;
  one.nodes = {node};
  try {
    const ClusterDaemons daemon(one, key_file, "");
    std::vector<std::unique_ptr<Channel>> session =
        daemon.connect("tandem run (is it back?)", std::chrono::seconds(2));
    leaveAll(session, "it answered; it rejoins the run at a checkpoint");
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::string nodeList(const partitioner::Cluster& cluster) {
  std::string nodes;
  for (const auto& n : cluster.nodes) nodes += (nodes.empty() ? "" : ", ") + n.name;
  return nodes;
}

}  // namespace

JobRun::JobRun(JobSpec job, JobRunOptions options)
    : job_(std::move(job)), options_(std::move(options)) {
  const bool serving = options_.mode != RunMode::kTrain;
  TANDEM_CHECK_MSG(!generates() || options_.prompts, InvalidArgument,
                   "a generation run needs a queue of prompts");
  if (generates()) ledger_ = std::make_unique<GenerationLedger>(*options_.prompts);
  if (!job_.save.empty() && !serving) prepareSave(job_.save);
  // Read once: placed, shipped, merged. An ONNX model's weights start the run unless the
  // job names others.
  ModelSource source = readModelSource(job_.model);
  model_spec_ = std::move(source.spec_yaml);
  const Model model(source.spec);
  if (!serving) model.requireTrainable();  // before any node is asked for anything
  weights_ = startingWeights(job_, output_);
  if (!weights_) {
    weights_ = std::move(source.weights);
    output_ = source.output;
  }
  if (!options_.resume.empty()) {  // the checkpoint's weights and step, checked against the job
    TANDEM_CHECK_MSG(!serving, InvalidArgument, "--resume continues training, not serving");
    std::optional<Checkpoint> c = newestCheckpoint(options_.resume);
    if (!c) throw InvalidArgument("no usable checkpoint in '" + options_.resume + "'");
    // The microbatch count decides how gradients are summed: a run that let the planner
    // choose it resumes with the one the checkpoint was taken with.
    if (job_.microbatches_auto) {
      job_.train.microbatches = c->job.microbatches;
      job_.microbatches_auto = false;
    }
    checkResumable(*c, checkpointJob(job_, model_spec_), job_.source);
    if (weights_)
      spdlog::warn("{} names 'weights', but the run resumes from {}", job_.source, c->model_path);
    parseModelFile(c->model, c->model_path);
    weights_ = std::make_shared<const std::vector<uint8_t>>(std::move(c->model));
    start_step_ = c->step;
    resume_replicas_ = c->replicas;
    spdlog::info("resuming from {} (step {})", c->model_path, c->step);
  }
  const std::string cluster_path = !options_.cluster.empty() ? options_.cluster : job_.cluster;
  TANDEM_CHECK_MSG(!job_.auto_partition || !cluster_path.empty(), InvalidArgument,
                   job_.partition_where
                       << ": 'partition: auto' needs a cluster to plan over: 'cluster: FILE' in "
                          "the job or --cluster (its daemons profile the devices unless "
                          "'profile: FILE' is given)");
  cluster_ = !cluster_path.empty() ? partitioner::loadCluster(cluster_path)
                                   : localCluster(1, job_.threads);
  for (const partitioner::ClusterNode& n : cluster_.nodes) node_order_.push_back(n.name);
  given_schedule_ = job_.train.schedule;
  given_chunks_ = job_.chunks;
  local_ = std::none_of(cluster_.nodes.begin(), cluster_.nodes.end(),
                        [](const partitioner::ClusterNode& n) { return n.address.has_value(); });
  resolveTransport();
  const bool fork = !options_.fork.empty();
  if (!job_.auto_partition) {
    place(model);
    // A cluster without addresses is this machine: its workers' devices and memory are
    // checked here, before its daemons start (a cluster's daemons are asked when the
    // launcher connects, still before any worker starts).
    if (!fork && local_) {
      // (OpenCL devices probed only when a worker is to run on one.)
      const bool opencl = std::any_of(needs_.begin(), needs_.end(), [](const WorkerNeeds& w) {
        return !w.device.empty() && w.device != "cpu";
      });
      const NodeInfo here = localNodeInfo("this machine", opencl);
      try {
        for (size_t n = 0; n < cluster_.nodes.size(); ++n)
          checkWorkersFit(cluster_.nodes[n].name, here, static_cast<int>(n), node_of_, needs_);
      } catch (const InvalidArgument& e) {  // named where the job places its stages
        throw InvalidArgument((job_.partition_where.empty() ? job_.source : job_.partition_where) +
                              ": " + e.what());
      }
    }
  }
  // The daemons: the cluster's, or tandemd processes started here for nodes without an
  // address — one path after this. Forked workers need them only to plan.
  if (!fork || job_.auto_partition)
    daemons_ = std::make_unique<ClusterDaemons>(cluster_, options_.key, options_.tandemd);
  if (job_.auto_partition) {
    planned_ = plan(job_, model);
    // What the planner chose stays for the whole run: a re-plan after a lost node keeps
    // the microbatch count (and so the sums) the run started with.
    job_.train.microbatches = planned_->microbatches;
    job_.train.schedule = planned_->schedule;
    job_.chunks = planned_->chunks;
    job_.microbatches_auto = job_.schedule_auto = false;
    place(model);
  } else if (generates() && daemons_ && stages_.size() > 1) {
    priceOwnSplit(model);
  }
}

void JobRun::priceOwnSplit(const Model& model) const {
  std::vector<LayerRange> ranges;
  std::vector<int> nodes;
  std::vector<std::string> backends;
  for (size_t s = 0; s < stages_.size(); ++s) {
    // Tensor-split and replicated stages are not priced per token (generation refuses the
    // latter anyway).
    if (stages_[s].slice.tensor > 1 || stages_[s].replicas > 1 || s >= node_of_.size()) return;
    ranges.push_back(stages_[s].slice.layers);
    nodes.push_back(node_of_[s]);
    backends.push_back(stages_[s].slice.device);
  }
  warnSlowGenerationSplit(job_, model, model_spec_, *daemons_, options_.in_flight, ranges, nodes,
                          backends);
}

void JobRun::resolveTransport() {
  if (job_.transport.empty()) {
    job_.transport = local_ ? "ipc" : "tcp";
    return;
  }
  if (job_.transport != "ipc" || local_) return;
  for (const partitioner::ClusterNode& n : cluster_.nodes)
    if (n.address)
      throw InvalidArgument((job_.transport_where.empty() ? job_.source : job_.transport_where) +
                            ": 'transport: ipc' links processes on one machine, but node '" +
                            n.name + "' is at " + n.address->str() +
                            " (leave 'transport' out, or say tcp)");
}

void JobRun::place(const Model& model) {
  stages_ = jobStages(job_, model, planned_ ? &planned_->stages : nullptr);
  const bool serving = options_.mode != RunMode::kTrain;
  assignments_ = jobAssignments(job_, stages_, options_.mode, options_.spans, model_spec_, "", 0);
  stage_weights_.clear();
  if (weights_) stage_weights_ = stageWeights(assignments_, weights_, model.size());
  if (generates()) {
    TANDEM_CHECK_MSG(job_.chunks == 1, InvalidArgument,
                     job_.source << ": generation runs one model chunk per stage, not "
                                 << job_.chunks << " (interleaved is a training schedule)");
    // One worker per stage, each stage's KV caches its own; the first and the last stage
    // linked for the chosen tokens.
    for (const StagePlacement& st : stages_)
      TANDEM_CHECK_MSG(st.replicas == 1, InvalidArgument,
                       (job_.partition_where.empty() ? job_.source : job_.partition_where)
                           << ": generation runs one worker per stage, but layers ["
                           << st.slice.layers.begin << ", " << st.slice.layers.end << ") have "
                           << st.replicas << " replicas (replicas are for training)");
    const int stages = static_cast<int>(stages_.size());
    for (Assign& a : assignments_) {
      a.in_flight = options_.in_flight;
      if (stages > 1 && a.stage == 0) a.prev_replicas = 1;
      if (stages > 1 && a.stage == stages - 1) a.next_replicas = 1;
    }
  }
  for (Assign& a : assignments_) {
    a.checkpoint.start_step = start_step_;
    a.checkpoint.restore_optimizer = start_step_ > 0;
    if (!serving) a.checkpoint.every_steps = job_.checkpoint.every_steps;
    if (infers()) {  // a stream resumed after a loss: from its first unanswered batch
      a.infer_from = streamResumesAt();
      a.request_rate = options_.request_rate;
    }
  }
  names_.clear();
  for (const Assign& a : assignments_)
    names_.push_back("stage " + std::to_string(a.stage) +
                     (a.replicas > 1 ? " replica " + std::to_string(a.replica) : ""));
  // Links over tcp are CurveZMQ-encrypted with keys from the run's key, so they admit only
  // the run's workers: between a cluster's hosts, and on this machine, where any local
  // process could otherwise connect to them. Over ipc only the user's processes can reach
  // them (PrivateSocketDir), and they stay in the clear.
  for (Assign& a : assignments_) a.encrypt = a.transport == "tcp";
  shares_carried_ = false;
  if (!options_.fork.empty()) return;
  node_of_ = nodeOfSlot(cluster_, assignments_, stages_);
  for (size_t i = 0; i < assignments_.size(); ++i)
    assignments_[i].bind_host = cluster_.nodes[static_cast<size_t>(node_of_[i])].host;
  shardStateByMemory(assignments_, cluster_, node_of_);
  carryShares();
  // Each worker's device and what it will hold, checked against its node's devices and
  // free memory before any worker starts.
  const std::vector<int64_t> stage_bytes = stageMemory(job_, model, stages_, options_.mode);
  needs_.clear();
  const double state_per_param =  // (f32 parameters: bytes of state per parameter / 4)
      optimizerStatePerParam(job_.train.optimizer.kind, job_.train.optimizer.momentum);
  for (size_t i = 0; i < assignments_.size(); ++i) {
    const Assign& a = assignments_[i];
    const auto state = static_cast<int64_t>(
        4 * state_per_param *
        static_cast<double>(model.paramCount(a.slice.layers.begin, a.slice.layers.end)));
    needs_.push_back({replicaMemory(stage_bytes[static_cast<size_t>(a.stage)], state,
                                    a.train.state_shares, a.replica),
                      a.slice.device, names_[i]});
  }
}

JobRun::~JobRun() = default;

RunResult JobRun::run(const RunCallbacks& callbacks, const std::atomic<int>* interrupt) {
  resume_weights_ = weights_;
  resume_step_ = start_step_;
  const bool recovers = (job_.checkpoint.every_steps > 0 || infers() || generates()) &&
                        options_.fork.empty() && job_.max_restarts > 0;
  for (int restarts = 0;;) {
    try {
      RunResult result = runOnce(callbacks, interrupt);
      if (infers()) checkStreamAnswered(result);
      return result;
    } catch (const NodeRejoins& r) {  // (not a failure: no restart counted)
      if (interrupt && interrupt->load() != 0) throw Interrupted("the run was interrupted");
      rejoin(r.name);
    } catch (const WorkerLost& e) {
      if (!recovers || restarts == job_.max_restarts) throw;
      if (interrupt && interrupt->load() != 0) throw;
      ++restarts;
      const auto t0 = std::chrono::steady_clock::now();
      const std::string lost =
          cluster_.nodes.at(static_cast<size_t>(node_of_.at(static_cast<size_t>(e.slot)))).name;
      spdlog::warn("{}", e.what());
      const int64_t resumed = generates() ? ledger_->resume() : 0;
      const std::string from =
          generates() ? std::to_string(resumed) + " sequence" + (resumed == 1 ? "" : "s") +
                            " in flight (each prefilled again from its prompt and the tokens "
                            "it has)"
          : infers() ? "the stream from sample " + std::to_string(streamResumesAt()) + " (" +
                           std::to_string(totals_.requests) + " requests answered)"
          : resume_step_ > 0 ? "from step " + std::to_string(resume_step_)
                             : "from the start";
      spdlog::warn(
          "recovering ({} of {} restarts): node '{}' is left out; resuming {} on the {} nodes "
          "left",
          restarts, job_.max_restarts, lost, from, cluster_.nodes.size() - 1);
      leaveOut(e.slot);
      changed_at_ = t0;
      change_ = "the loss was seen";
      spdlog::info("re-placed in {:.3f} s: {} stages on {}",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                   stages_.size(), nodeList(cluster_));
    }
  }
}

void JobRun::leaveOut(int slot) {
  const std::string lost =
      cluster_.nodes.at(static_cast<size_t>(node_of_.at(static_cast<size_t>(slot)))).name;
  auto on = [&](const std::string& where) { return where.substr(0, where.find('/')) == lost; };
  LeftOut out;
  for (const partitioner::ClusterNode& n : cluster_.nodes)
    if (n.name == lost) out.node = n;
  for (const partitioner::ClusterLink& l : cluster_.between)
    if (on(l.from) || on(l.to)) out.links.push_back(l);
  std::erase_if(cluster_.nodes, [&](const partitioner::ClusterNode& n) { return n.name == lost; });
  std::erase_if(cluster_.between,
                [&](const partitioner::ClusterLink& l) { return on(l.from) || on(l.to); });
  if (cluster_.nodes.empty())
    throw Error("no node is left to run on: node '" + lost + "' was the last");
  // (The stages placed on the nodes left, below, may no longer fit them: the plan or the
  // launcher says which stage and where, and the run ends.)
  // Tried again after the back-off: nodes with addresses (a local node's daemon was
  // this run's own), in a training run with checkpoints to rejoin at.
  const int losses = ++losses_[lost];
  if (job_.rejoin_after_s > 0 && !local_ && !infers() && job_.checkpoint.every_steps > 0) {
    const double wait = backOff(lost);
    out.retry_at = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(wait));
    left_out_.push_back(std::move(out));
    spdlog::info(
        "membership: node '{}' left (lost {} time{}); tried again at a checkpoint after "
        "{:.1f} s",
        lost, losses, losses == 1 ? "" : "s", wait);
  } else {
    spdlog::info("membership: node '{}' left (lost {} time{})", lost, losses,
                 losses == 1 ? "" : "s");
  }
  replace();
}

void JobRun::replace() {
  const Model model(parseModelSpec(model_spec_, job_.model));
  // The daemons of the nodes there are (for a cluster without addresses, fresh local ones).
  daemons_.reset();
  daemons_ = std::make_unique<ClusterDaemons>(cluster_, options_.key, options_.tandemd);
  weights_ = resume_weights_;
  start_step_ = resume_step_;
  if (job_.auto_partition) {
    planned_ = plan(job_, model);
    // Interleaved stages whose survivors are one device run it with 1F1B.
    job_.train.schedule = planned_->schedule;
    job_.chunks = planned_->chunks;
  } else if (job_.plan.empty() && options_.mode == RunMode::kTrain) {
    replanOwnRanges(model);
  }
  place(model);
}

PlannedJob JobRun::plan(const JobSpec& job, const Model& model) const {
  return generates() ? planGenerationJob(job, model, model_spec_, *daemons_, options_.in_flight)
                     : planJob(job, model, model_spec_, *daemons_);
}

void JobRun::replanOwnRanges(const Model& model) {
  job_.train.schedule = given_schedule_;
  job_.chunks = given_chunks_;
  if (cluster_.nodes.size() == node_order_.size()) {
    planned_.reset();
    return;
  }
  JobSpec j = job_;
  j.auto_partition = true;
  j.ranges.clear();
  if (j.partition_where.empty()) j.partition_where = job_.source;
  const std::string nodes = std::to_string(cluster_.nodes.size()) + " node" +
                            (cluster_.nodes.size() == 1 ? "" : "s") + " left (" +
                            nodeList(cluster_) + ")";
  try {
    planned_ = plan(j, model);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument("the " + nodes + " cannot hold the job's stages: " + e.what());
  }
  job_.train.schedule = planned_->schedule;
  job_.chunks = planned_->chunks;
  std::string ranges;
  for (const partitioner::PlanStageSpec& st : planned_->stages)
    ranges += (ranges.empty() ? "" : ", ") + std::string("[") + std::to_string(st.begin) + ", " +
              std::to_string(st.end) + ") " + st.devices.front();
  spdlog::info("partition: the job's {} re-planned by the partitioner over the {}: {}",
               job_.ranges.empty() ? "equal split" : "layer ranges", nodes, ranges);
}

double JobRun::backOff(const std::string& node) const {
  const auto it = losses_.find(node);
  const int losses = it == losses_.end() ? 1 : it->second;
  return job_.rejoin_after_s * std::pow(2.0, std::min(losses - 1, 20));
}

int64_t JobRun::streamResumesAt() const {
  return next_answer_ / job_.train.batch * job_.train.batch;
}

void JobRun::offerRejoin(int64_t step) {
  using Clock = std::chrono::steady_clock;
  if (probe_.valid()) {
    if (probe_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
    const std::string name = std::exchange(probing_, "");
    const bool back = probe_.get();
    for (LeftOut& l : left_out_) {
      if (l.node.name != name) continue;
      if (back) throw NodeRejoins(name, step);
      const double wait = backOff(name);
      l.retry_at = Clock::now() +
                   std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait));
      spdlog::info("membership: node '{}' does not answer yet; tried again after {:.1f} s", name,
                   wait);
    }
    return;
  }
  for (const LeftOut& l : left_out_) {
    if (l.retry_at > Clock::now()) continue;
    probing_ = l.node.name;
    probe_ = std::async(std::launch::async, daemonAnswers, cluster_, l.node, options_.key);
    return;
  }
}

void JobRun::rejoin(const std::string& name) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto it = std::find_if(left_out_.begin(), left_out_.end(),
                               [&](const LeftOut& l) { return l.node.name == name; });
  TANDEM_CHECK_MSG(it != left_out_.end(), InvalidArgument, "node '" << name << "' is not left out");
  cluster_.nodes.push_back(it->node);
  cluster_.between.insert(cluster_.between.end(), it->links.begin(), it->links.end());
  left_out_.erase(it);
  auto rank = [&](const partitioner::ClusterNode& n) {
    return std::find(node_order_.begin(), node_order_.end(), n.name) - node_order_.begin();
  };
  std::stable_sort(cluster_.nodes.begin(), cluster_.nodes.end(),
                   [&](const partitioner::ClusterNode& a, const partitioner::ClusterNode& b) {
                     return rank(a) < rank(b);
                   });
  replace();
  changed_at_ = t0;
  change_ = "node '" + name + "' rejoined";
  spdlog::info("membership: node '{}' rejoins at the checkpoint at step {}: {} stages on {}", name,
               resume_step_, stages_.size(), nodeList(cluster_));
}

RunResult JobRun::runOnce(const RunCallbacks& callbacks, const std::atomic<int>* interrupt) {
  RunOptions ro;
  // (A generation run waits for prompts as long as they take: its stages keep each other
  // alive, and every channel has heartbeats.)
  if (!generates()) ro.silence = std::chrono::seconds(2 * job_.wire.timeout_s + 30);
  ro.interrupt = interrupt;
  ro.prompts = ledger_.get();
  ro.weights = stage_weights_;
  std::unique_ptr<Launcher> launcher;
  if (!options_.fork.empty()) {
    launcher =
        processLauncher(options_.fork.front(), {options_.fork.begin() + 1, options_.fork.end()});
  } else {
    if (daemons_->remote()) ro.listen = "0.0.0.0:0";
    launcher = daemonLauncher(daemons_->nodes(), node_of_, daemons_->key(),
                              std::chrono::seconds(10), needs_);
  }
  RunCallbacks cb = callbacks;
  // After a recovery: how long from seeing the loss to training (answering) again, and
  // where that time went.
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  const Clock::time_point launched = Clock::now();
  Clock::time_point started = launched, wired = launched;
  size_t starts = 0;
  bool again = false;
  auto firstAgain = [&](const char* what) {
    if (again || !changed_at_) return;
    again = true;
    const Clock::time_point now = Clock::now();
    spdlog::info(
        "{} again {:.3f} s after {}: re-placement {:.3f} s, workers started "
        "{:.3f} s, connected with {:.1f} MB of weights and stages built {:.3f} s, first {} "
        "{:.3f} s",
        what, since(*changed_at_, now), change_, since(*changed_at_, launched),
        since(launched, started), weights_ ? static_cast<double>(weights_->size()) / 1e6 : 0.0,
        since(started, wired),
        infers()      ? "request"
        : generates() ? "token"
                      : "step",
        since(wired, now));
  };
  cb.started = [&](int slot, int64_t pid) {
    if (++starts == assignments_.size()) started = Clock::now();
    if (callbacks.started) callbacks.started(slot, pid);
  };
  cb.wired = [&] {
    wired = Clock::now();
    if (callbacks.wired) callbacks.wired();
  };
  cb.progress = [&](const Progress& p) {
    firstAgain("training");
    if (callbacks.progress) callbacks.progress(p);
  };
  if (generates()) {
    cb.token = [&](const Token& t) {
      firstAgain("generating");
      const Token numbered = ledger_->answered(t);
      if (callbacks.token) callbacks.token(numbered);
    };
  }
  if (infers()) {
    cb.answer = [&](const Answer& a) {
      firstAgain("answering");
      answer(a, callbacks);
    };
  }
  if (job_.checkpoint.every_steps > 0 && !infers() && !generates())
    cb.checkpoint = [&](int64_t step, const std::vector<std::vector<uint8_t>>& slices,
                        const std::vector<double>& shares) {
      checkpoint(step, slices, shares);
      if (callbacks.checkpoint) callbacks.checkpoint(step, slices, shares);
    };
  return coordinate(assignments_, names_, *launcher, cb, ro);
}

void JobRun::answer(const Answer& a, const RunCallbacks& callbacks) {
  if (a.first < next_answer_ || ahead_.count(a.first) != 0) {
    ++totals_.repeated;  // answered before the loss, and again after
    return;
  }
  ahead_.emplace(a.first, a);
  for (auto it = ahead_.begin(); it != ahead_.end() && it->first == next_answer_;
       it = ahead_.erase(it)) {
    const Answer& next = it->second;
    next_answer_ += next.count;
    ++totals_.requests;
    totals_.samples += next.count;
    totals_.correct += next.correct;
    totals_.loss_sum += next.loss_sum;
    if (callbacks.answer) callbacks.answer(next);
  }
}

void JobRun::checkStreamAnswered(const RunResult& result) const {
  int64_t samples = 0;
  for (size_t i = 0; i < assignments_.size(); ++i)
    if (assignments_[i].stage == 0) samples = result.ready[i].test_samples;
  if (next_answer_ != samples || !ahead_.empty())
    throw Error("the stream ended with samples [" + std::to_string(next_answer_) + ", " +
                std::to_string(samples) + ") of " + std::to_string(samples) + " unanswered");
}

}  // namespace tandem::runtime
