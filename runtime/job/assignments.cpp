// The workers' assignments from the job and its stages' placement (planning.h).
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "core/error.h"
#include "core/model_file.h"
#include "runtime/control/files.h"
#include "runtime/job/planning.h"

namespace tandem::runtime {

namespace {

// One direction of one link: the job's codec where it fixes one, else the plan's for that
// link, else fp32.
WireCodec linkCodec(WireCodec job_codec, bool fixed, const std::optional<WireCodec>& planned) {
  if (fixed) return job_codec;
  return planned.value_or(job_codec);
}

}  // namespace

std::vector<double> microbatchShares(const std::vector<StagePlacement>& stages) {
  std::vector<double> shares;
  size_t with = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    if (stages[s].shares.empty()) continue;
    TANDEM_CHECK_MSG(shares.empty(), InvalidArgument,
                     "stages " << with << " and " << s << " both give their replicas shares; "
                               << "one stage of a job may");
    TANDEM_CHECK_MSG(stages[s].shares.size() == static_cast<size_t>(stages[s].replicas),
                     InvalidArgument,
                     "stage " << s << " has " << stages[s].shares.size() << " shares for "
                              << stages[s].replicas << " replicas");
    shares = stages[s].shares;
    with = s;
  }
  for (size_t s = 0; s < stages.size() && !shares.empty(); ++s)
    TANDEM_CHECK_MSG(
        stages[s].replicas == 1 || stages[s].replicas == static_cast<int>(shares.size()),
        InvalidArgument,
        "stage " << s << " has " << stages[s].replicas << " replicas, and stage " << with
                 << " shares the work among " << shares.size()
                 << " unequal ones: a job's replicated stages have as many "
                 << "replicas as the one with shares");
  return shares;
}

std::vector<Assign> jobAssignments(const JobSpec& job, const std::vector<StagePlacement>& stages,
                                   RunMode mode, bool spans, const std::string& spec,
                                   const std::string& weights_hash, int64_t weights_bytes) {
  std::vector<Assign> out;
  const int p = static_cast<int>(stages.size());
  const std::vector<double> shares = microbatchShares(stages);
  for (int s = 0; s < p; ++s) {
    const StagePlacement& place = stages[static_cast<size_t>(s)];
    TANDEM_CHECK_MSG(mode != RunMode::kGenerate || s > 0 || place.slice.tensor == 1, Unsupported,
                     job.source << ": stage 0 of a generation run cannot be tensor-split (its "
                                << "prompts and keep-alives follow the clock, not its ranks' "
                                << "steps): split a later stage");
    for (int r = 0; r < place.replicas; ++r) {
      Assign a;
      a.job = job.source;
      // Each link's codecs, from the plan where it chose them: this stage's activations go
      // on its link to the next, its gradients back on the previous stage's link.
      const std::optional<WireCodec>& next_activations = place.next_activation_codec;
      // Interleaved stages are a ring: the last stage's chunks pass on to the first's.
      const bool ring = !place.slice.chunks.empty() && p > 1;
      static const std::optional<WireCodec> kNone;
      const std::optional<WireCodec>& prev_gradients =
          s > 0  ? stages[static_cast<size_t>(s - 1)].next_gradient_codec
          : ring ? stages.back().next_gradient_codec
                 : kNone;
      a.model_spec = spec;
      a.stage = s;
      a.stages = p;
      a.replica = r;
      a.replicas = place.replicas;
      a.prev_replicas = s > 0 ? stages[static_cast<size_t>(s - 1)].replicas : ring ? 1 : 0;
      a.next_replicas = s + 1 < p ? stages[static_cast<size_t>(s + 1)].replicas : ring ? 1 : 0;
      a.slice = place.slice;
      a.slice.device = place.backendOf(r);
      a.train = job.train;
      a.train.microbatch_shares = shares;
      // Only replicas of the whole model rebalance: they alone cut and measure each batch.
      a.train.rebalance_steps =
          p == 1 && place.replicas > 1 && !shares.empty() ? job.train.rebalance_steps : 0;
      a.data = job.data;
      a.wire = job.wire;
      a.wire.activations =
          linkCodec(job.wire.activations, job.activation_codec_given && !job.activations_auto,
                    next_activations);
      a.wire.gradients = linkCodec(job.wire.gradients,
                                   job.gradient_codec_given && !job.gradients_auto, prev_gradients);
      a.mode = mode;
      a.record_spans = spans;
      a.save = mode == RunMode::kTrain && !job.save.empty() && r == 0;  // replicas: identical
      a.transport = job.transport;
      a.weights_hash = weights_hash;
      a.weights_bytes = weights_bytes;
      out.push_back(std::move(a));
    }
  }
  return out;
}

