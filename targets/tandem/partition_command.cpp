// tandem partition: the partitioner's plan for a model on a cluster, from measured
// profiles, printed as a table beside the equal-layer, equal-parameter and
// memory-proportional splits (their predicted speed under the same cost model), and
// optionally written as a plan file that a job can name as its partition.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/file.h"
#include "core/model_spec.h"
#include "core/pipeline/schedule.h"
#include "partitioner/search.h"
#include "runtime/job/model_source.h"
#include "runtime/job/planning.h"
#include "targets/tandem/commands.h"

namespace tandem::cli {

namespace {

// Devices a plan uses: every replica of every stage.
size_t devicesUsed(const partitioner::Plan& plan) {
  std::set<int> used;  // (an interleaved plan's chunks share their stage's devices)
  for (const partitioner::PlanStage& s : plan.stages)
    used.insert(s.at.devices.begin(), s.at.devices.end());
  return used.size();
}

struct PartitionArgs {
  std::string model, cluster, profile, out;
  std::string objective = "train", schedule = "1f1b", algorithm = "auto";
  std::string codec = "fp32", gradient_codec = "fp32", optimizer = "sgd", source;
  std::string baseline;  // write this baseline as the plan instead of the search's
  std::string evaluate;  // price this plan file instead of searching
  int64_t batch = 64, microbatches = 4;
  float momentum = 0.9f;
  bool recompute = false;
  int max_replicas = 1;
  int max_tensor = runtime::kDefaultMaxTensor;  // as a job's `max_tensor:`
  int chunks = 2;                               // --schedule interleaved: model chunks per stage
};

// A plan file's split (its stages' layers and devices, by name) priced on `cost`: its
// predictions made anew. InvalidArgument naming the plan's line for a device the cluster
// does not have.
partitioner::Plan givenPlan(const partitioner::CostModel& cost, const std::string& path) {
  const auto& devices = cost.problem().devices;
  const partitioner::CostOptions& o = cost.options();
  std::vector<partitioner::Assignment> stages;
  // Each link's codecs as the plan states them (else the options'), priced by their ratios.
  std::vector<partitioner::LinkCodec> links;
  int chunks = 1;
  const auto specs = partitioner::parsePlan(readFile(path, "plan file"), path, &chunks);
  for (size_t s = 0; s + 1 < specs.size(); ++s) {
    partitioner::LinkCodec l{o.activation_codec, o.gradient_codec, o.activation_ratio,
                             o.gradient_ratio};
    if (!specs[s].activation_codec.empty()) {
      l.activations = specs[s].activation_codec;
      l.activation_ratio = runtime::codecRatio(l.activations);
    }
    if (!specs[s].gradient_codec.empty()) {
      l.gradients = specs[s].gradient_codec;
      l.gradient_ratio = runtime::codecRatio(l.gradients);
    }
    links.push_back(std::move(l));
  }
  for (const partitioner::PlanStageSpec& s : specs) {
    partitioner::Assignment a{s.begin, s.end, {}, s.shares, s.tensor};
    for (const std::string& name : s.devices) {
      int found = -1;
      for (size_t d = 0; d < devices.size(); ++d)
        if (devices[d].name == name) found = static_cast<int>(d);
      TANDEM_CHECK_MSG(
          found >= 0, InvalidArgument,
          s.where << ": device '" << name << "' is not one of the cluster's (named node/device)");
      a.devices.push_back(found);
    }
    stages.push_back(std::move(a));
  }
  return partitioner::evaluate(cost, stages, "given", links, chunks);
}

void printPlan(const partitioner::CostModel& cost, const partitioner::Plan& plan) {
  const auto& devices = cost.problem().devices;
  std::printf("%-6s %-10s %-24s %11s %12s %9s %14s %12s  %s\n", "stage", "layers", "devices",
              "compute ms", "allreduce ms", "link ms", "memory MiB", "device MiB",
              "link codecs (activations/gradients)");
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const partitioner::PlanStage& st = plan.stages[s];
    // Replicas "a,b"; tensor ranks "a+b".
    std::string names;
    for (int d : st.at.devices)
      names += (names.empty()  ? ""
                : st.at.tensor ? "+"
                               : ",") +
               devices[static_cast<size_t>(d)].name;
    const std::string range =
        "[" + std::to_string(st.at.begin) + ", " + std::to_string(st.at.end) + ")";
    const std::string codecs =
        s + 1 < plan.stages.size() ? st.next.activations + "/" + st.next.gradients : "-";
    std::printf("%-6zu %-10s %-24s %11.3f %12.3f %9.3f %14.1f %12.1f  %s\n", s, range.c_str(),
                names.c_str(), st.compute_s * 1e3, st.allreduce_s * 1e3, st.link_s * 1e3,
                static_cast<double>(st.memory_bytes) / (1 << 20),
                static_cast<double>(devices[static_cast<size_t>(st.at.devices[0])].memory_bytes) /
                    (1 << 20),
                codecs.c_str());
  }
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const partitioner::PlanStage& st = plan.stages[s];
    if (!st.at.tensor) continue;
    static const char* const kind[] = {"whole", "column", "row", "slice", "split"};
    const std::vector<partitioner::TensorKind> roles = cost.tensorRoles(st.at.begin, st.at.end);
    std::string what;
    for (size_t i = 0; i < roles.size(); ++i)
      what += (i ? ", " : "") + std::to_string(st.at.begin + i) + " " +
              cost.problem().layers[st.at.begin + i].type + " " +
              kind[static_cast<size_t>(roles[i])];
    std::string shares = "equal shares";
    if (!st.at.shares.empty()) {
      shares = "feature shares";
      for (size_t r = 0; r < st.at.shares.size(); ++r) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%.3g", r ? " : " : " ", st.at.shares[r]);
        shares += buf;
      }
    }
    std::printf("stage %zu: %zu tensor ranks (%s), all-reduces %.3f ms per microbatch: %s\n", s,
                st.at.devices.size(), shares.c_str(), st.tensor_allreduce_s * 1e3, what.c_str());
  }
}

