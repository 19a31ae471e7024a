#include "runtime/worker/stage_worker.h"

#include <spdlog/spdlog.h>

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <iostream>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"
#include "core/error.h"
#include "core/host_limits.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "core/pipeline/stage_decoder.h"
#include "core/pipeline/stage_trainer.h"
#include "hf/text_codec.h"
#include "runtime/control/handshake.h"
#include "runtime/node/chunks.h"
#include "runtime/node/link_rules.h"
#include "runtime/node/node_info.h"
#include "runtime/node/weight_cache.h"
#include "runtime/worker/replica_group.h"
#include "runtime/worker/stage_generation.h"
#include "runtime/worker/tensor_ranks.h"
#include "transport/socket_link.h"

namespace tandem::runtime {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The next message, which must be a `T`; a `leave` or anything else is an error naming
// what came instead.
template <typename T>
T expect(Channel& c, std::chrono::milliseconds timeout, const char* what) {
  const std::optional<Message> m = c.recv(timeout);
  if (!m)
    throw Timeout("no " + std::string(what) + " from the coordinator at " + c.peer() + " within " +
                  std::to_string(timeout.count() / 1000) + " s");
  if (const auto* v = std::get_if<T>(&*m)) return *v;
  if (const auto* l = std::get_if<Leave>(&*m))
    throw Error("the coordinator stopped the stage: " + l->reason);
  throw FormatError("the coordinator sent '" + std::string(messageName(*m)) + "' where " + what +
                    " was due");
}

// The starting weights of `a`: from the cache, else from the coordinator (then cached).
std::vector<uint8_t> startingWeights(Channel& coordinator, const Assign& a, const WorkerOptions& o,
                                     StageReport& report) {
  std::unique_ptr<WeightCache> cache;
  std::unique_ptr<FolderLock> turn;
  if (!o.cache_dir.empty()) {
    cache = std::make_unique<WeightCache>(o.cache_dir, o.cache_max_bytes);
    turn = std::make_unique<FolderLock>(cache->dir());
    if (auto cached = cache->get(a.weights_hash, &report.weights_corrupted)) {
      report.weights_cached = true;
      return *cached;
    }
  }
  const auto t0 = Clock::now();
  coordinator.send(WeightsRequest{a.weights_hash});
  ChunkGatherer weights("the starting weights", a.weights_hash, a.weights_bytes);
  while (!weights.add(
      expect<WeightsChunk>(coordinator, std::chrono::seconds(a.wire.timeout_s), "weights"))) {
  }
  std::vector<uint8_t> bytes = weights.take();
  report.weights_shipped = static_cast<int64_t>(bytes.size());
  report.weights_ship_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (cache) cache->put(a.weights_hash, bytes);
  return bytes;
}

// The replicas' shares a checkpoint carries: when they are of the whole model and settled
// (a tensor-split stage has no replicas).
std::vector<double> checkpointShares(const Assign& a, const StageTrainer& trainer) {
  if (a.stages == 1 && a.replicas > 1 && trainer.sharesSettled()) return trainer.shares();
  return {};
}
std::vector<double> checkpointShares(const Assign&, const TensorStage&) { return {}; }

// Whether the stage's replicas shard its training state (a tensor-split stage has none).
bool sharded(StageTrainer& trainer) { return trainer.executor().sharded(); }
bool sharded(TensorStage&) { return false; }

// The stage's counters now: its executor's, or each tensor rank's (rank 0 first).
std::vector<StageCounters> rankCounters(StageTrainer& trainer) {
  return {trainer.executor().counters()};
}
std::vector<StageCounters> rankCounters(TensorStage& stage) {
  std::vector<StageCounters> out;
  for (int r = 0; r < stage.ranks(); ++r) out.push_back(stage.executor(r).counters());
  return out;
}

// Adds what an epoch took (`after` less `before`) to `into` (peak_stash aside).
void addEpoch(StageCounters& into, const StageCounters& before, const StageCounters& after) {
  into.busy_s += after.busy_s - before.busy_s;
  into.step_s += after.step_s - before.step_s;
  into.compute_cpu_s += after.compute_cpu_s - before.compute_cpu_s;
  into.recv_wait_s += after.recv_wait_s - before.recv_wait_s;
  into.send_s += after.send_s - before.send_s;
  into.allreduce_s += after.allreduce_s - before.allreduce_s;
  into.microbatches += after.microbatches - before.microbatches;
  into.samples += after.samples - before.samples;
}

// After its report a worker keeps its links open until the coordinator has every report
// and says `leave` (or its channel ends, or `limit` passes): the last messages a stage
// sent may still be on their way to the next, and ZeroMQ drops what an ipc socket still
// queues when it closes under the receiver's high-water mark (libzmq #4660, LINGER
// notwithstanding) — a stream's last microbatches were lost that way.
void awaitRunEnd(Channel& coordinator, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  try {
    while (Clock::now() < deadline) {
      const std::optional<Message> m = coordinator.recv(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
      if (!m || std::holds_alternative<Leave>(*m)) return;
    }
  } catch (const IoError&) {  // the coordinator has gone: so has the run
  }
}

// What a worker builds before its mode's body runs: its layers with their starting
// weights, its links to the neighbouring stages wired as the coordinator's `start` says,
// and on the first stage its data. Members go in reverse order: the links before their
// context before their socket folder, everything holding tensors before the backend.
class StageSetup {
 public:
  StageSetup(Channel& coordinator, const Assign& a, const ClusterKey& run_key,
             const WorkerOptions& o);

  const std::string who;
  std::unique_ptr<Backend> backend;
  // A tensor-split stage's ranks 1.. (rank 0 is `model` on `backend`); null when unsplit.
  std::unique_ptr<TensorRanks> tensor;
  std::optional<Model> model;
  std::vector<LayerRange> chunks;  // the layers built: one range, or an interleaved stage's
  std::optional<Optimizer> optimizer;
  StageReport report;
  // Unix sockets (transport: ipc) live in a folder only this user can enter: Linux's
  // abstract names, which any local process may connect to, would let another user feed
  // the run activations.
  std::optional<PrivateSocketDir> socket_dir;
  transport::Context ctx;
  // Encrypted runs: the stages' links are sealed with the link key derived from the run's
  // key, and a replica group's ZeroMQ links hold the key pair derived from it, so each
  // admits exactly the run's other workers.
  DataPlaneKeys curve;
  std::optional<transport::LinkKey> link_key;
  // One link to each replica of each neighbouring stage: the previous stage's carry
  // gradients out, the next stage's activations. (Generating or interleaved, the first
  // stage's prev is the last stage, and the last's next the first.)
  std::vector<std::unique_ptr<transport::SocketLink>> prev_links, next_links;
  std::unique_ptr<ReplicaLinks> prev, next;
  // A replicated stage's group (replicaGroup), kept like the links until the run is over;
  // `group_host` is where an encrypted group receives.
  cpu::CpuBackend group_host{cpu::CpuOptions{1}};
  std::unique_ptr<Group> group;
  Dataset train, test;  // the first stage's
  // How text data becomes tokens: the tokenizer the starting weights' model file keeps (a
  // Hugging Face import's), else bytes.
  TextTokens text_tokens;
  Start start;

  // The stage's slice (weights, optimizer state) as model file bytes: its model's, a tensor
  // split's ranks' merged, a sharded stage's with the state gathered (every replica calls).
  std::vector<uint8_t> sliceBytes(StageTrainer& trainer) const {
    if (!trainer.executor().sharded()) return serializeModel(*model, &*optimizer, {});
    const auto whole = trainer.executor().gatherOptimizerState();
    Optimizer merged(*backend, optimizer->options());
    merged.restore(whole, optimizer->steps());
    return serializeModel(*model, &merged, {});
  }
  std::vector<uint8_t> sliceBytes(TensorStage&) const { return tensor->mergedSlice(); }
  // Sends the slice at a checkpoint after `steps` steps: chunks, then `checkpointed`.
  template <typename Stage>
  void sendCheckpoint(Channel& coordinator, const Assign& a, Stage& trainer, int64_t steps,
                      std::vector<double> shares) const {
    const std::vector<uint8_t> slice = sliceBytes(trainer);
    if (!sendsCheckpoints(a)) return;  // (a sharded stage's other replicas: they gave theirs)
    const std::string hash = contentHash(slice);
    const std::chrono::seconds timeout(a.wire.timeout_s);
    sendChunks(coordinator, hash, slice, timeout);
    coordinator.send(
        Checkpointed{steps, hash, static_cast<int64_t>(slice.size()), std::move(shares)}, timeout);
  }

  // The bytes the links moved, into the report.
  void countLinkBytes() {
    for (const auto* links : {&prev_links, &next_links})
      for (const auto& l : *links) {
        report.bytes_sent += l->stats().bytes_sent_wire;
        report.bytes_received += l->stats().bytes_received_wire;
      }
  }

 private:
  void buildLayers(Channel& coordinator, const Assign& a, const WorkerOptions& o);
  void openLinks(const Assign& a, Ready& ready);
  void readData(const Assign& a, const WorkerOptions& o, Ready& ready);
  std::unique_ptr<ReplicaLinks> connect(const Assign& a, const char* side,
                                        const std::vector<std::string>& endpoints,
                                        std::vector<std::unique_ptr<transport::SocketLink>>& links);
};

StageSetup::StageSetup(Channel& coordinator, const Assign& a, const ClusterKey& run_key,
                       const WorkerOptions& o)
    : who("stage " + std::to_string(a.stage) +
          (a.replicas > 1 ? " replica " + std::to_string(a.replica) : "")),
      curve(a.encrypt ? dataPlaneKeys(run_key) : DataPlaneKeys{}) {
  if (a.encrypt) link_key = dataPlaneLinkKey(run_key);
  buildLayers(coordinator, a, o);
  Ready ready;
  openLinks(a, ready);
  readData(a, o, ready);
  ready.device = backend->info().name;
  coordinator.send(ready);
  start = expect<Start>(coordinator, std::chrono::seconds(a.wire.timeout_s), "start");
  prev = connect(a, "prev", start.prev, prev_links);
  next = connect(a, "next", start.next, next_links);
}

void StageSetup::buildLayers(Channel& coordinator, const Assign& a, const WorkerOptions& o) {
  const ModelSpec spec = parseModelSpec(a.model_spec, a.job + " (assigned model)");
  const auto [begin, end] = a.slice.layers;
  report.start_rss_bytes = peakRssBytes();
  // No more threads than the node's CPU quota grants: the rest would only take turns at it.
  const int threads = usableThreads(a.slice.threads, cpuLimit());
  if (threads < a.slice.threads)
    spdlog::info("{}: {} threads, not {}: this node's CPU quota grants {:.2f} cores", who, threads,
                 a.slice.threads, cpuLimit().quota_cores);
  backend = makeBackend(a.slice.device, BackendOptions{threads});
  model.emplace(spec);
  TANDEM_CHECK_MSG(
      end <= model->size(), InvalidArgument,
      who << ": layers [" << begin << ", " << end << ") but the model has " << model->size());
  if (a.slice.tensor > 1) tensor = std::make_unique<TensorRanks>(spec, a, threads, *model, who);
  // An interleaved stage builds its chunks only.
  chunks = a.slice.chunks.empty() ? std::vector<LayerRange>{a.slice.layers} : a.slice.chunks;
  model->build(*backend, a.train.seed, chunks);
  optimizer.emplace(*backend, a.train.optimizer);
  if (tensor) {
    tensor->setRank0(*optimizer);
    spdlog::info("{}: {}", who, tensor->describe());
  }
  if (a.weights_hash.empty()) return;
  const ModelFile start_from =
      parseModelFile(startingWeights(coordinator, a, o, report), who + "'s starting weights");
  if (a.stage == 0)
    text_tokens = hf::textTokensFor(start_from, *model, a.data.name, start_from.spec.name);
  if (tensor) {
    tensor->startFrom(start_from, a.checkpoint.restore_optimizer, who);
    return;
  }
  loadWeights(*model, start_from, false);
  if (a.checkpoint.restore_optimizer) restoreOptimizerState(*optimizer, *model, start_from, who);
}

void StageSetup::openLinks(const Assign& a, Ready& ready) {
  const bool ipc = a.transport == "ipc";
  if (ipc)
    socket_dir.emplace();
  else
    checkBindHost(a.bind_host);
  int endpoint_count = 0;
  auto linkOptions = [&](WireCodec codec, int peer) {
    transport::LinkOptions lo;
    lo.bind = ipc ? "ipc://" + socket_dir->path() + "/l" + std::to_string(endpoint_count++)
                  : "tcp://" + a.bind_host + ":*";
    lo.codec = codec;
    lo.timeout = std::chrono::seconds(a.wire.timeout_s);
    lo.stage = a.stage;
    lo.peer_stage = peer;
    return lo;
  };
  for (int i = 0; i < a.prev_replicas; ++i) {
    prev_links.push_back(std::make_unique<transport::SocketLink>(
        linkOptions(a.wire.gradients, (a.stage + a.stages - 1) % a.stages), link_key));
    ready.prev.push_back(prev_links.back()->endpoint());
  }
  for (int j = 0; j < a.next_replicas; ++j) {
    next_links.push_back(std::make_unique<transport::SocketLink>(
        linkOptions(a.wire.activations, (a.stage + 1) % a.stages), link_key));
    ready.next.push_back(next_links.back()->endpoint());
  }
}

// Every replica of the first stage reads the data (generation's first stage takes
// prompts instead); text data in windows of the model's context, the training ones drawn
// from the seed.
void StageSetup::readData(const Assign& a, const WorkerOptions& o, Ready& ready) {
  if (a.stage != 0) return;
  if (a.mode == RunMode::kGenerate) {
    ready.train_samples = ready.test_samples = 0;  // (prompts)
    return;
  }
  const Shape input = model->inputShape();
  const int64_t context = input.rank() == 1 ? input[0] : 0;
  const bool infers = a.mode == RunMode::kInfer;
  if (!infers)
    train = loadDataset(a.data.name, a.data.dir, true, a.data.train_limit, context, a.train.seed,
                        o.data, text_tokens);
  test = loadDataset(a.data.name, a.data.dir, false, a.data.test_limit, context, a.train.seed,
                     o.data, text_tokens);
  checkClassifier(*model, test);
  TANDEM_CHECK_MSG(!infers || !test.tokens, Unsupported,
                   "serving a language model's held-out text as a stream is not supported: "
                   "generate text with tandem generate");
  ready.train_samples = infers ? 0 : train.size();
  ready.test_samples = test.size();
}

std::unique_ptr<ReplicaLinks> StageSetup::connect(
    const Assign& a, const char* side, const std::vector<std::string>& endpoints,
    std::vector<std::unique_ptr<transport::SocketLink>>& links) {
  if (endpoints.size() != links.size())
    throw FormatError(who + ": the start message lists " + std::to_string(endpoints.size()) + " '" +
                      side + "' endpoints, not " + std::to_string(links.size()));
  std::vector<Link*> out;
  for (size_t i = 0; i < links.size(); ++i) {
    checkPeerEndpoint(endpoints[i], a.transport);
    links[i]->connect(endpoints[i]);
    out.push_back(links[i].get());
  }
  return out.empty() ? nullptr : std::make_unique<ReplicaLinks>(out);
}

// A training stage's weights, most gradients at once and optimizer state, into its report.
void countState(StageSetup& s, const StageExecutor& executor) {
  StageReport& r = s.report;
  r.weight_bytes = r.state_bytes = 0;
  for (const Param* p : s.model->params()) r.weight_bytes += static_cast<int64_t>(p->value.bytes());
  for (const auto& [key, t] : s.optimizer->state())
    r.state_bytes += static_cast<int64_t>(t.bytes());
  r.gradient_peak_bytes = executor.peakGradientBytes();
}

// An inference stream: every replica of the last stage answers its own requests as they
// come out; the first stage's replicas share the request rate.
// (`Stage`: a StageTrainer, or a TensorStage of a tensor-split stage.)
template <typename Stage>
void infer(Channel& coordinator, const Assign& a, StageSetup& s, Stage& trainer, bool reports) {
  EvalStream stream;
  stream.from = a.infer_from;
  if (a.request_rate > 0)
    stream.interval = std::chrono::microseconds(
        static_cast<int64_t>(1e6 * (a.stage == 0 ? a.replicas : 1) / a.request_rate));
  if (a.stage == a.stages - 1)
    stream.answer = [&](const EvalAnswer& e) {
      coordinator.send(Answer{e.first, e.count, static_cast<int32_t>(e.columns), e.outputs,
                              e.loss_sum, e.correct},
                       std::chrono::seconds(a.wire.timeout_s));
    };
  const auto t0 = Clock::now();
  const EvalResult ev = trainer.evaluate(a.stage == 0 ? &s.test : nullptr, s.start.test_samples,
                                         a.train.batch, stream);
  s.report.run_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (reports) coordinator.send(InferDone{ev.samples, ev.loss, ev.accuracy, s.report.run_s});
  const std::vector<StageCounters> ranks = rankCounters(trainer);
  s.report.counters = ranks.front();
  s.report.tensor_ranks.assign(ranks.begin() + 1, ranks.end());
}

// The training epochs (from a resumed run's step), each followed by an evaluation;
// progress, checkpoints and each epoch's figures go to the coordinator as they come.
template <typename Stage>
void train(Channel& coordinator, const Assign& a, StageSetup& s, Stage& trainer, bool reports) {
  // A resumed run starts where its checkpoint was taken: epoch and step within it.
  const int64_t steps_per_epoch = (s.start.train_samples + a.train.batch - 1) / a.train.batch;
  const int64_t first_epoch = steps_per_epoch > 0 ? a.checkpoint.start_step / steps_per_epoch : 0;
  if (a.checkpoint.start_step > 0) {
    if (first_epoch >= a.train.epochs)
      throw InvalidArgument(s.who + ": asked to resume after step " +
                            std::to_string(a.checkpoint.start_step) + ", past the job's " +
                            std::to_string(a.train.epochs) + " epochs of " +
                            std::to_string(steps_per_epoch) + " steps");
    trainer.resumeAt(a.checkpoint.start_step);
  }
  // Replica 0 of each stage sends its slice every checkpoint.every_steps steps (a sharded
  // stage's other replicas give it their rows' state then).
  const bool checkpoints =
      sendsCheckpoints(a) || (a.checkpoint.every_steps > 0 && sharded(trainer));
  std::vector<double> step_times;  // from one step's end to the next's, within an epoch
  StageCounters& training = s.report.counters;  // the epochs, without the evaluations
  for (int64_t e = first_epoch; e < a.train.epochs; ++e) {
    auto sent = Clock::now() - 1h;
    std::optional<Clock::time_point> last_step;
    auto progress = [&](const StepReport& r) {
      const auto now = Clock::now();
      if (last_step && r.step < r.steps)
        step_times.push_back(std::chrono::duration<double>(now - *last_step).count());
      last_step = now;
      if (checkpoints && trainer.stepsTaken() % a.checkpoint.every_steps == 0)
        s.sendCheckpoint(coordinator, a, trainer, trainer.stepsTaken(),
                         checkpointShares(a, trainer));
      if (!reports || (Clock::now() - sent < 250ms && r.step < r.steps)) return;
      sent = Clock::now();
      coordinator.send(Progress{r.epoch, r.step, r.steps, r.loss, r.samples_per_s, r.elapsed_s});
    };
    const std::vector<StageCounters> before = rankCounters(trainer);
    const double cpu_before = processCpuSeconds();
    const int64_t first_step =
        e == first_epoch ? a.checkpoint.start_step - first_epoch * steps_per_epoch : 0;
    const EpochReport r = trainer.trainEpoch(a.stage == 0 ? &s.train : nullptr,
                                             s.start.train_samples, e, progress, first_step);
    const std::vector<StageCounters> after = rankCounters(trainer);
    s.report.tensor_ranks.resize(after.size() - 1);
    for (size_t rank = 0; rank < after.size(); ++rank)
      addEpoch(rank == 0 ? training : s.report.tensor_ranks[rank - 1], before[rank], after[rank]);
    s.report.run_s += r.seconds;
    s.report.process_cpu_s += processCpuSeconds() - cpu_before;
    const EvalResult ev =
        trainer.evaluate(a.stage == 0 ? &s.test : nullptr, s.start.test_samples, a.train.batch);
    if (reports)
      coordinator.send(
          EpochDone{e, r.train_loss, r.seconds, r.samples_per_s, ev.loss, ev.accuracy});
  }
  if (!step_times.empty()) {
    double sum = 0;
    for (const double t : step_times) sum += t;
    s.report.step_mean_s = sum / static_cast<double>(step_times.size());
    s.report.steps_timed = static_cast<int64_t>(step_times.size());
  }
}

// The mode's body over the stage (a StageTrainer, or a tensor-split stage's TensorStage),
// then what the report says of its executor (rank 0's), and the trained slice.
template <typename Stage>
void runMode(Channel& coordinator, const Assign& a, StageSetup& s, Stage& trainer) {
  // Replicas of the last stage all hold the step's whole loss; the first reports it.
  const bool reports = a.stage == a.stages - 1 && a.replica == 0;
  if (a.mode == RunMode::kInfer)
    infer(coordinator, a, s, trainer, reports);
  else
    train(coordinator, a, s, trainer, reports);
  const std::vector<StageCounters> ranks = rankCounters(trainer);
  s.report.counters.peak_stash = ranks.front().peak_stash;
  s.report.tensor_ranks.resize(ranks.size() - 1);
  for (size_t rank = 1; rank < ranks.size(); ++rank)
    s.report.tensor_ranks[rank - 1].peak_stash = ranks[rank].peak_stash;
  s.report.peak_rss_bytes = peakRssBytes();
  s.report.peak_tensor_bytes = s.backend->memoryUse().peak;
  if constexpr (std::is_same_v<Stage, StageTrainer>)
    if (a.mode == RunMode::kTrain) countState(s, trainer.executor());
  if (s.tensor && s.report.peak_tensor_bytes >= 0) {
    const int64_t others = s.tensor->peakTensorBytes();
    s.report.peak_tensor_bytes = others < 0 ? -1 : s.report.peak_tensor_bytes + others;
  }
  if (a.record_spans) {
    // Spans are taken on this machine's steady clock; reported on its realtime clock
    // (seconds since the epoch), which the coordinator can line up with other hosts'.
    const double shift = static_cast<double>(realtimeNs()) * 1e-9 -
                         std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
    s.report.spans = trainer.executor().spans();
    for (Span& span : s.report.spans) {
      span.start_s += shift;
      span.end_s += shift;
    }
  }
  // The trained slice goes first, in chunks (a sharded stage's replicas all gather it).
  if ((a.save || sharded(trainer)) && a.mode == RunMode::kTrain) {
    const std::vector<uint8_t> slice = s.sliceBytes(trainer);
    if (!a.save) return;
    s.report.model_hash = contentHash(slice);
    s.report.model_bytes = static_cast<int64_t>(slice.size());
    sendChunks(coordinator, s.report.model_hash, slice, std::chrono::seconds(a.wire.timeout_s));
  }
}

// A training or inference stage: the executor over the stage's links (and its replicas'
// group), the mode's body, then what the report says of the executor.
void runStage(Channel& coordinator, const Assign& a, StageSetup& s) {
  s.group = replicaGroup(
      a, {s.ctx, s.group_host, s.curve, s.socket_dir ? s.socket_dir->path() : ""},
      [&](const std::string& mine) {
        coordinator.send(GroupAddress{mine});
        GroupAddresses all = expect<GroupAddresses>(
            coordinator, std::chrono::seconds(a.wire.timeout_s), "the group's addresses");
        if (all.addresses.size() != static_cast<size_t>(a.replicas))
          throw FormatError(s.who + ": " + std::to_string(all.addresses.size()) +
                            " group addresses for " + std::to_string(a.replicas) + " replicas");
        return all.addresses;
      });
  PipelineOptions po;
  po.schedule = a.train.schedule;
  po.microbatches = a.train.microbatches;
  po.batch = a.train.batch;
  po.seed = a.train.seed;
  po.recompute = a.train.recompute;
  po.record_spans = a.record_spans;
  po.replicas = s.group.get();
  po.microbatch_shares = a.train.microbatch_shares;
  TANDEM_CHECK_MSG(po.microbatch_shares.empty() || a.replicas == 1 ||
                       po.microbatch_shares.size() == static_cast<size_t>(a.replicas),
                   InvalidArgument,
                   "stage " << a.stage << " has " << a.replicas << " replicas but the job cuts "
                            << "its batches for " << po.microbatch_shares.size());
  po.rebalance_steps = a.train.rebalance_steps;
  po.collective_timeout = std::chrono::seconds(a.wire.timeout_s);
  if (a.replicas > 1 && a.mode == RunMode::kTrain) {
    po.zero = a.train.zero;
    po.state_shares = a.train.state_shares;
  }
  const StageRange range = StageRange::interleaved(a.stage, a.stages, s.chunks);
  if (s.tensor) {
    TensorStage stage(s.tensor->parts(), range, s.prev.get(), s.next.get(), po);
    runMode(coordinator, a, s, stage);
  } else {
    StageTrainer trainer(*s.model, range, s.prev.get(), s.next.get(), &*s.optimizer, po);
    runMode(coordinator, a, s, trainer);
  }
}

// Tells the coordinator why the stage failed, and closes the channel; false if it could
// not (the coordinator is gone too).
bool reportFailure(Channel& coordinator, const std::string& what) noexcept {
  try {
    coordinator.send(Failed{what}, 2s);
    coordinator.close(2s);
    return true;
  } catch (const Error&) {
    return false;
  }
}

void runSetUp(Channel& coordinator, const Assign& a, StageSetup& s) {
  if (a.mode == RunMode::kGenerate) {
    const auto t0 = Clock::now();
    if (s.tensor)
      generateTensorStage(coordinator, a, s.tensor->parts(), s.prev.get(), s.next.get());
    else
      generateStage(coordinator, a, *s.model, s.prev.get(), s.next.get());
    s.report.run_s = std::chrono::duration<double>(Clock::now() - t0).count();
  } else {
    runStage(coordinator, a, s);
  }
  s.countLinkBytes();
  coordinator.send(s.report, std::chrono::seconds(a.wire.timeout_s));
  awaitRunEnd(coordinator, std::chrono::seconds(a.wire.timeout_s));
}

// `reported`: set when a failure has been told to the coordinator already.
void run(Channel& coordinator, const Assign& a, const ClusterKey& run_key, const WorkerOptions& o,
         bool& reported) {
  StageSetup s(coordinator, a, run_key, o);
  try {
    runSetUp(coordinator, a, s);
  } catch (const std::exception& e) {
    // Reported while the links are still open: the neighbours see them close (and fail
    // of it) only after the coordinator has heard the cause.
    reported = reportFailure(coordinator, e.what());
    throw;
  }
}

}  // namespace

void runStageWorker(Channel& coordinator, const ClusterKey& run_key, const WorkerOptions& o,
                    std::chrono::milliseconds wait) {
  bool reported = false;
  try {
    const Assign a = expect<Assign>(coordinator, wait, "assignment");
    run(coordinator, a, run_key, o, reported);
  } catch (const std::exception& e) {
    // (If the coordinator is gone too, the caller still learns why.)
    if (!reported) reportFailure(coordinator, e.what());
    throw;
  }
}

void runWorkerProcess(const std::string& control, int slot, const WorkerOptions& o) {
  // Dies with the process that started it: no worker outlives its run or its daemon.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  transport::keepFreedMemory();  // its links receive activations and gradients
  std::string line;
  std::getline(std::cin, line);
  const ClusterKey key = parseClusterKey(line, "the key on standard input");
  HandshakeOptions hello;
  hello.build = buildName();
  // (The coordinator's listener may close a connection unanswered under a flood: again.)
  std::unique_ptr<Channel> c = connectChannelRetrying(parseEndpoint(control), key, hello);
  c->send(WorkerHello{slot, static_cast<int64_t>(getpid())});
  runStageWorker(*c, key, o);
  c->close();
}

}  // namespace tandem::runtime