void shardStateByMemory(std::vector<Assign>& assignments, const partitioner::Cluster& cluster,
                        const std::vector<int>& node_of) {
  std::map<int, std::vector<double>> memory;  // by stage, its replicas' (0: not declared)
  for (size_t i = 0; i < assignments.size(); ++i) {
    const Assign& a = assignments[i];
    if (a.train.zero == 0 || a.replicas < 2) continue;
    std::vector<double>& m = memory[a.stage];
    m.resize(static_cast<size_t>(a.replicas), 0.0);
    for (const partitioner::ClusterDevice& d :
         cluster.nodes.at(static_cast<size_t>(node_of.at(i))).devices)
      if (d.backend == a.slice.device) {
        m[static_cast<size_t>(a.replica)] = static_cast<double>(d.memory_bytes);
        break;
      }
  }
  for (auto& [stage, m] : memory) {
    const double most = *std::max_element(m.begin(), m.end());
    const bool declared = std::all_of(m.begin(), m.end(), [](double b) { return b > 0; });
    for (double& b : m) b /= most;
    for (Assign& a : assignments)
      if (a.stage == stage) a.train.state_shares = declared ? m : std::vector<double>{};
  }
}

int64_t replicaMemory(int64_t stage_bytes, int64_t state_bytes, const std::vector<double>& shares,
                      int replica) {
  if (shares.empty()) return stage_bytes;
  double total = 0;
  for (const double s : shares) total += s;
  const double state = static_cast<double>(state_bytes);
  return stage_bytes + std::llround(state * shares.at(static_cast<size_t>(replica)) / total -
                                    state / static_cast<double>(shares.size()));
}

std::map<std::string, std::shared_ptr<const std::vector<uint8_t>>> stageWeights(
    std::vector<Assign>& assignments, const std::shared_ptr<const std::vector<uint8_t>>& whole,
    size_t layers) {
  std::map<std::string, std::shared_ptr<const std::vector<uint8_t>>> files;
  // Each file made so far, by the layers it holds (a stage's replicas share one), as its hash.
  std::map<std::vector<std::pair<size_t, size_t>>, std::string> made;
  for (Assign& a : assignments) {
    const std::vector<LayerRange> ranges =
        a.slice.chunks.empty() ? std::vector<LayerRange>{a.slice.layers} : a.slice.chunks;
    const bool every = ranges.size() == 1 && ranges[0].begin == 0 && ranges[0].end >= layers;
    std::vector<std::pair<size_t, size_t>> key;
    if (!every)
      for (const LayerRange& r : ranges) key.emplace_back(r.begin, r.end);
    auto it = made.find(key);
    if (it == made.end()) {
      std::shared_ptr<const std::vector<uint8_t>> bytes = whole;
      if (!every)
        bytes = std::make_shared<const std::vector<uint8_t>>(
            sliceModelFile(*whole, ranges, "the starting weights"));
      it = made.emplace(key, contentHash(*bytes)).first;
      files.emplace(it->second, bytes);
    }
    a.weights_hash = it->second;
    a.weights_bytes = static_cast<int64_t>(files.at(it->second)->size());
  }
  return files;
}

}  // namespace tandem::runtime