// The cost model's options from the command's: the objective, the schedule searched
// under, microbatches, the optimizer's state, the links' codecs (as a job states them).
partitioner::CostOptions costOptions(const PartitionArgs& a, ScheduleKind kind) {
  partitioner::CostOptions o;
  o.objective = partitioner::parseObjective(a.objective);
  TANDEM_CHECK_MSG(
      isTraining(kind), InvalidArgument,
      "--schedule " << a.schedule << ": the partitioner costs gpipe, 1f1b, zb-h1 or interleaved");
  // Interleaved stages are the 1F1B plan's, each cut into chunks: searched under 1F1B.
  o.schedule = kind == ScheduleKind::kInterleaved1F1B ? ScheduleKind::k1F1B : kind;
  // As a job cuts it: microbatch sizes differ by one; the largest is priced.
  TANDEM_CHECK_MSG(a.microbatches <= a.batch, InvalidArgument,
                   "--microbatches " << a.microbatches << " exceeds --batch " << a.batch
                                     << ": a microbatch holds a sample at least");
  o.microbatches = a.microbatches;
  o.microbatch_size = (a.batch + a.microbatches - 1) / a.microbatches;
  o.recompute = a.recompute;
  o.optimizer_state_per_param = runtime::optimizerStatePerParam(a.optimizer, a.momentum);
  o.optimizer = a.optimizer;
  {  // the job's rules: "auto" chooses each link's codec
    runtime::JobSpec codecs;
    codecs.activations_auto = a.codec == "auto";
    codecs.gradients_auto = a.gradient_codec == "auto";
    if (!codecs.activations_auto) codecs.wire.activations = parseWireCodec(a.codec);
    if (!codecs.gradients_auto) codecs.wire.gradients = parseWireCodec(a.gradient_codec);
    const partitioner::CostOptions c = runtime::jobCostOptions(codecs);
    o.activation_ratio = c.activation_ratio;
    o.gradient_ratio = c.gradient_ratio;
    o.activation_codec = c.activation_codec;
    o.gradient_codec = c.gradient_codec;
    o.choose_activation_codec = c.choose_activation_codec;
    o.choose_gradient_codec = c.choose_gradient_codec;
    o.codecs = c.codecs;
  }
  o.max_replicas = a.max_replicas;
  o.max_tensor = kind == ScheduleKind::kInterleaved1F1B ? 1 : a.max_tensor;
  return o;
}

