// `partition: auto` for generation runs, and the price of a generation job's own split
// (planning.h; partitioner/generation.h prices the tokens).
#include <spdlog/spdlog.h>

#include <algorithm>

#include "core/error.h"
#include "partitioner/generation.h"
#include "partitioner/search.h"
#include "runtime/job/planning.h"

namespace tandem::runtime {

std::vector<int64_t> tokenBytes(const Model& model) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < model.size(); ++i) {
    const Shape& s = model.layer(i).outputShape();  // [tokens, width] per sequence
    const int64_t tokens = s.rank() >= 2 ? s[0] : 1;
    out.push_back(s.numel() / std::max<int64_t>(1, tokens) * 4);
  }
  return out;
}

namespace {

std::string stagesText(const partitioner::CostModel& cost,
                       const std::vector<partitioner::Assignment>& stages) {
  std::string out;
  for (const partitioner::Assignment& a : stages)
    out += (out.empty() ? "" : " | ") + std::string("[") + std::to_string(a.begin) + ", " +
           std::to_string(a.end) + ") " +
           cost.problem().devices[static_cast<size_t>(a.devices.front())].name;
  return out;
}

}  // namespace

PlannedJob planGenerationJob(const JobSpec& job, const Model& model, const std::string& spec,
                             const ClusterDaemons& daemons, int in_flight) {
  partitioner::CostOptions options = jobCostOptions(job);
  options.objective = partitioner::Objective::kInferThroughput;
  std::optional<LinkSet> links;
  partitioner::CostModel cost(measuredProblem(model, spec, daemons, job.profile, options, &links));
  const partitioner::GenerationOptions go{in_flight, tokenBytes(model)};
  const partitioner::GenerationPlan g = partitioner::planGeneration(cost, go);
  std::vector<partitioner::Assignment> chosen;
  for (const partitioner::PlanStage& st : g.plan.stages) chosen.push_back(st.at);
  spdlog::info(
      "partition: auto: generation over {} stage{} ({}), predicted {:.0f} tokens/s with {} "
      "sequences in flight (paced by {})",
      chosen.size(), chosen.size() == 1 ? "" : "s", stagesText(cost, chosen),
      g.predicted.tokens_per_s, in_flight, g.predicted.paced_by);
  if (g.best_split.tokens_per_s > 0)
    spdlog::info(
        "partition: auto: the best split, {}, predicted {:.0f} tokens/s ({:.2f}x the best "
        "single device's {:.0f}; a split is taken beyond {:.2f}x)",
        stagesText(cost, g.best_split_stages), g.best_split.tokens_per_s,
        g.best_single.tokens_per_s > 0 ? g.best_split.tokens_per_s / g.best_single.tokens_per_s
                                       : 0.0,
        g.best_single.tokens_per_s, 1 + partitioner::kSelectionMargin);
  PlannedJob out;
  out.plan = g.plan;
  out.searched = g.plan;
  out.stages = partitioner::planStageSpecs(cost, g.plan, job.partition_where + " (the auto plan)");
  for (const auto& d : cost.problem().devices) out.devices.push_back(d.name);
  out.microbatches = job.train.microbatches;
  out.schedule = job.train.schedule;
  return out;
}

void warnSlowGenerationSplit(const JobSpec& job, const Model& model, const std::string& spec,
                             const ClusterDaemons& daemons, int in_flight,
                             const std::vector<LayerRange>& ranges, const std::vector<int>& nodes,
                             const std::vector<std::string>& backends) {
  partitioner::CostOptions options = jobCostOptions(job);
  options.objective = partitioner::Objective::kInferThroughput;
  try {
    std::optional<LinkSet> links;
    const partitioner::CostModel cost(
        measuredProblem(model, spec, daemons, job.profile, options, &links));
    const auto& devices = cost.problem().devices;
    std::vector<partitioner::Assignment> stages;
    for (size_t s = 0; s < ranges.size(); ++s) {
      int at = -1;
      for (size_t d = 0; d < devices.size() && at < 0; ++d)
        if (devices[d].node == nodes.at(s) && devices[d].backend == backends.at(s))
          at = static_cast<int>(d);
      if (at < 0) return;  // not a device the profiles know
      stages.push_back(
          {static_cast<size_t>(ranges[s].begin), static_cast<size_t>(ranges[s].end), {at}});
    }
    const partitioner::GenerationOptions go{in_flight, tokenBytes(model)};
    const partitioner::GenerationCost own = partitioner::priceGeneration(cost, stages, go);
    const partitioner::GenerationPlan best = partitioner::planGeneration(cost, go);
    const double single = best.best_single.tokens_per_s;
    spdlog::info(
        "partition: the job's {} stages predicted {:.0f} tokens/s with {} sequences in "
        "flight (paced by {}); the best single device {:.0f}",
        stages.size(), own.tokens_per_s, in_flight, own.paced_by, single);
    if (single > own.tokens_per_s)
      spdlog::warn(
          "{}: the job's {} stages are predicted slower than one device ({:.0f} "
          "against {:.0f} tokens/s, {:.2f}x): 'partition: auto' would run {}",
          job.partition_where.empty() ? job.source : job.partition_where, stages.size(),
          own.tokens_per_s, single, own.tokens_per_s / single,
          best.plan.stages.size() == 1 ? "one device" : "the predicted best split");
  } catch (const Error& e) {  // a prediction only: the run goes on as the job says
    spdlog::debug("no generation prediction for the job's split: {}", e.what());
  }
}

}  // namespace tandem::runtime
