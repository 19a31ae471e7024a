// interleavedPlan (search.h): a plan's stages, each holding several model chunks.
#include <limits>

#include "core/error.h"
#include "partitioner/search.h"

namespace tandem::partitioner {

Plan interleavedPlan(const CostModel& cost, const Plan& base, int chunks) {
  const int p = static_cast<int>(base.stages.size());
  const int n = p * chunks;
  const size_t layers = cost.layers();
  TANDEM_CHECK_MSG(chunks >= 2 && p >= 2 && static_cast<size_t>(n) <= layers, InvalidArgument,
                   "interleaving needs 2 stages or more and a layer per chunk: "
                       << p << " stages x " << chunks << " chunks over " << layers << " layers");
  std::vector<int> type(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) {
    const Assignment& a = base.stages[static_cast<size_t>(s)].at;
    TANDEM_CHECK_MSG(a.devices.size() == 1, InvalidArgument,
                     "interleaved stages cannot have replicas (stage " << s << " has "
                                                                       << a.devices.size() << ")");
    type[static_cast<size_t>(s)] = cost.typeOf(a.devices.front());
  }
  const CostOptions& o = cost.options();
  // best[k][j]: the slowest of chunks 0..k-1 (and the links between them) when they hold
  // layers [0, j); from[k][j] where chunk k - 1 begins.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<size_t>(n + 1),
                                        std::vector<double>(layers + 1, inf));
  std::vector<std::vector<size_t>> from(static_cast<size_t>(n + 1),
                                        std::vector<size_t>(layers + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= n; ++k) {
    const int t = type[static_cast<size_t>((k - 1) % p)];
    const int before = k >= 2 ? type[static_cast<size_t>((k - 2) % p)] : -1;
    // Chunk k - 1 ends at j, leaving a layer for each chunk after it.
    for (size_t j = static_cast<size_t>(k); j + static_cast<size_t>(n - k) <= layers; ++j)
      for (size_t i = static_cast<size_t>(k - 1); i < j; ++i) {
        const double prior = best[static_cast<size_t>(k - 1)][i];
        if (prior == inf) continue;
        double worst = std::max(prior, cost.stage(t, i, j, 1));
        if (before >= 0)
          worst = std::max(worst, cost.link(i, before, t, o.activation_ratio, o.gradient_ratio));
        if (worst < best[static_cast<size_t>(k)][j]) {
          best[static_cast<size_t>(k)][j] = worst;
          from[static_cast<size_t>(k)][j] = i;
        }
      }
  }
  // No split into chunks that each device can run: refused, naming a layer one lacks.
  if (best[static_cast<size_t>(n)][layers] == inf) {
    std::string why;
    for (int s = 0; s < p && why.empty(); ++s) {
      why = cost.lacking(type[static_cast<size_t>(s)], 0, layers);
      if (!why.empty())
        why = cost.deviceOf(type[static_cast<size_t>(s)]).name + " cannot run " + why;
    }
    throw InvalidArgument("no split into " + std::to_string(chunks) + " chunks per stage: " + why);
  }
  std::vector<Assignment> stages(static_cast<size_t>(n));
  size_t end = layers;
  for (int k = n; k >= 1; --k) {
    Assignment& a = stages[static_cast<size_t>(k - 1)];
    a.end = end;
    a.begin = from[static_cast<size_t>(k)][end];
    a.devices = base.stages[static_cast<size_t>((k - 1) % p)].at.devices;
    end = a.begin;
  }
  Plan plan = evaluate(cost, stages, base.algorithm, {}, chunks);
  plan.left_out = base.left_out;
  // Each link's codecs where the options let the planner choose them (chooseCodecs: one
  // per link between stages, whichever chunks cross it).
  return chooseCodecs(cost, plan);
}

}  // namespace tandem::partitioner