void runPartition(const PartitionArgs& a) {
  if (!a.out.empty()) checkWritable(a.out, "plan");
  const Model model(runtime::readModelSource(a.model).spec);
  const ScheduleKind kind = parseSchedule(a.schedule);
  const partitioner::CostOptions o = costOptions(a, kind);
  const bool interleaved = kind == ScheduleKind::kInterleaved1F1B;
  partitioner::CostModel cost = runtime::loadCostModel(model, a.cluster, a.profile, o);
  if (!a.source.empty()) {
    const auto& devs = cost.problem().devices;
    int source = -1;
    for (size_t d = 0; d < devs.size(); ++d)
      if (devs[d].name == a.source) source = static_cast<int>(d);
    TANDEM_CHECK_MSG(source >= 0, InvalidArgument,
                     "--source " << a.source << " is not a device of " << a.cluster
                                 << " (devices are named node/device)");
    partitioner::Problem p = cost.problem();
    p.options.source = source;
    cost = partitioner::CostModel(std::move(p));
  }

  TANDEM_CHECK_MSG(a.evaluate.empty() || a.baseline.empty(), InvalidArgument,
                   "--evaluate prices a given plan; --baseline makes one: give one of them");
  const auto start = std::chrono::steady_clock::now();
  partitioner::SearchOptions so;
  so.algorithm = a.algorithm;
  partitioner::Plan plan =
      a.evaluate.empty() ? partitioner::choosePlan(cost, so) : givenPlan(cost, a.evaluate);
  if (interleaved && a.evaluate.empty()) {
    TANDEM_CHECK_MSG(
        a.baseline.empty(), InvalidArgument,
        "--baseline " << a.baseline << ": a baseline split is one range per stage, not chunks");
    partitioner::Problem chunked = cost.problem();
    chunked.options.schedule = kind;
    cost = partitioner::CostModel(std::move(chunked));
    TANDEM_CHECK_MSG(plan.stages.size() >= 2, InvalidArgument,
                     "--schedule interleaved: the plan is one stage ("
                         << plan.stages.front().at.end << " layers on one device), which has "
                         << "nothing to interleave");
    plan = partitioner::interleavedPlan(cost, plan, a.chunks);
  }
  const double planning_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::vector<partitioner::Plan> baselines = partitioner::baselinePlans(cost);
  const partitioner::Plan searched = plan;
  if (!a.baseline.empty()) {
    for (const partitioner::Plan& b : baselines)
      if (b.algorithm == a.baseline) plan = b;
    TANDEM_CHECK_MSG(plan.infeasible.empty(), InvalidArgument,
                     "the " << a.baseline << " split does not fit: " << plan.infeasible);
  }

  const bool latency = o.objective == partitioner::Objective::kInferLatency;
  const bool training = o.objective == partitioner::Objective::kTrainThroughput;
  // Training plans compare by their predicted step, serving ones by their pace.
  auto time = [&](const partitioner::Plan& p) { return training ? p.step_s : p.seconds; };
  std::printf("plan for %s on %s (%s, %s%s, %zu of %zu devices, %lld microbatches of %lld)\n",
              model.name().c_str(), a.cluster.c_str(), a.objective.c_str(), plan.algorithm.c_str(),
              !a.evaluate.empty()  ? " plan file"
              : a.baseline.empty() ? " search"
                                   : " baseline",
              devicesUsed(plan), cost.problem().devices.size(),
              static_cast<long long>(o.microbatches), static_cast<long long>(o.microbatch_size));
  if (plan.chunks > 1)
    std::printf("interleaved: %zu stages of %d chunks, chunk k on stage k %% %zu\n",
                plan.stages.size() / static_cast<size_t>(plan.chunks), plan.chunks,
                plan.stages.size() / static_cast<size_t>(plan.chunks));
  printPlan(cost, plan);
  std::printf("predicted: %s%.3f ms per microbatch (%s)", latency ? "latency " : "",
              plan.seconds * 1e3, plan.bottleneck.c_str());
  if (training)
    std::printf(", a training step %.3f ms (its schedule run with these times: fill and drain)",
                plan.step_s * 1e3);
  std::printf(", %.0f samples/s\n", plan.samples_per_s);
  for (const partitioner::LeftOut& l : plan.left_out)
    std::printf("  %s: %s\n", cost.problem().devices[static_cast<size_t>(l.device)].name.c_str(),
                l.reason.c_str());
  std::printf("planning took %.1f ms\n", planning_s * 1e3);
  if (a.evaluate.empty() && a.baseline.empty() && partitioner::splitsTensors(plan)) {
    // The choice beside the best plan that splits no layer.
    partitioner::Problem layers = cost.problem();
    layers.options.max_tensor = 1;
    const partitioner::CostModel layer_cost(std::move(layers));
    const partitioner::Plan layer_only = partitioner::choosePlan(layer_cost, so);
    std::printf("\nthe best layer-only plan (no tensor split), %s:\n",
                layer_only.algorithm.c_str());
    printPlan(layer_cost, layer_only);
    std::printf(
        "predicted: %.3f ms per microbatch (%s), a step %.3f ms, %.0f samples/s; "
        "the tensor-split plan's speedup %.2fx\n",
        layer_only.seconds * 1e3, layer_only.bottleneck.c_str(), layer_only.step_s * 1e3,
        layer_only.samples_per_s, time(layer_only) / time(plan));
  }
  std::printf("\n");
  std::printf("%-20s %14s %12s %12s %16s\n", "baseline", "ms/microbatch", "step ms", "samples/s",
              "plan's speedup");
  for (const partitioner::Plan& b : baselines) {
    if (!b.infeasible.empty()) {
      std::printf("%-20s does not fit: %s\n", b.algorithm.c_str(), b.infeasible.c_str());
      continue;
    }
    std::printf("%-20s %14.3f %12.3f %12.0f %15.2fx\n", b.algorithm.c_str(), b.seconds * 1e3,
                b.step_s * 1e3, b.samples_per_s, time(b) / time(searched));
  }
  if (!a.out.empty()) {
    std::ofstream out(a.out, std::ios::trunc);
    out << partitioner::planToYaml(cost, plan);
    TANDEM_CHECK_MSG(out.good(), IoError, "cannot write the plan to '" << a.out << "'");
    std::printf("\nwrote %s\n", a.out.c_str());
  }
}

}  // namespace

