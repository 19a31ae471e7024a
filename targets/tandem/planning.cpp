#include "targets/tandem/planning.h"

#include <map>
#include <vector>

#include <fstream>

#include "core/error.h"
#include "core/file.h"
#include "core/profile/profile.h"
#include "partitioner/cluster.h"
#include "partitioner/search.h"
#include "transport/codec.h"

namespace tandem::cli {

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
  o.schedule = job.schedule == ScheduleKind::kGPipe ? partitioner::Schedule::kGPipe
                                                    : partitioner::Schedule::k1F1B;
  o.microbatches = job.microbatches;
  o.max_replicas = job.max_replicas;
  o.microbatch_size = std::max<int64_t>(1, job.batch / job.microbatches);
  o.recompute = job.recompute;
  o.optimizer_state_per_param = optimizerStatePerParam(job.optimizer.kind, job.optimizer.momentum);
  o.activation_ratio = codecRatio(job.activation_codec);
  o.gradient_ratio = codecRatio(job.gradient_codec);
  return o;
}

PlannedJob planJob(const JobSpec& job, const Model& model) {
  const partitioner::CostModel cost =
      loadCostModel(model, job.cluster, job.profile, jobCostOptions(job));
  PlannedJob out{partitioner::bestPlan(cost), ""};
  out.yaml = partitioner::planToYaml(cost, out.plan);
  return out;
}

std::vector<StagePlacement> jobStages(const JobSpec& job, const Model& model,
                                      const std::string& plan_yaml) {
  const std::string path = !plan_yaml.empty() ? job.partition_where + " (the auto plan)" : job.plan;
  std::vector<StagePlacement> out;
  if (path.empty()) {
    TANDEM_CHECK_MSG(!job.auto_partition, InvalidArgument,
                     job.source << ": 'partition: auto' is planned by `tandem run`");
    const auto ranges = stageRanges(job, model);
    for (size_t s = 0; s < ranges.size(); ++s)
      out.push_back({ranges[s].first,
                     ranges[s].second,
                     "cpu",
                     job.threads,
                     -1,
                     s < job.range_replicas.size() ? job.range_replicas[s] : 1,
                     {},
                     {}});
    return out;
  }
  const auto specs =
      partitioner::parsePlan(!plan_yaml.empty() ? plan_yaml : readFile(path, "plan file"), path);
  JobSpec ranges = job;  // the job's own coverage checks, naming the plan's lines
  ranges.ranges.clear();
  ranges.range_where.clear();
  for (const partitioner::PlanStageSpec& s : specs) {
    TANDEM_CHECK_MSG(s.devices.size() <= 64, InvalidArgument,
                     s.where << ": " << s.devices.size() << " replicas; at most 64");
    ranges.ranges.push_back({s.begin, s.end});
    ranges.range_where.push_back(s.where);
  }
  stageRanges(ranges, model);
  for (const partitioner::PlanStageSpec& s : specs) {
    // The plan's compute is the stage's per microbatch, shared by its replicas and with
    // their allreduce spread over the step; one replica computes a whole microbatch.
    const auto replicas = static_cast<int>(s.devices.size());
    const double one =
        s.compute_s < 0
            ? -1
            : (s.compute_s - s.allreduce_s / static_cast<double>(job.microbatches)) * replicas;
    out.push_back({s.begin, s.end, s.backend, s.threads, one, replicas, s.backends, s.devices});
  }
  return out;
}

}  // namespace tandem::cli
