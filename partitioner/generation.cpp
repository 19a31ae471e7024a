#include "partitioner/generation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "core/error.h"
#include "partitioner/search.h"

namespace tandem::partitioner {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr size_t kMostStages = 4;
constexpr size_t kMostSequences = 4096;

int nodeOf(const CostModel& cost, int device) {
  return cost.problem().devices[static_cast<size_t>(device)].node;
}

double tokenBytes(const GenerationOptions& o, size_t end) {
  return static_cast<double>(o.token_bytes.at(end - 1));
}

// One hop of a token: from the stage on node `from` to the one on `to`, `bytes` on it.
double trip(const CostModel& cost, int from, int to, double bytes) {
  const LinkCosts& l = cost.problem().links[static_cast<size_t>(from)][static_cast<size_t>(to)];
  return l.latency_s + bytes / l.bandwidth + cost.messageCpuAtEnd(from, from, to, bytes) +
         cost.messageCpuAtEnd(to, from, to, bytes);
}

// Stage s's busy time for one pass of a batch of `rows` sequences: its decode and its
// ends of the message it receives and the one it sends (the last stage sends the batch's
// tokens back and reports each).
double busy(const CostModel& cost, const std::vector<Assignment>& stages, size_t s,
            const GenerationOptions& o, int64_t rows) {
  const size_t p = stages.size();
  const Assignment& a = stages[s];
  const int dev = a.devices.front(), node = nodeOf(cost, dev);
  const Assignment& prev = stages[(s + p - 1) % p];
  const Assignment& next = stages[(s + 1) % p];
  const int prev_node = nodeOf(cost, prev.devices.front());
  const int next_node = nodeOf(cost, next.devices.front());
  const bool last = s + 1 == p;
  const double r = static_cast<double>(rows);
  const double in_bytes = r * (s == 0 ? 4.0 : tokenBytes(o, a.begin));
  const double out_bytes = r * (last ? 4.0 : tokenBytes(o, a.end));
  double t = decodeSeconds(cost, dev, a.begin, a.end, rows);
  t += cost.messageCpuAtEnd(node, prev_node, node, in_bytes);
  t += cost.messageCpuAtEnd(node, node, next_node, out_bytes);
  if (last) t += r * cost.messageCpuAtEnd(node, node, node, 4.0);  // the reports
  return t;
}

// The cuts of `devices` (a sequence, one stage each) where the busiest stage is least busy
// decoding its batches of `rows` sequences.
std::vector<Assignment> balancedCuts(const CostModel& cost, const std::vector<int>& devices,
                                     int64_t rows) {
  const size_t n = cost.layers(), p = devices.size();
  if (p > n) return {};
  // best[s][e]: the least busiest stage of stages 0..s-1 over layers [0, e).
  std::vector<std::vector<double>> best(p + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<size_t>> cut(p + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0;
  for (size_t s = 1; s <= p; ++s) {
    const int dev = devices[s - 1];
    const int type = cost.typeOf(dev);
    for (size_t e = s; e <= n - (p - s); ++e) {
      for (size_t b = s - 1; b < e; ++b) {
        if (best[s - 1][b] == kInf || !cost.runs(type, b, e)) continue;
        const double here = decodeSeconds(cost, dev, b, e, rows);
        const double worst = std::max(best[s - 1][b], here);
        if (worst < best[s][e]) {
          best[s][e] = worst;
          cut[s][e] = b;
        }
      }
    }
  }
  if (best[p][n] == kInf) return {};
  std::vector<Assignment> out(p);
  size_t e = n;
  for (size_t s = p; s >= 1; --s) {
    out[s - 1] = {cut[s][e], e, {devices[s - 1]}};
    e = cut[s][e];
  }
  return out;
}

// `plan` (evaluate()'s) with each stage's memory holding the caches of `in_flight`
// sequences as well; `infeasible` names the first device they do not fit on.
Plan withCaches(const CostModel& cost, Plan plan, int64_t in_flight) {
  for (PlanStage& st : plan.stages) {
    const int dev = st.at.devices.front();
    const DeviceCosts& d = cost.problem().devices[static_cast<size_t>(dev)];
    int64_t cache = 0;
    for (size_t l = st.at.begin; l < st.at.end && l < d.cache_bytes.size(); ++l)
      cache += d.cache_bytes[l];
    st.memory_bytes += in_flight * cache;
    if (st.memory_bytes > d.memory_bytes && plan.infeasible.empty())
      plan.infeasible = d.name + " needs " + std::to_string(st.memory_bytes) +
                        " bytes with the caches of " + std::to_string(in_flight) +
                        " sequences, and has " + std::to_string(d.memory_bytes);
  }
  return plan;
}

// Every sequence of `length` distinct devices of `count`, in order, passed to `each`.
template <typename F>
void sequences(int count, size_t length, std::vector<int>& at, std::vector<bool>& used,
               const F& each) {
  if (at.size() == length) return each(at);
  for (int d = 0; d < count; ++d) {
    if (used[static_cast<size_t>(d)]) continue;
    used[static_cast<size_t>(d)] = true;
    at.push_back(d);
    sequences(count, length, at, used, each);
    at.pop_back();
    used[static_cast<size_t>(d)] = false;
  }
}

double sequenceCount(int devices, size_t length) {
  double c = 1;
  for (size_t k = 0; k < length; ++k) c *= devices - static_cast<double>(k);
  return c;
}

}  // namespace

double decodeSeconds(const CostModel& cost, int device, size_t begin, size_t end,
                     int64_t sequences) {
  const DeviceCosts& d = cost.problem().devices[static_cast<size_t>(device)];
  TANDEM_CHECK_MSG(d.decode_s.size() == cost.layers() && d.decode_batch_s.size() == cost.layers() &&
                       d.decode_batch >= 1,
                   InvalidArgument,
                   "device " << d.name
                             << " has no decoding times in its profile (a profile of a language "
                                "model by this version of tandem measures them)");
  const double k = static_cast<double>(sequences), batch = static_cast<double>(d.decode_batch);
  double t = 0;
  for (size_t l = begin; l < end; ++l) {
    const double one = d.decode_s[l], many = d.decode_batch_s[l];
    // The line through (1, one) and (batch, many); one sequence at a time where batch is 1.
    t += d.decode_batch > 1 ? one + (k - 1) * (many - one) / (batch - 1) : one * k;
  }
  return std::max(0.0, t);
}

GenerationCost priceGeneration(const CostModel& cost, const std::vector<Assignment>& stages,
                               const GenerationOptions& o) {
  TANDEM_CHECK_MSG(!stages.empty() && o.in_flight >= 1, InvalidArgument,
                   "generation needs a stage and a sequence in flight");
  TANDEM_CHECK_MSG(
      o.token_bytes.size() == cost.layers(), InvalidArgument,
      "generation: " << o.token_bytes.size() << " token sizes for " << cost.layers() << " layers");
  const double k = static_cast<double>(o.in_flight);
  GenerationCost c;
  if (stages.size() == 1) {
    const Assignment& a = stages.front();
    const int dev = a.devices.front(), node = nodeOf(cost, dev);
    const double step = decodeSeconds(cost, dev, a.begin, a.end, o.in_flight) +
                        k * cost.messageCpuAtEnd(node, node, node, 4.0);
    c.tokens_per_s = k / step;
    c.token_s = step;
    c.paced_by = "stage 0 decode";
    return c;
  }
  const size_t p = stages.size();
  // Stage 0 keeps about one batch per stage travelling (core/pipeline/stage_decoder.h).
  const int64_t rows = (o.in_flight + static_cast<int64_t>(p) - 1) / static_cast<int64_t>(p);
  const double r = static_cast<double>(rows);
  double ring = 0, busiest = 0;
  size_t busiest_stage = 0;
  std::map<int, double> node_work;  // core-seconds per token on each node
  for (size_t s = 0; s < p; ++s) {
    const Assignment& a = stages[s];
    const int dev = a.devices.front(), node = nodeOf(cost, dev);
    const int next_node = nodeOf(cost, stages[(s + 1) % p].devices.front());
    ring += decodeSeconds(cost, dev, a.begin, a.end, rows) +
            trip(cost, node, next_node, r * (s + 1 == p ? 4.0 : tokenBytes(o, a.end)));
    const double b = busy(cost, stages, s, o, rows) / r;  // per token
    if (b > busiest) busiest = b, busiest_stage = s;
    const DeviceCosts& d = cost.problem().devices[static_cast<size_t>(dev)];
    node_work[node] += b * std::max(1.0, d.host_threads);
  }
  c.tokens_per_s = k / ring;
  c.paced_by = "the ring";
  if (1 / busiest < c.tokens_per_s) {
    c.tokens_per_s = 1 / busiest;
    c.paced_by = "stage " + std::to_string(busiest_stage) + " decode";
  }
  for (const auto& [node, work] : node_work) {
    const double cores = cost.nodeCores(node);
    if (cores > 0 && cores / work < c.tokens_per_s) {
      c.tokens_per_s = cores / work;
      c.paced_by = "node " + cost.problem().node_names[static_cast<size_t>(node)] + "'s cores";
    }
  }
  c.token_s = k / c.tokens_per_s;
  return c;
}

GenerationPlan planGeneration(const CostModel& cost, const GenerationOptions& o) {
  const size_t n = cost.layers();
  // The devices whose profiles time decoding (a device whose backend cannot decode the
  // model, an OpenCL device lacking an op, has none): only they are priced.
  std::vector<int> timed;
  for (size_t d = 0; d < cost.problem().devices.size(); ++d)
    if (cost.problem().devices[d].decode_batch >= 1) timed.push_back(static_cast<int>(d));
  TANDEM_CHECK_MSG(!timed.empty(), InvalidArgument,
                   "generation: no device has decoding times in its profile (a profile of a "
                   "language model by this version of tandem measures them; "
                       << cost.problem().devices.front().name << "'s has none)");
  const int devices = static_cast<int>(timed.size());
  GenerationPlan out;
  struct Priced {
    std::vector<Assignment> stages;
    GenerationCost c;
  };
  std::vector<Priced> fitting;
  auto consider = [&](const std::vector<Assignment>& stages) {
    if (stages.empty()) return;
    for (const Assignment& a : stages)
      if (!cost.runs(cost.typeOf(a.devices.front()), a.begin, a.end)) return;
    if (!fits(withCaches(cost, evaluate(cost, stages, "generation"), o.in_flight))) return;
    const GenerationCost c = priceGeneration(cost, stages, o);
    GenerationCost& best = stages.size() == 1 ? out.best_single : out.best_split;
    if (c.tokens_per_s > best.tokens_per_s) {
      best = c;
      if (stages.size() > 1) out.best_split_stages = stages;
    }
    fitting.push_back({stages, c});
  };
  for (const int d : timed) consider({{0, n, {d}}});
  for (size_t p = 2; p <= std::min<size_t>({kMostStages, n, static_cast<size_t>(devices)}); ++p) {
    if (sequenceCount(devices, p) > static_cast<double>(kMostSequences)) break;
    std::vector<int> at;
    std::vector<bool> used(static_cast<size_t>(devices), false);
    sequences(devices, p, at, used, [&](const std::vector<int>& seq) {
      std::vector<int> chosen;
      for (const int i : seq) chosen.push_back(timed[static_cast<size_t>(i)]);
      consider(balancedCuts(cost, chosen,
                            (o.in_flight + static_cast<int64_t>(p) - 1) / static_cast<int64_t>(p)));
    });
  }
  TANDEM_CHECK_MSG(!fitting.empty(), InvalidArgument,
                   "generation: no device, nor any split over up to "
                       << kMostStages << " of them, fits the model in memory and runs its layers");
  double fastest = 0;
  for (const Priced& f : fitting) fastest = std::max(fastest, f.c.tokens_per_s);
  // The fewest stages within the margin of the fastest; of those, the fastest.
  const Priced* chosen = nullptr;
  for (const Priced& f : fitting) {
    if (f.c.tokens_per_s * (1 + kSelectionMargin) < fastest) continue;
    if (!chosen || f.stages.size() < chosen->stages.size() ||
        (f.stages.size() == chosen->stages.size() && f.c.tokens_per_s > chosen->c.tokens_per_s))
      chosen = &f;
  }
  out.plan = evaluate(cost, chosen->stages,
                      chosen->stages.size() == 1 ? "generation: one device" : "generation: split");
  out.predicted = chosen->c;
  out.plan.seconds = 1 / chosen->c.tokens_per_s;
  out.plan.samples_per_s = chosen->c.tokens_per_s;
  out.plan.bottleneck = chosen->c.paced_by;
  return out;
}

}  // namespace tandem::partitioner