void addPartition(CLI::App& app) {
  auto a = std::make_shared<PartitionArgs>();
  CLI::App* c = app.add_subcommand(
      "partition", "Split a model's layers over a cluster's devices from measured profiles");
  c->add_option("--model", a->model, "Model spec (YAML), ONNX model (.onnx) or Hugging Face folder")
      ->required()
      ->check(CLI::ExistingPath);
  c->add_option("--cluster", a->cluster, "Cluster file (YAML): nodes, devices, links")
      ->required()
      ->check(CLI::ExistingFile);
  c->add_option("--profile", a->profile, "Profile (tandem profile --out) for devices without one")
      ->check(CLI::ExistingFile);
  c->add_option("--objective", a->objective, "train, infer (throughput) or latency")
      ->check(CLI::IsMember({"train", "infer", "latency"}));
  c->add_option("--batch", a->batch, "Samples per training step")->check(positiveNumber());
  c->add_option("--microbatches", a->microbatches, "Microbatches per step")
      ->check(positiveNumber());
  c->add_option("--schedule", a->schedule,
                "gpipe, 1f1b, zb-h1 or interleaved (the order of each stage's work, the stash "
                "it holds)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "zb-h1", "interleaved"}));
  c->add_option("--chunks", a->chunks, "interleaved: model chunks per stage")
      ->check(CLI::Range(2, 64));
  c->add_flag("--recompute", a->recompute, "Stash stage inputs only, recompute in backward");
  c->add_option("--optimizer", a->optimizer, "sgd or adamw (the state each parameter has)")
      ->check(CLI::IsMember({"sgd", "adamw"}));
  c->add_option("--momentum", a->momentum, "SGD momentum (0: no state)");
  c->add_option("--codec", a->codec,
                "Activations on the wire: fp32, fp16, bf16, int8, or auto (chosen per link)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16", "int8", "auto"}));
  c->add_option("--gradient-codec", a->gradient_codec, "Gradients on the wire (or auto)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16", "int8", "auto"}));
  c->add_option("--max-replicas", a->max_replicas, "Replicas a stage may have (data parallel)")
      ->check(CLI::Range(1, 64));
  c->add_option("--max-tensor", a->max_tensor,
                "Tensor ranks a stage may be split over, devices of one node (1: layer-wise "
                "only)")
      ->check(CLI::Range(1, 64));
  c->add_option("--source", a->source, "latency: the device (node/device) the input arrives at");
  c->add_option("--algorithm", a->algorithm, "auto, exact or heuristic")
      ->check(CLI::IsMember({"auto", "exact", "heuristic"}));
  c->add_option("--baseline", a->baseline,
                "Make the plan this baseline split instead (to run it for comparison)")
      ->check(CLI::IsMember({"equal-layers", "equal-params", "memory-proportional"}));
  c->add_option("--evaluate", a->evaluate,
                "Price this plan file's split (its layers and devices) instead of searching")
      ->check(CLI::ExistingFile);
  c->add_option("--out", a->out, "Write the plan (YAML) here");
  c->callback([a] { runPartition(*a); });
}

}  // namespace tandem::cli
