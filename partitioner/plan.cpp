#include "partitioner/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/yaml_reader.h"
#include "partitioner/simulate.h"

namespace tandem::partitioner {

namespace {

// The stages name every layer once, in order, on devices that exist, none used twice, a
// stage's replicas of one kind; an interleaved plan's chunks on their stage's device.
void checkStages(const CostModel& cost, const std::vector<Assignment>& stages,
                 const std::string& algorithm, const std::vector<LinkCodec>& links, int chunks) {
  const Problem& problem = cost.problem();
  TANDEM_CHECK_MSG(!stages.empty(), InvalidArgument, algorithm << ": a plan with no stages");
  const int n = static_cast<int>(stages.size());
  TANDEM_CHECK_MSG(chunks >= 1 && n % chunks == 0, InvalidArgument,
                   algorithm << ": " << n << " model chunks are not " << chunks << " per stage");
  // The stages (an interleaved plan's: its chunks' devices, chunk k on k % p's).
  const int p = n / chunks;
  TANDEM_CHECK_MSG(chunks == 1 || (p >= 2 && cost.training()), InvalidArgument,
                   algorithm << ": interleaved chunks need 2 stages or more and training");
  size_t expect = 0;
  std::set<int> used;
  for (int s = 0; s < n; ++s) {
    const Assignment& a = stages[static_cast<size_t>(s)];
    TANDEM_CHECK_MSG(
        a.begin == expect && a.end > a.begin && a.end <= cost.layers(), InvalidArgument,
        algorithm << ": stage " << s << " has layers [" << a.begin << ", " << a.end
                  << ") but should start at layer " << expect << " of " << cost.layers());
    TANDEM_CHECK_MSG(!a.devices.empty(), InvalidArgument,
                     algorithm << ": stage " << s << " has no device");
    expect = a.end;
    if (s >= p) {  // a later chunk of stage s % p: on its device
      TANDEM_CHECK_MSG(a.devices == stages[static_cast<size_t>(s % p)].devices, InvalidArgument,
                       algorithm << ": chunk " << s << " is not on stage " << s % p << "'s device");
      continue;
    }
    TANDEM_CHECK_MSG(chunks == 1 || a.devices.size() == 1, InvalidArgument,
                     algorithm << ": interleaved stages cannot have replicas (stage " << s << ")");
    if (a.tensor) {
      TANDEM_CHECK_MSG(a.devices.size() >= 2 && chunks == 1 && cost.training(), InvalidArgument,
                       algorithm << ": stage " << s
                                 << " is tensor-split: 2 ranks or more, not interleaved, for "
                                    "training");
      for (int d : a.devices)
        TANDEM_CHECK_MSG(d >= 0 && static_cast<size_t>(d) < problem.devices.size() &&
                             problem.devices[static_cast<size_t>(d)].node ==
                                 problem.devices[static_cast<size_t>(a.devices.front())].node,
                         InvalidArgument,
                         algorithm << ": stage " << s
                                   << " is tensor-split over devices of two nodes (its "
                                   << "ranks are threads of one process)");
      TANDEM_CHECK_MSG(
          !a.shares.empty() ||
              std::all_of(a.devices.begin(), a.devices.end(),
                          [&](int d) { return cost.typeOf(d) == cost.typeOf(a.devices.front()); }),
          InvalidArgument,
          algorithm << ": stage " << s << " is tensor-split over devices of "
                    << "different kinds without shares");
    }
    TANDEM_CHECK_MSG(a.shares.empty() || a.shares.size() == a.devices.size(), InvalidArgument,
                     algorithm << ": stage " << s << " has " << a.shares.size() << " shares for "
                               << a.devices.size() << " replicas");
    for (const double share : a.shares)
      TANDEM_CHECK_MSG(share > 0 && std::isfinite(share), InvalidArgument,
                       algorithm << ": stage " << s << " has a replica's share of " << share);
    for (int d : a.devices) {
      TANDEM_CHECK_MSG(d >= 0 && static_cast<size_t>(d) < problem.devices.size(), InvalidArgument,
                       algorithm << ": stage " << s << " names device " << d);
      TANDEM_CHECK_MSG(used.insert(d).second, InvalidArgument,
                       algorithm << ": device " << problem.devices[static_cast<size_t>(d)].name
                                 << " is used twice");
      TANDEM_CHECK_MSG(!a.shares.empty() || cost.typeOf(d) == cost.typeOf(a.devices.front()),
                       InvalidArgument,
                       algorithm << ": stage " << s << " replicates over devices of different "
                                 << "kinds (" << problem.devices[static_cast<size_t>(d)].name
                                 << ", " << problem.devices[static_cast<size_t>(a.devices[0])].name
                                 << ") without shares");
    }
  }
  TANDEM_CHECK_MSG(expect == cost.layers(), InvalidArgument,
                   algorithm << ": the stages end at layer " << expect << " of " << cost.layers());
  TANDEM_CHECK_MSG(
      links.empty() || links.size() + 1 == stages.size(), InvalidArgument,
      algorithm << ": " << links.size() << " link codecs for " << stages.size() << " stages");
}

// Each of a stage's devices (its replicas or tensor ranks, `what` each) needing need(r)
// bytes: the stage's memory the most of them, and "" when each fits and runs the stage's
// layers, else what the first that does not is short of.
std::string checkEachDevice(const CostModel& cost, const Assignment& a, const char* what,
                            const std::function<int64_t(size_t)>& need, PlanStage& st) {
  std::ostringstream short_of;
  for (size_t r = 0; r < a.devices.size(); ++r) {
    const int type = cost.typeOf(a.devices[r]);
    const int64_t bytes = need(r);
    st.memory_bytes = std::max(st.memory_bytes, bytes);
    const int64_t have = cost.types()[static_cast<size_t>(type)].memory_bytes;
    const std::string& name = cost.problem().devices[static_cast<size_t>(a.devices[r])].name;
    const std::string lacks = cost.lacking(type, a.begin, a.end);
    if (!short_of.str().empty()) continue;
    if (bytes > have)
      short_of << what << " " << r << " (layers [" << a.begin << ", " << a.end << ")) needs "
               << bytes << " bytes on " << name << ", which has " << have;
    else if (!lacks.empty())
      short_of << what << " " << r << " runs on " << name << ", which cannot run " << lacks;
  }
  return short_of.str();
}

// An unequal replicated stage (Assignment::shares) priced: its compute per microbatch (the
// slowest replica's part of a round, with the ring allreduce and the slowest update
// spread over the microbatches), and each replica's memory at its own microbatch size,
// checked against its own device ("" when all fit, else what is short).
std::string priceUnequal(const CostModel& cost, const Assignment& a, int held, int stages,
                         PlanStage& st) {
  const std::vector<int> types = cost.typesOf(a.devices);
  const CostModel::Pace pace = cost.pace(types, a.shares, a.begin, a.end);
  st.allreduce_s = cost.allreduce(types, a.begin, a.end);
  st.update_s = cost.update(types, a.begin, a.end);
  st.compute_s =
      cost.compute(types[static_cast<size_t>(pace.replica)], a.begin, a.end) * pace.factor +
      (st.allreduce_s + st.update_s) / static_cast<double>(cost.options().microbatches);
  const std::vector<double> sizes = CostModel::replicaSizes(a.shares);
  const auto k = static_cast<int>(types.size());
  return checkEachDevice(
      cost, a, "replica",
      [&](size_t r) { return cost.memory(a.begin, a.end, held, k, stages, sizes[r]); }, st);
}

// A tensor-split stage (Assignment::tensor) priced: its ranks' compute per microbatch (each
// layer its slowest rank's part, the group's all-reduces within), the slowest rank's update
// spread over the microbatches, and each rank's memory against its own device ("" when all
// fit and run their layers, else what is short).
std::string priceTensor(const CostModel& cost, const Assignment& a, int held, int stages,
                        PlanStage& st) {
  const std::vector<int> types = cost.typesOf(a.devices);
  const CostModel::TensorStage t = cost.tensorStage(types, a.shares, a.begin, a.end);
  const bool runs =
      std::all_of(types.begin(), types.end(), [&](int u) { return cost.runs(u, a.begin, a.end); });
  st.update_s = t.update;
  st.tensor_allreduce_s = t.allreduce_forward + (cost.training() ? t.allreduce_backward : 0);
  st.compute_s = runs && t.splits ? t.compute(cost.training()) +
                                        t.update / static_cast<double>(cost.options().microbatches)
                                  : std::numeric_limits<double>::infinity();
  if (!t.splits)
    return "(layers [" + std::to_string(a.begin) + ", " + std::to_string(a.end) +
           ")) holds nothing to tensor-split";
  double total = 0;
  for (const double x : a.shares) total += x;
  return checkEachDevice(
      cost, a, "rank",
      [&](size_t r) {
        const double part =
            a.shares.empty() ? 1.0 / static_cast<double>(types.size()) : a.shares[r] / total;
        return cost.memory(a.begin, a.end, held, 1, stages) -
               static_cast<int64_t>(static_cast<double>(t.split_state) * (1 - part));
      },
      st);
}

}  // namespace

Plan evaluate(const CostModel& cost, const std::vector<Assignment>& stages,
              const std::string& algorithm, const std::vector<LinkCodec>& links, int chunks) {
  const Problem& problem = cost.problem();
  Plan plan;
  plan.algorithm = algorithm;
  plan.objective = problem.options.objective;
  plan.chunks = chunks;
  checkStages(cost, stages, algorithm, links, chunks);
  const int n = static_cast<int>(stages.size());
  const int p = n / chunks;
  const CostOptions& o = cost.options();
  const LinkCodec fixed{o.activation_codec, o.gradient_codec, o.activation_ratio, o.gradient_ratio};

  const bool latency = plan.objective == Objective::kInferLatency;
  plan.seconds = latency ? cost.sourceLink(cost.typeOf(stages[0].devices[0])) : 0;
  plan.bottleneck = latency ? "sum" : "";
  // Per stage (an interleaved one: over its chunks): compute per microbatch, memory.
  std::vector<double> compute(static_cast<size_t>(p), 0), link(static_cast<size_t>(p), 0);
  std::vector<int64_t> memory(static_cast<size_t>(p), 0);
  for (int s = 0; s < n; ++s) {
    const Assignment& a = stages[static_cast<size_t>(s)];
    const int t = cost.typeOf(a.devices.front());
    const int k = static_cast<int>(a.devices.size());
    PlanStage st;
    st.at = a;
    st.next = s + 1 < n && !links.empty() ? links[static_cast<size_t>(s)] : fixed;
    const int at = s % p;
    const int held = chunks == 1
                         ? p - s
                         : static_cast<int>(std::min<int64_t>(interleavedWarmup(at, p, chunks) + 1,
                                                              o.microbatches * chunks));
    // A tensor-split stage (one worker over its ranks) or unequal replicas are priced per
    // device; equal replicas as their type.
    if (a.tensor || !a.shares.empty()) {
      if (const std::string why =
              a.tensor ? priceTensor(cost, a, held, p, st) : priceUnequal(cost, a, held, p, st);
          !why.empty() && plan.infeasible.empty())
        plan.infeasible = "stage " + std::to_string(s) + " " + why;
    } else {
      st.compute_s = cost.stage(t, a.begin, a.end, k);
      st.allreduce_s = cost.allreduce(t, a.begin, a.end, k);
      if (cost.training()) st.update_s = cost.update(t, a.begin, a.end);
      st.memory_bytes = cost.memory(a.begin, a.end, held, k, p);
      if (const std::string lacks = cost.lacking(t, a.begin, a.end);
          !lacks.empty() && plan.infeasible.empty())
        plan.infeasible = "stage " + std::to_string(s) + " runs on " +
                          problem.devices[static_cast<size_t>(a.devices.front())].name +
                          ", which cannot run " + lacks;
    }
    if (s + 1 < n)
      st.link_s = cost.link(a.end, t, cost.typeOf(stages[s + 1].devices.front()),
                            st.next.activation_ratio, st.next.gradient_ratio);
    compute[static_cast<size_t>(at)] += st.compute_s;
    link[static_cast<size_t>(at)] += st.link_s;
    memory[static_cast<size_t>(at)] += st.memory_bytes;
    if (latency) plan.seconds += st.compute_s + st.link_s;
    plan.stages.push_back(std::move(st));
  }
  for (int s = 0; s < p; ++s) {
    const Assignment& a = stages[static_cast<size_t>(s)];
    const int t = cost.typeOf(a.devices.front());
    const int64_t have = cost.types()[static_cast<size_t>(t)].memory_bytes;
    if (a.shares.empty() && !a.tensor && memory[static_cast<size_t>(s)] > have &&
        plan.infeasible.empty()) {
      std::ostringstream os;
      os << "stage " << s << " (layers [" << a.begin << ", "
         << stages[static_cast<size_t>(s + (chunks - 1) * p)].end << ")"
         << (chunks > 1 ? " in " + std::to_string(chunks) + " chunks" : "") << ") needs "
         << memory[static_cast<size_t>(s)] << " bytes on "
         << problem.devices[static_cast<size_t>(a.devices.front())].name << ", which has " << have;
      plan.infeasible = os.str();
    }
    if (latency) continue;
    if (compute[static_cast<size_t>(s)] > plan.seconds || plan.bottleneck.empty()) {
      plan.seconds = compute[static_cast<size_t>(s)];
      plan.bottleneck = "stage " + std::to_string(s) + " compute";
    }
    if (link[static_cast<size_t>(s)] > plan.seconds) {
      plan.seconds = link[static_cast<size_t>(s)];
      plan.bottleneck =
          "link " + std::to_string(s) + " -> " + std::to_string(s + 1 < p ? s + 1 : 0);
    }
  }
  const bool runs = std::isfinite(plan.seconds);  // every stage runs its layers
  if (cost.training() && !runs) {
    plan.step_s = plan.seconds;
  } else if (cost.training()) {
    const StepPrediction step = predictStep(cost, plan);
    plan.step_s = step.step_s;
    plan.samples_per_s = step.samples_per_s;
  } else {
    plan.samples_per_s =
        plan.seconds > 0 ? static_cast<double>(cost.options().microbatch_size) / plan.seconds : 0;
  }
  return plan;
}

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// A YAML double-quoted scalar.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out + "\"";
}

}  // namespace

