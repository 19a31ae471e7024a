#include "targets/runtime/job_run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/file.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "targets/runtime/node_info.h"
#include "targets/runtime/weight_cache.h"

namespace tandem::runtime {

namespace {

// The job's starting weights, if it names any: read and checked (a bad file is named
// here, once), to be named by their content hash for the workers to fetch.
std::shared_ptr<const std::vector<uint8_t>> startingWeights(const JobSpec& job) {
  if (job.weights.empty()) return nullptr;
  const std::string text = readFile(job.weights, "weights");
  auto bytes = std::make_shared<std::vector<uint8_t>>(text.begin(), text.end());
  parseModelFile(*bytes, job.weights);
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

}  // namespace

JobRun::JobRun(JobSpec job, JobRunOptions options)
    : job_(std::move(job)), options_(std::move(options)) {
  if (!job_.save.empty() && !options_.infer) prepareSave(job_.save);
  model_spec_ = readFile(job_.model, "model spec");  // read once: placed, shipped, merged
  const Model model(parseModelSpec(model_spec_, job_.model));
  weights_ = startingWeights(job_);
  if (!options_.resume.empty()) {  // the checkpoint's weights and step, checked against the job
    TANDEM_CHECK_MSG(!options_.infer, InvalidArgument, "--resume continues training, not infer");
    std::optional<Checkpoint> c = newestCheckpoint(options_.resume);
    if (!c) throw InvalidArgument("no usable checkpoint in '" + options_.resume + "'");
    checkResumable(*c, checkpointJob(job_, model_spec_), job_.source);
    if (weights_)
      spdlog::warn("{} names 'weights', but the run resumes from {}", job_.source, c->model_path);
    parseModelFile(c->model, c->model_path);
    weights_ = std::make_shared<const std::vector<uint8_t>>(std::move(c->model));
    start_step_ = c->step;
    spdlog::info("resuming from {} (step {})", c->model_path, c->step);
  }
  const std::string cluster_path = !options_.cluster.empty() ? options_.cluster : job_.cluster;
  cluster_ = !cluster_path.empty() ? partitioner::loadCluster(cluster_path)
                                   : localCluster(1, job_.threads);
  local_ = std::none_of(cluster_.nodes.begin(), cluster_.nodes.end(),
                        [](const partitioner::ClusterNode& n) { return n.address.has_value(); });
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
    planned_ = planJob(job_, model, *daemons_);
    place(model);
  }
}

void JobRun::place(const Model& model) {
  stages_ = jobStages(job_, model, planned_ ? planned_->yaml : "");
  assignments_ = jobAssignments(job_, stages_, options_.infer, options_.spans, model_spec_,
                                weights_ ? contentHash(*weights_) : "",
                                weights_ ? static_cast<int64_t>(weights_->size()) : 0);
  for (Assign& a : assignments_) {
    a.start_step = start_step_;
    a.restore_optimizer = start_step_ > 0;
    if (!options_.infer) a.checkpoint_every = job_.checkpoint.every_steps;
    if (options_.infer) {  // a stream resumed after a loss: from its first unanswered batch
      a.infer_from = next_answer_ / job_.batch * job_.batch;
      a.request_rate = options_.request_rate;
    }
  }
  names_.clear();
  for (const Assign& a : assignments_)
    names_.push_back("stage " + std::to_string(a.stage) +
                     (a.replicas > 1 ? " replica " + std::to_string(a.replica) : ""));
  if (!options_.fork.empty()) return;
  node_of_ = nodeOfSlot(cluster_, assignments_, stages_);
  for (size_t i = 0; i < assignments_.size(); ++i) {
    Assign& a = assignments_[i];
    a.bind_host = cluster_.nodes[static_cast<size_t>(node_of_[i])].host;
    // Links between a cluster's hosts: CurveZMQ, keys from the run's key.
    a.encrypt = !local_;
  }
  // Each worker's device and what it will hold, checked against its node's devices and
  // free memory before any worker starts.
  const std::vector<int64_t> stage_bytes = stageMemory(job_, model, stages_, options_.infer);
  needs_.clear();
  for (size_t i = 0; i < assignments_.size(); ++i)
    needs_.push_back({stage_bytes[static_cast<size_t>(assignments_[i].stage)],
                      assignments_[i].device, names_[i]});
}

JobRun::~JobRun() = default;

RunResult JobRun::run(const RunCallbacks& callbacks, const std::atomic<int>* interrupt) {
  resume_weights_ = weights_;
  resume_step_ = start_step_;
  const bool recovers = (job_.checkpoint.every_steps > 0 || options_.infer) &&
                        options_.fork.empty() && job_.max_restarts > 0;
  for (int restarts = 0;; ++restarts) {
    try {
      RunResult result = runOnce(callbacks, interrupt);
      if (options_.infer) checkStreamAnswered(result);
      return result;
    } catch (const WorkerLost& e) {
      if (!recovers || restarts == job_.max_restarts) throw;
      if (interrupt && interrupt->load() != 0) throw;
      const auto t0 = std::chrono::steady_clock::now();
      const std::string lost =
          cluster_.nodes.at(static_cast<size_t>(node_of_.at(static_cast<size_t>(e.slot)))).name;
      spdlog::warn("{}", e.what());
      const std::string from =
          options_.infer
              ? "the stream from sample " + std::to_string(next_answer_ / job_.batch * job_.batch) +
                    " (" + std::to_string(totals_.requests) + " requests answered)"
          : resume_step_ > 0 ? "step " + std::to_string(resume_step_)
                             : "the start";
      spdlog::warn(
          "recovering ({} of {} restarts): node '{}' is left out; resuming {} on the {} nodes "
          "left",
          restarts + 1, job_.max_restarts, lost, (options_.infer ? "" : "from ") + from,
          cluster_.nodes.size() - 1);
      leaveOut(e.slot);
      lost_at_ = t0;
      spdlog::info("re-placed in {:.3f} s: {} stages on {}",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                   stages_.size(), [&] {
                     std::string nodes;
                     for (const auto& n : cluster_.nodes)
                       nodes += (nodes.empty() ? "" : ", ") + n.name;
                     return nodes;
                   }());
    }
  }
}

void JobRun::leaveOut(int slot) {
  const std::string lost =
      cluster_.nodes.at(static_cast<size_t>(node_of_.at(static_cast<size_t>(slot)))).name;
  auto on = [&](const std::string& where) { return where.substr(0, where.find('/')) == lost; };
  std::erase_if(cluster_.nodes, [&](const partitioner::ClusterNode& n) { return n.name == lost; });
  std::erase_if(cluster_.between,
                [&](const partitioner::ClusterLink& l) { return on(l.from) || on(l.to); });
  if (cluster_.nodes.empty())
    throw Error("no node is left to run on: node '" + lost + "' was the last");
  const Model model(parseModelSpec(model_spec_, job_.model));
  // The daemons of the nodes left (for a cluster without addresses, fresh local ones).
  daemons_.reset();
  daemons_ = std::make_unique<ClusterDaemons>(cluster_, options_.key, options_.tandemd);
  weights_ = resume_weights_;
  start_step_ = resume_step_;
  if (job_.auto_partition) planned_ = planJob(job_, model, *daemons_);
  place(model);
}

RunResult JobRun::runOnce(const RunCallbacks& callbacks, const std::atomic<int>* interrupt) {
  RunOptions ro;
  ro.silence = std::chrono::seconds(2 * job_.timeout_s + 30);
  ro.interrupt = interrupt;
  if (weights_) ro.weights[assignments_.front().weights_hash] = weights_;
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
  if (lost_at_) {  // after a recovery: how long from the loss to training again
    cb.progress = [&, first = true](const Progress& p) mutable {
      if (first) {
        first = false;
        spdlog::info(
            "training again {:.3f} s after the loss was seen (re-placement, weights, "
            "workers' start, one step)",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - *lost_at_).count());
      }
      if (callbacks.progress) callbacks.progress(p);
    };
  }
  if (options_.infer) {
    cb.answer = [&, first = true](const Answer& a) mutable {
      if (first && lost_at_) {
        spdlog::info(
            "answering again {:.3f} s after the loss was seen (re-placement, weights, "
            "workers' start, one request)",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - *lost_at_).count());
      }
      first = false;
      answer(a, callbacks);
    };
  }
  if (job_.checkpoint.every_steps > 0 && !options_.infer)
    cb.checkpoint = [&](int64_t step, const std::vector<std::vector<uint8_t>>& slices) {
      checkpoint(step, slices);
      if (callbacks.checkpoint) callbacks.checkpoint(step, slices);
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

void JobRun::checkpoint(int64_t step, const std::vector<std::vector<uint8_t>>& slices) {
  const auto t0 = std::chrono::steady_clock::now();
  auto model = std::make_shared<const std::vector<uint8_t>>(merge(slices));
  writeCheckpoint(job_.checkpoint.dir, step, *model, checkpointJob(job_, model_spec_),
                  job_.checkpoint.keep);
  resume_weights_ = model;
  resume_step_ = step;
  char name[32];
  std::snprintf(name, sizeof name, "step-%012lld.tdm", static_cast<long long>(step));
  last_checkpoint_ = (std::filesystem::path(job_.checkpoint.dir) / name).string();
  spdlog::info("checkpoint at step {}: {} ({:.1f} MB, {:.3f} s)", step, last_checkpoint_,
               static_cast<double>(model->size()) / 1e6,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

std::vector<uint8_t> JobRun::merge(const std::vector<std::vector<uint8_t>>& slices) const {
  cpu::CpuBackend be;
  Model model(parseModelSpec(model_spec_, job_.model));
  model.build(be, job_.seed);
  std::vector<std::pair<std::string, Tensor>> state;
  int64_t steps = 0;
  ModelFile all;
  for (size_t i = 0; i < slices.size(); ++i) {
    if (slices[i].empty()) continue;
    const ModelFile f = parseModelFile(slices[i], names_[i] + "'s trained slice");
    all.params.insert(all.params.end(), f.params.begin(), f.params.end());
    if (f.optimizer) {
      steps = f.optimizer->steps;
      for (const HostTensor& t : f.optimizer->tensors)
        state.push_back({t.name, toDevice(be, t.shape, t.data)});
    }
  }
  loadWeights(model, all, true);  // every parameter, from exactly one stage
  Optimizer optimizer(be, job_.optimizer);
  optimizer.restore(state, steps);
  return serializeModel(model, &optimizer, {{"seed", static_cast<int64_t>(job_.seed)}});
}

void JobRun::save(const RunResult& result) const {
  writeFileAtomically(job_.save, merge(result.slices), 0666);
}

}  // namespace tandem::runtime
