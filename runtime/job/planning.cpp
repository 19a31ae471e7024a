#include "runtime/job/planning.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <vector>

#include <fstream>

#include "core/error.h"
#include "core/file.h"
#include "core/profile/profile.h"
#include "partitioner/cluster.h"
#include "partitioner/search.h"
#include "runtime/node/node_profile.h"
#include "transport/codec.h"
#include "transport/local_group.h"

namespace tandem::runtime {

namespace {

// The batch a node's daemon may measure a slow device at for planning, where measuring at
// the microbatch would take long (node_profile.h, profileBatch).
constexpr int64_t kLeastProfiledBatch = 64;

}  // namespace

double codecRatio(const std::string& codec) {
  const std::vector<float> block(4096, 1.0f);
  transport::Encoded e;
  transport::encode(transport::parseCodec(codec), block, e);
  return static_cast<double>(e.payload.size() + e.scales.size() * sizeof(float)) /
         static_cast<double>(block.size() * sizeof(float));
}

double optimizerStatePerParam(const std::string& kind, float momentum) {
  if (kind == "adamw") return 2;
  return momentum != 0 ? 1 : 0;
}

partitioner::CostModel loadCostModel(const Model& model, const std::string& cluster_path,
                                     const std::string& profile,
                                     const partitioner::CostOptions& options) {
  const partitioner::Cluster cluster = partitioner::loadCluster(cluster_path);
  std::map<std::string, Profile> profiles;
  for (const std::string& path : partitioner::profilePaths(cluster, profile))
    profiles.emplace(path, parseProfile(readFile(path, "profile"), path));
  return partitioner::CostModel(
      partitioner::makeProblem(model, cluster, profiles, profile, options));
}

partitioner::CostOptions jobCostOptions(const JobSpec& job) {
  partitioner::CostOptions o;
  o.objective = partitioner::Objective::kTrainThroughput;
  o.schedule = job.train.schedule;
  o.microbatches = job.train.microbatches;
  o.max_replicas = job.max_replicas;
  // Interleaved stages hold one device each: no tensor ranks there.
  o.max_tensor = job.train.schedule == ScheduleKind::kInterleaved1F1B ? 1 : job.max_tensor;
  // Microbatch sizes differ by one when the batch does not divide: the largest is priced.
  o.microbatch_size = (job.train.batch + job.train.microbatches - 1) / job.train.microbatches;
  o.recompute = job.train.recompute;
  o.optimizer_state_per_param =
      optimizerStatePerParam(job.train.optimizer.kind, job.train.optimizer.momentum);
  o.optimizer = job.train.optimizer.kind;
  o.zero = job.train.zero;
  // A codec of "auto": each link's is chosen (chooseCodecs), from fp32 up.
  o.choose_activation_codec = job.activations_auto;
  o.choose_gradient_codec = job.gradients_auto;
  o.activation_codec = wireCodecName(job.wire.activations);
  o.gradient_codec = wireCodecName(job.wire.gradients);
  o.activation_ratio = codecRatio(o.activation_codec);
  o.gradient_ratio = codecRatio(o.gradient_codec);
  if (o.choose_activation_codec || o.choose_gradient_codec)
    for (const char* name : {"fp32", "fp16", "bf16", "int8"})  // most exact first
      o.codecs.push_back({name, codecRatio(name)});
  return o;
}

namespace {

// The node pairs (from, to; a node with itself too) whose link the cluster file states
// neither `between` them nor, within a node, as `local`.
std::vector<std::pair<size_t, size_t>> unstatedLinks(const partitioner::Cluster& cluster) {
  std::vector<std::pair<size_t, size_t>> pairs;
  const size_t nodes = cluster.nodes.size();
  for (size_t a = 0; a < nodes; ++a)
    for (size_t z = 0; z < nodes; ++z) {
      bool given = a == z ? cluster.local.has_value() : false;
      for (const partitioner::ClusterLink& l : cluster.between)
        given = given || (l.from == cluster.nodes[a].name && l.to == cluster.nodes[z].name) ||
                (l.to == cluster.nodes[a].name && l.from == cluster.nodes[z].name);
      if (!given) pairs.push_back({a, z});
    }
  return pairs;
}

// The microbatch sizes `options` price, largest first (the one each profile task is
// asked for; the others are its more_batches), each once.
std::vector<int64_t> microbatchSizes(const std::vector<partitioner::CostOptions>& options) {
  std::vector<int64_t> sizes;
  for (const partitioner::CostOptions& o : options) sizes.push_back(o.microbatch_size);
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

}  // namespace

std::vector<partitioner::Problem> measuredProblems(
    const Model& model, const std::string& model_spec, const ClusterDaemons& daemons,
    const std::string& default_profile, const std::vector<partitioner::CostOptions>& options,
    std::optional<LinkSet>* known_links) {
  TANDEM_CHECK(!options.empty());
  partitioner::Cluster cluster = daemons.cluster();
  std::map<std::string, Profile> profiles;
  for (const std::string& path : partitioner::profilePaths(cluster, default_profile))
    profiles.emplace(path, parseProfile(readFile(path, "profile"), path));
  const std::vector<int64_t> sizes = microbatchSizes(options);
  // Per node, the devices no profile file prices, one task entry per backend and thread
  // count, each alone (the step simulation shares the node's cores among its stages).
  const size_t nodes = cluster.nodes.size();
  std::vector<ProfileTask> tasks(nodes);
  std::vector<std::vector<partitioner::ClusterDevice*>> measured(nodes);
  for (size_t i = 0; i < nodes; ++i) {
    partitioner::ClusterNode& n = cluster.nodes[i];
    auto unpriced = [&](const partitioner::ClusterDevice& d) {
      return d.profile.empty() && n.profile.empty() && default_profile.empty();
    };
    // The partitioner scales times from the batch a device was measured at: the
    // microbatch, or on a device too slow to measure it within the daemon's budget a
    // smaller batch, down to kLeastProfiledBatch (a large microbatch's passes would make
    // profiling a slow node take minutes). Time does not grow in proportion to the batch
    // on a GPU: a launch-bound pass at 16 samples takes what one at 64 does.
    tasks[i] = nodeProfileTask(n, model_spec, sizes.front(), unpriced);
    tasks[i].least_batch = std::min(sizes.front(), kLeastProfiledBatch);
    tasks[i].more_batches.assign(sizes.begin() + 1, sizes.end());
    for (partitioner::ClusterDevice& d : n.devices)
      if (unpriced(d)) measured[i].push_back(&d);
  }
  // Per size, the profiles its problem is made from (the files', the links', and the
  // daemons' measurements at that size).
  std::vector<std::map<std::string, Profile>> at(sizes.size(), profiles);
  // Links the cluster file does not state (`between`, `measured`, `local` within a node;
  // `default` is a guess, and measuring replaces it): measured by the daemons.
  std::vector<std::pair<size_t, size_t>> pairs;
  const std::string links_name = "the links measured by the daemons";
  auto useLinks = [&](const LinkSet& links) {
    cluster.measured = links_name;
    cluster.measured_where = cluster.source;
    Profile p;
    p.links = links;
    for (auto& one : at) one.emplace(cluster.measured, p);
  };
  if (known_links && known_links->has_value()) {  // measured for another plan already
    useLinks(**known_links);
  } else if (cluster.measured.empty()) {
    pairs = unstatedLinks(cluster);
  }
  bool any = !pairs.empty();
  for (const ProfileTask& t : tasks) any = any || !t.devices.empty();
  if (any) {
    const auto started = std::chrono::steady_clock::now();
    auto sessions = daemons.connect("tandem run (planning)", std::chrono::seconds(30));
    std::vector<Channel*> channels;
    std::vector<std::string> names;
    std::vector<ProfileTask> asked;
    std::vector<size_t> node_of;
    for (size_t i = 0; i < nodes; ++i)
      if (!tasks[i].devices.empty()) {
        channels.push_back(sessions[i].get());
        names.push_back(cluster.nodes[i].name);
        asked.push_back(tasks[i]);
        node_of.push_back(i);
      }
    std::vector<int> cached;
    std::vector<std::vector<Profile>> more;
    const std::vector<Profile> got =
        profileOnNodes(channels, names, asked, std::chrono::seconds(600), &cached, &more);
    int devices = 0, hits = 0;
    for (size_t k = 0; k < got.size(); ++k) {
      const size_t i = node_of[k];
      hits += cached[k];
      devices += static_cast<int>(asked[k].devices.size() * sizes.size());
      for (partitioner::ClusterDevice* d : measured[i]) {
        size_t where = 0;
        while (asked[k].devices[where].backend != d->backend ||
               asked[k].devices[where].threads != d->threads)
          ++where;
        const std::string key = "node '" + cluster.nodes[i].name + "' (" + d->backend + ", " +
                                std::to_string(d->threads) + " threads, measured by its daemon)";
        d->profile = key;
        d->profile_device = got[k].devices[where].device.name;
        for (size_t b = 0; b < sizes.size(); ++b) {
          Profile one = b == 0 ? got[k] : more[k][b - 1];
          one.devices = {one.devices[where]};
          at[b].emplace(key, std::move(one));
        }
      }
    }
    if (!pairs.empty()) {
      LinkSurveyOptions lo;
      // 256 KiB, four to a timed run: enough to see a link's rate, quickly, and near the
      // size of the activations whose CPU the loaded runs price (one at a time, a 1 MiB
      // message streams and costs less per byte: 0.9-2.9e-8 s on lan-emulated's links
      // against 2.7-5.0e-8 at 256 KiB), as scripts/plan-fidelity measures.
      lo.probe.message_bytes = int64_t{256} << 10;
      lo.probe.repeats = 5;
      const LinkSet links = surveyLinks(daemons, sessions, pairs, lo);
      if (known_links) *known_links = links;
      useLinks(links);
    }
    leaveAll(sessions, "planning is done");
    spdlog::info(
        "partition: auto: {} device profiles measured by the nodes' daemons ({} from "
        "their caches){}, {} links measured, in {:.2f} s",
        devices, hits,
        sizes.size() > 1 ? " at " + std::to_string(sizes.size()) + " microbatch sizes" : "",
        pairs.size(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
  std::vector<partitioner::Problem> out;
  for (const partitioner::CostOptions& o : options) {
    const size_t b = static_cast<size_t>(std::find(sizes.begin(), sizes.end(), o.microbatch_size) -
                                         sizes.begin());
    out.push_back(partitioner::makeProblem(model, cluster, at[b], default_profile, o));
  }
  return out;
}

partitioner::Problem measuredProblem(const Model& model, const std::string& model_spec,
                                     const ClusterDaemons& daemons,
                                     const std::string& default_profile,
                                     const partitioner::CostOptions& options,
                                     std::optional<LinkSet>* known_links) {
  return std::move(
      measuredProblems(model, model_spec, daemons, default_profile, {options}, known_links)
          .front());
}

namespace {

// The microbatch counts `microbatches: auto` prices: 1, 2, 4, ... up to the batch, at most 64.
std::vector<int64_t> microbatchCandidates(int64_t batch) {
  std::vector<int64_t> out;
  for (int64_t m = 1; m <= std::min<int64_t>(batch, 64); m *= 2) out.push_back(m);
  return out;
}

// The cost options of `job` with each of these microbatch counts.
std::vector<partitioner::CostOptions> countOptions(const JobSpec& job,
                                                   const std::vector<int64_t>& counts) {
  std::vector<partitioner::CostOptions> out;
  for (const int64_t m : counts) {
    JobSpec candidate = job;
    candidate.train.microbatches = m;
    out.push_back(jobCostOptions(candidate));
  }
  return out;
}

}  // namespace

namespace {

// A candidate plan with the options it was priced under.
struct Choice {
  partitioner::Plan plan;
  int64_t microbatches = 0;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int chunks = 1;
  std::optional<partitioner::CostModel> cost;
};

// Of the candidates with one chunk per stage, the fewest devices within the selection
// margin of the fastest (a split must beat one device by more than the cost model's
// error, across options too); a fixed job's plan that does not fit when none does.
Choice pickFlat(std::vector<Choice>& flats) {
  std::vector<const partitioner::Plan*> plans;
  for (const Choice& f : flats) plans.push_back(&f.plan);
  const int picked = partitioner::pickAcrossOptions(plans);
  if (picked >= 0) return std::move(flats[static_cast<size_t>(picked)]);
  return flats.empty() ? Choice{} : std::move(flats.front());
}

// A job's `zero:` shards its replicated stages' training state: without any, refused.
void checkShardedStages(const JobSpec& job, const std::vector<StagePlacement>& stages) {
  if (job.train.zero == 0) return;
  for (const StagePlacement& s : stages)
    if (s.replicas > 1) return;
  throw InvalidArgument(job.zero_where + ": 'zero: " + std::to_string(job.train.zero) +
                        "' shards the training state over a stage's replicas, and no stage " +
                        (job.auto_partition ? "of the plan " : "") +
                        "has replicas (give a stage replicas, or leave 'zero' out)");
}
}  // namespace

bool prefersInterleaved(double interleaved_samples_per_s, double other_samples_per_s) {
  return interleaved_samples_per_s > other_samples_per_s * (1 + partitioner::kSelectionMargin);
}

PlannedJob planJob(const JobSpec& job, const Model& model, const std::string& spec,
                   const ClusterDaemons& daemons) {
  const std::vector<int64_t> counts = job.microbatches_auto ? microbatchCandidates(job.train.batch)
                                                            : std::vector{job.train.microbatches};
  const std::vector<ScheduleKind> kinds =
      job.schedule_auto ? std::vector{ScheduleKind::k1F1B, ScheduleKind::kGPipe,
                                      ScheduleKind::kZeroBubbleH1, ScheduleKind::kInterleaved1F1B}
                        : std::vector{job.train.schedule};
  const bool choosing = counts.size() > 1 || kinds.size() > 1;
  std::optional<LinkSet> links;
  // Every feasible candidate with one chunk per stage, and the fastest interleaved one.
  Choice chunked;
  std::vector<Choice> flats;  // every feasible candidate with one chunk per stage
  PlannedJob out;
  // The devices' costs depend on the microbatch, not on the schedule: measured once per
  // count (every count in one task per node), priced under each schedule.
  const std::vector<partitioner::Problem> problems =
      measuredProblems(model, spec, daemons, job.profile, countOptions(job, counts), &links);
  for (size_t ci = 0; ci < counts.size(); ++ci) {
    const int64_t m = counts[ci];
    JobSpec candidate = job;
    candidate.train.microbatches = m;
    const partitioner::Problem& measured = problems[ci];
    // Interleaved stages are the 1F1B plan's stages, each cut into chunks: that plan first.
    std::optional<partitioner::Plan> one_f_one_b;
    for (const ScheduleKind kind : kinds) {
      const bool interleaved = kind == ScheduleKind::kInterleaved1F1B;
      candidate.train.schedule = interleaved ? ScheduleKind::k1F1B : kind;
      partitioner::Problem problem = measured;
      problem.options = jobCostOptions(candidate);
      partitioner::CostModel cost(std::move(problem));
      const int chunks = !interleaved ? 1 : job.train.schedule == kind ? job.chunks : 2;
      PlanCandidate c{m, kind, chunks, 0, 0, ""};
      partitioner::Plan plan;
      ScheduleKind runs = kind;
      try {
        if (!interleaved || !one_f_one_b) plan = partitioner::choosePlan(cost);
        if (!interleaved) {
          if (kind == ScheduleKind::k1F1B) one_f_one_b = plan;
        } else {
          const partitioner::Plan& base = one_f_one_b ? *one_f_one_b : plan;
          if (base.stages.size() >= 2) {
            candidate.train.schedule = kind;
            partitioner::Problem chunked = measured;
            chunked.options = jobCostOptions(candidate);
            cost = partitioner::CostModel(std::move(chunked));
            plan = partitioner::interleavedPlan(cost, base, chunks);
          } else if (choosing) {
            throw InvalidArgument("interleaved stages need 2 stages or more, and the plan is " +
                                  std::string(base.stages.empty() ? "none" : "one device"));
          } else {
            // The job asked for interleaved stages, but its plan is one device (chosen as
            // the fastest, or all a re-plan's survivors hold): that runs 1F1B.
            spdlog::info("{}: the plan is one stage, which runs 1f1b, not interleaved",
                         job.partition_where);
            plan = base;
            runs = ScheduleKind::k1F1B;
            c.chunks = 1;
          }
        }
        c.step_s = plan.step_s;
        c.samples_per_s = plan.samples_per_s;
        c.infeasible = plan.infeasible;
      } catch (const InvalidArgument& e) {
        if (!choosing) throw;
        c.infeasible = e.what();
        c.refused = true;
      }
      out.candidates.push_back(c);
      // A job that fixes both is planned as it says: a plan that does not fit is returned
      // with `infeasible`, for the run to name.
      if (!c.infeasible.empty() && choosing) continue;
      // The same batch either way: the most samples per second is the shortest step per
      // sample.
      if (c.chunks == 1)
        flats.push_back({plan, m, runs, c.chunks, std::move(cost)});
      else if (!chunked.cost || c.samples_per_s > chunked.plan.samples_per_s)
        chunked = {plan, m, runs, c.chunks, std::move(cost)};
    }
  }
  Choice flat = pickFlat(flats);
  const bool take_chunked =
      chunked.cost &&
      (!flat.cost || prefersInterleaved(chunked.plan.samples_per_s, flat.plan.samples_per_s));
  Choice& chosen = take_chunked ? chunked : flat;
  TANDEM_CHECK_MSG(chosen.cost, InvalidArgument,
                   job.partition_where << ": no microbatch count or schedule gives a plan that "
                                          "fits: "
                                       << out.candidates.front().infeasible);
  out.searched = std::move(chosen.plan);
  out.microbatches = chosen.microbatches;
  out.schedule = chosen.schedule;
  out.chunks = chosen.chunks;
  if (!choosing) out.candidates.clear();
  const partitioner::CostModel& cost = *chosen.cost;
  if (partitioner::splitsTensors(out.searched)) {
    partitioner::Problem layers = cost.problem();
    layers.options.max_tensor = 1;
    out.layer_only = partitioner::choosePlan(partitioner::CostModel(std::move(layers)));
    out.layer_only.algorithm = "layer-only " + out.layer_only.algorithm;
  }
  out.baselines = partitioner::baselinePlans(cost);
  out.plan = out.searched;
  if (!job.baseline.empty()) {
    TANDEM_CHECK_MSG(out.chunks == 1, InvalidArgument,
                     job.source << ": the " << job.baseline
                                << " split is one range per stage; interleaved stages are "
                                   "the search's (leave 'baseline' out)");
    for (const partitioner::Plan& b : out.baselines)
      if (b.algorithm == job.baseline) out.plan = b;
    TANDEM_CHECK_MSG(out.plan.algorithm == job.baseline, InvalidArgument,
                     job.source << ": the partitioner has no baseline '" << job.baseline << "'");
    TANDEM_CHECK_MSG(out.plan.infeasible.empty(), InvalidArgument,
                     job.source << ": the " << job.baseline
                                << " split does not fit the cluster: " << out.plan.infeasible);
  }
  out.stages =
      partitioner::planStageSpecs(cost, out.plan, job.partition_where + " (the auto plan)");
  for (const auto& d : cost.problem().devices) out.devices.push_back(d.name);
  return out;
}

std::vector<int64_t> stageMemory(const JobSpec& job, const Model& model,
                                 const std::vector<StagePlacement>& stages, RunMode mode) {
  // The partitioner's memory model, which depends on the layers' bytes and the options
  // only: a placeholder device and link stand in for the cluster.
  partitioner::CostOptions options = jobCostOptions(job);
  if (mode != RunMode::kTrain) options.objective = partitioner::Objective::kInferThroughput;
  partitioner::Problem p = partitioner::modelProblem(model, options);
  p.node_names = {"any"};
  p.devices.push_back({"any/device", 0, 1, std::vector<double>(model.size(), 0),
                       std::vector<double>(model.size(), 0), "cpu", 1});
  p.links = {{partitioner::LinkCosts{1, 0}}};
  const partitioner::CostModel cost(std::move(p));
  std::vector<int64_t> out;
  const int n = static_cast<int>(stages.size());
  for (int s = 0; s < n; ++s) {
    const StagePlacement& st = stages[static_cast<size_t>(s)];
    if (st.slice.chunks.empty()) {
      // Unequal replicas: the one with the largest share holds the largest microbatches.
      const std::vector<double> sizes = partitioner::CostModel::replicaSizes(st.shares);
      const double scale = sizes.empty() ? 1 : *std::max_element(sizes.begin(), sizes.end());
      out.push_back(
          cost.memory(st.slice.layers.begin, st.slice.layers.end, n - s, st.replicas, n, scale));
      continue;
    }
    // Interleaved: each chunk's weights and state, and the stash of as many microbatches
    // as the schedule's warm-up forwards (the most any chunk of the stage can hold).
    const auto v = static_cast<int>(st.slice.chunks.size());
    const auto held = static_cast<int>(
        std::min<int64_t>(interleavedWarmup(s, n, v) + 1, job.train.microbatches * v));
    int64_t bytes = 0;
    for (const LayerRange& c : st.slice.chunks) bytes += cost.memory(c.begin, c.end, held, 1, n);
    out.push_back(bytes);
  }
  return out;
}

void checkTensorSplit(const Model& model, const StageSlice& slice, const std::string& where) {
  Model probe(model.spec());
  auto groups = transport::makeLocalGroup(slice.tensor);
  std::vector<double> shares = slice.tensor_shares;
  if (shares.empty()) shares.assign(static_cast<size_t>(slice.tensor), 1.0);
  try {
    probe.splitForTensor(slice.layers.begin, slice.layers.end, *groups[0], shares);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(where + ": the stage cannot split over " + std::to_string(slice.tensor) +
                          " tensor ranks: " + e.what());
  }
}

std::vector<StagePlacement> jobStages(const JobSpec& job, const Model& model,
                                      const std::vector<partitioner::PlanStageSpec>* planned) {
  std::vector<StagePlacement> out;
  if (!planned && job.plan.empty()) {
    TANDEM_CHECK_MSG(!job.auto_partition, InvalidArgument,
                     job.source << ": 'partition: auto' is planned by `tandem run`");
    const auto ranges = stageRanges(job, model);
    // Interleaved: stage s holds ranges s, s + stages, ...
    const size_t stages = ranges.size() / static_cast<size_t>(job.chunks);
    for (size_t s = 0; s < stages; ++s) {
      StagePlacement place;
      StageSlice& slice = place.slice;
      slice.layers = ranges[s];
      if (job.chunks > 1) {
        for (size_t i = s; i < ranges.size(); i += stages) slice.chunks.push_back(ranges[i]);
        slice.layers.end = slice.chunks.back().end;
      }
      slice.threads = job.threads;
      place.replicas = s < job.ranges.size() ? job.ranges[s].replicas : 1;
      if (s < job.ranges.size()) {
        const JobSpec::Range& range = job.ranges[s];
        place.shares = range.shares;
        slice.tensor = range.tensor;
        slice.tensor_shares = range.tensor_shares;
        slice.tensor_devices = range.tensor_devices;
        if (!slice.tensor_devices.empty()) slice.device = slice.tensor_devices.front();
        if (range.tensor > 1) checkTensorSplit(model, slice, range.where);
      }
      out.push_back(std::move(place));
    }
    checkShardedStages(job, out);
    return out;
  }
  int plan_chunks = job.chunks;  // a plan file's own
  const std::vector<partitioner::PlanStageSpec> specs =
      planned ? *planned
              : partitioner::parsePlan(readFile(job.plan, "plan file"), job.plan, &plan_chunks);
  TANDEM_CHECK_MSG(plan_chunks == job.chunks, InvalidArgument,
                   job.plan << ": the plan's stages are in " << plan_chunks
                            << " chunks each, the job's "
                            << (job.chunks > 1 ? "in " + std::to_string(job.chunks)
                                               : std::string("one range each"))
                            << (plan_chunks > 1 ? " (give 'schedule: interleaved' with 'chunks: " +
                                                      std::to_string(plan_chunks) + "')"
                                                : std::string()));
  JobSpec ranges = job;  // the job's own coverage checks, naming the plan's lines
  ranges.ranges.clear();
  for (const partitioner::PlanStageSpec& s : specs) {
    TANDEM_CHECK_MSG(s.devices.size() <= 64, InvalidArgument,
                     s.where << ": " << s.devices.size() << " replicas; at most 64");
    ranges.ranges.push_back({{s.begin, s.end}, 1, {}, s.where});
  }
  stageRanges(ranges, model);
  // An interleaved plan (the job's chunks > 1: `partition: auto`'s, or a plan file with
  // `chunks:`) lists its stages' chunks: stage s holds chunks s, s + stages, ..., as a
  // job's ranges do.
  const auto chunks = static_cast<size_t>(job.chunks);
  TANDEM_CHECK_MSG(specs.size() % chunks == 0 && (chunks == 1 || specs.size() / chunks >= 2),
                   InvalidArgument,
                   specs.front().where << ": " << specs.size() << " ranges are not " << chunks
                                       << " chunks for each of 2 stages or more");
  const size_t stages = specs.size() / chunks;
  for (size_t st = 0; st < stages; ++st) {
    const partitioner::PlanStageSpec& s = specs[st];
    // The plan's compute is the stage's per microbatch, shared by its replicas and with
    // their allreduce and the update spread over the step; one replica computes a whole
    // microbatch, and the run's rows show its compute without the update.
    const auto replicas = static_cast<int>(s.devices.size());
    double one = 0;
    StagePlacement place;
    for (size_t i = st; i < specs.size(); i += stages) {
      const partitioner::PlanStageSpec& c = specs[i];
      TANDEM_CHECK_MSG(c.devices == s.devices, InvalidArgument,
                       c.where << ": chunk " << i << " is not on stage " << st << "'s devices");
      one = c.compute_s < 0 || one < 0
                ? -1
                : one + (c.compute_s - (c.allreduce_s + c.update_s) /
                                           static_cast<double>(job.train.microbatches)) *
                            replicas;
      if (chunks > 1) place.slice.chunks.push_back({c.begin, c.end});
    }
    place.slice.layers = {s.begin, chunks > 1 ? place.slice.chunks.back().end : s.end};
    place.slice.device = s.backend;
    place.slice.threads = s.threads;
    place.predicted_compute_s = one;
    if (s.tensor) {
      // One worker whose ranks are the plan's devices (one node), each on its backend; its
      // compute per microbatch is the whole stage's, all ranks at once.
      TANDEM_CHECK_MSG(chunks == 1, InvalidArgument,
                       s.where << ": a tensor-split stage cannot be interleaved");
      place.predicted_compute_s =
          s.compute_s < 0 ? -1
                          : s.compute_s - s.update_s / static_cast<double>(job.train.microbatches);
      place.slice.tensor = replicas;
      place.slice.tensor_shares = s.shares;
      place.slice.tensor_devices =
          s.backends.empty() ? std::vector<std::string>(s.devices.size(), s.backend) : s.backends;
      place.replica_devices = {s.devices.front()};
      auto node = [](const std::string& d) { return d.substr(0, d.find('/')); };
      for (const std::string& d : s.devices)
        TANDEM_CHECK_MSG(node(d) == node(s.devices.front()), InvalidArgument,
                         s.where << ": a tensor-split stage's ranks are on one node, not "
                                 << s.devices.front() << " and " << d);
      checkTensorSplit(model, place.slice, s.where);
    } else {
      place.replicas = replicas;
      place.replica_backends = s.backends;
      place.replica_devices = s.devices;
      place.shares = s.shares;
    }
    // The link to the next stage: the codecs of its last chunk's (its first chunk's on an
    // interleaved plan, which lists the others' links after it).
    if (!s.activation_codec.empty())
      place.next_activation_codec = parseWireCodec(s.activation_codec);
    if (!s.gradient_codec.empty()) place.next_gradient_codec = parseWireCodec(s.gradient_codec);
    out.push_back(std::move(place));
  }
  checkShardedStages(job, out);
  return out;
}

}  // namespace tandem::runtime