std::vector<PlanStageSpec> planStageSpecs(const CostModel& cost, const Plan& plan,
                                          const std::string& where) {
  const Problem& problem = cost.problem();
  std::vector<PlanStageSpec> out;
  for (const PlanStage& st : plan.stages) {
    PlanStageSpec spec;
    spec.begin = st.at.begin;
    spec.end = st.at.end;
    for (const int d : st.at.devices)
      spec.devices.push_back(problem.devices[static_cast<size_t>(d)].name);
    const DeviceCosts& first = problem.devices[static_cast<size_t>(st.at.devices.front())];
    spec.backend = first.backend;
    if (st.at.devices.size() > 1)  // each replica's own (two GPUs: opencl:0, opencl:1)
      for (const int d : st.at.devices)
        spec.backends.push_back(problem.devices[static_cast<size_t>(d)].backend);
    if (&st != &plan.stages.back()) {
      spec.activation_codec = st.next.activations;
      spec.gradient_codec = st.next.gradients;
    }
    spec.threads = first.threads;
    spec.shares = st.at.shares;
    spec.tensor = st.at.tensor;
    spec.compute_s = st.compute_s;
    spec.allreduce_s = st.allreduce_s;
    spec.update_s = st.update_s;
    spec.where = where;
    out.push_back(std::move(spec));
  }
  return out;
}

std::string planToYaml(const CostModel& cost, const Plan& plan) {
  const Problem& problem = cost.problem();
  std::ostringstream os;
  os << "# A tandem plan (docs/partitioner.md). `partition: <this file>` in a job runs it.\n"
     << "objective: " << objectiveName(plan.objective) << "\n"
     << "algorithm: " << plan.algorithm << "\n"
     << "microbatch_size: " << cost.options().microbatch_size << "\n"
     << "microbatches: " << cost.options().microbatches << "\n"
     << "predicted: {bottleneck: " << plan.bottleneck << ", seconds: " << number(plan.seconds);
  if (plan.step_s > 0) os << ", step_s: " << number(plan.step_s);
  os << ", samples_per_s: " << number(plan.samples_per_s) << "}\n";
  if (!plan.left_out.empty()) {
    os << "left_out:\n";
    for (const LeftOut& l : plan.left_out)
      os << "  - {device: " << problem.devices[static_cast<size_t>(l.device)].name
         << ", reason: " << quoted(l.reason) << "}\n";
  }
  if (plan.chunks > 1)
    os << "# Interleaved: the stages below are " << plan.chunks << " model chunks for each of "
       << plan.stages.size() / static_cast<size_t>(plan.chunks)
       << " stages, chunk k on stage k % stages (a job runs it with 'schedule: interleaved' and "
       << "'chunks: " << plan.chunks << "').\nchunks: " << plan.chunks << "\n";
  os << "stages:\n";
  const std::vector<PlanStageSpec> specs = planStageSpecs(cost, plan, "");
  auto list = [&](const std::vector<std::string>& names) {
    for (size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << names[i];
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    const PlanStageSpec& spec = specs[i];
    const PlanStage& st = plan.stages[i];
    os << "  - layers: [" << spec.begin << ", " << spec.end << "]\n    devices: [";
    list(spec.devices);
    os << "]\n    backend: " << spec.backend;
    if (!spec.backends.empty()) {
      os << "\n    backends: [";
      list(spec.backends);
      os << "]";
    }
    if (!spec.shares.empty()) {
      os << "\n    shares: [";
      for (size_t r = 0; r < spec.shares.size(); ++r)
        os << (r ? ", " : "") << number(spec.shares[r]);
      os << "]";
    }
    if (spec.tensor)
      os << "\n    tensor: true\n    tensor_allreduce_s: " << number(st.tensor_allreduce_s);
    if (!spec.activation_codec.empty())
      os << "\n    codec: {activations: " << spec.activation_codec
         << ", gradients: " << spec.gradient_codec << "}";
    os << "\n    threads: " << spec.threads << "\n    compute_s: " << number(spec.compute_s)
       << "\n    allreduce_s: " << number(spec.allreduce_s)
       << "\n    update_s: " << number(spec.update_s) << "\n    link_s: " << number(st.link_s)
       << "\n    memory_bytes: " << st.memory_bytes << "\n";
  }
  return os.str();
}

std::vector<PlanStageSpec> parsePlan(const std::string& yaml_text, const std::string& source,
                                     int* chunks) {
  const YamlReader r(source);
  const YAML::Node root = r.load(yaml_text);
  if (!root.IsMap()) throw InvalidArgument(source + ": a plan is a map with 'stages'");
  const YAML::Node stages = root["stages"];
  if (!stages) throw InvalidArgument(source + ": a plan needs 'stages'");
  if (!stages.IsSequence() || stages.size() == 0)
    r.fail(stages, "'stages' must be a list of {layers, devices, backend, threads}");
  int per = 1;
  if (const YAML::Node c = root["chunks"]) {
    const int64_t v = r.positive(c, "chunks");
    if (v < 2 || v > 64) r.fail(c, "'chunks' must be from 2 to 64");
    per = static_cast<int>(v);
    if (stages.size() % static_cast<size_t>(per) != 0 ||
        stages.size() / static_cast<size_t>(per) < 2)
      r.fail(c, "the plan lists " + std::to_string(stages.size()) + " stages, not " +
                    std::to_string(per) + " chunks for each of 2 stages or more");
  }
  if (chunks) *chunks = per;
  std::vector<PlanStageSpec> out;
  for (const YAML::Node& st : stages) {
    if (!st.IsMap()) r.fail(st, "a stage is a map {layers: [begin, end], devices, backend}");
    PlanStageSpec spec;
    spec.where = r.at(st);
    bool have_layers = false;
    YAML::Node backends, shares;
    for (const auto& kv : st) {
      const std::string key = kv.first.as<std::string>();
      const YAML::Node& v = kv.second;
      if (key == "layers") {
        if (!v.IsSequence() || v.size() != 2) r.fail(v, "'layers' is a range [begin, end]");
        const auto b = r.get<long long>(v[0], "begin", "a layer index");
        const auto e = r.get<long long>(v[1], "end", "a layer index");
        if (b < 0 || e <= b)
          r.fail(v, "layer range [" + std::to_string(b) + ", " + std::to_string(e) +
                        ") is empty or negative");
        spec.begin = static_cast<size_t>(b);
        spec.end = static_cast<size_t>(e);
        have_layers = true;
      } else if (key == "devices") {
        if (!v.IsSequence() || v.size() == 0) r.fail(v, "'devices' is a list of device names");
        for (const YAML::Node& d : v) spec.devices.push_back(r.get<std::string>(d, key, "a name"));
      } else if (key == "backend") {
        spec.backend = r.get<std::string>(v, key, "a device such as cpu or opencl:0");
      } else if (key == "backends") {
        if (!v.IsSequence() || v.size() == 0)
          r.fail(v, "'backends' is a list of devices such as cpu or opencl:0, one per replica");
        for (const YAML::Node& b : v)
          spec.backends.push_back(r.get<std::string>(b, key, "a device such as opencl:0"));
        backends = v;
      } else if (key == "threads") {
        spec.threads = static_cast<int>(r.positive(v, key));
      } else if (key == "shares") {
        if (!v.IsSequence() || v.size() == 0)
          r.fail(v, "'shares' is a list of numbers, one per replica");
        for (const YAML::Node& s : v) {
          const auto share = r.get<double>(s, key, "a positive number");
          if (!(share > 0 && share <= 1e9)) r.fail(s, "a replica's share must be in (0, 1e9]");
          spec.shares.push_back(share);
        }
        shares = v;
      } else if (key == "codec") {
        if (!v.IsMap()) r.fail(v, "'codec' is a map {activations: ..., gradients: ...}");
        for (const auto& c : v) {
          const std::string which = c.first.as<std::string>();
          const auto name = r.get<std::string>(c.second, which, "fp32, fp16, bf16 or int8");
          if (name != "fp32" && name != "fp16" && name != "bf16" && name != "int8")
            r.fail(c.second, "unknown codec '" + name + "' (expected fp32, fp16, bf16 or int8)");
          if (which == "activations")
            spec.activation_codec = name;
          else if (which == "gradients")
            spec.gradient_codec = name;
          else
            r.fail(c.first,
                   "unknown codec key '" + which + "' (expected activations or gradients)");
        }
      } else if (key == "compute_s") {
        spec.compute_s = r.nonNegative(v, key);
      } else if (key == "allreduce_s") {
        spec.allreduce_s = r.nonNegative(v, key);
      } else if (key == "update_s") {
        spec.update_s = r.nonNegative(v, key);
      } else if (key == "tensor") {
        spec.tensor = r.get<bool>(v, key, "true or false");
      } else if (key == "link_s" || key == "memory_bytes" || key == "tensor_allreduce_s") {
        r.nonNegative(v, key);
      } else {
        r.fail(kv.first, "unknown stage key '" + key +
                             "' (expected layers, devices, backend, backends, threads, shares, "
                             "tensor, codec, compute_s, allreduce_s, update_s, link_s, "
                             "tensor_allreduce_s or memory_bytes)");
      }
    }
    if (!have_layers) r.fail(st, "the stage has no 'layers'");
    if (spec.devices.empty()) r.fail(st, "the stage has no 'devices'");
    if (spec.backend.empty()) r.fail(st, "the stage has no 'backend'");
    if (!spec.backends.empty() && spec.backends.size() != spec.devices.size())
      r.fail(backends, "'backends' lists " + std::to_string(spec.backends.size()) +
                           " devices for the stage's " + std::to_string(spec.devices.size()) +
                           " replicas");
    if (spec.tensor && spec.devices.size() < 2)
      r.fail(st, "a tensor-split stage names its 2 ranks or more in 'devices'");
    if (!spec.shares.empty() && spec.shares.size() != spec.devices.size())
      r.fail(shares, "'shares' lists " + std::to_string(spec.shares.size()) +
                         " shares for the stage's " + std::to_string(spec.devices.size()) +
                         " replicas");
    out.push_back(std::move(spec));
  }
  return out;
}

}  // namespace tandem::partitioner
