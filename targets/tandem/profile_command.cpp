// tandem profile: per device, each layer's forward and backward time, its activation
// and parameter bytes, the device's memory and a GEMM summary, as the JSON profile the
// partitioner reads (docs/profile.md).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "backends/registry.h"
#include "core/error.h"
#include "core/file.h"
#include "core/model_spec.h"
#include "core/profile/profile.h"
#include "partitioner/cluster.h"
#include "runtime/control/files.h"
#include "runtime/job/cluster_daemons.h"
#include "runtime/job/model_source.h"
#include "runtime/node/node_profile.h"
#include "targets/tandem/commands.h"

namespace tandem::cli {

namespace {

// A layer's arithmetic rate in one direction, and its share of the device's best measured
// sgemm rate: "70.2  68%"; "-" for a layer without weights (its FLOPs are not what bounds it).
std::string rate(double flops, double seconds, double sgemm, bool weights) {
  if (!weights || seconds <= 0 || flops <= 0) return "-";
  char buf[32];
  const double gflops = flops / seconds / 1e9;
  if (sgemm > 0) {
    std::snprintf(buf, sizeof buf, "%.1f %3.0f%%", gflops, 100 * gflops / sgemm);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f", gflops);
  }
  return buf;
}

// `batch`: the batch the layers were measured at. The GFLOP/s columns count a layer's
// forward FLOPs from its shapes (Layer::flops) and twice them backward (the input's and the
// weights' gradients; once for layer 0, whose input gradient is not computed), beside the
// best sgemm rate above.
void printDevice(const DeviceProfile& d, int64_t batch) {
  std::printf("\n%s (%s): %d units, %.1f GiB", d.device.name.c_str(), d.device.model.c_str(),
              d.device.compute_units, static_cast<double>(d.device.memory_bytes) / (1 << 30));
  if (d.batch > 0) std::printf(", measured at batch %lld", static_cast<long long>(d.batch));
  std::printf("\n");
  double sgemm = 0;
  for (const GemmPoint& g : d.gemm) {
    std::printf("  sgemm %lld: %.1f GFLOP/s\n", static_cast<long long>(g.n), g.gflops);
    sgemm = std::max(sgemm, g.gflops);
  }
  std::printf("  %-5s %-14s %12s %8s %12s %8s %12s %10s %13s %13s\n", "layer", "type", "forward ms",
              "spread", "backward ms", "spread", "activation", "params", "fwd GFLOP/s",
              "bwd GFLOP/s");
  double weighted_flops = 0, weighted_s = 0;
  for (const LayerProfile& l : d.layers) {
    auto spread = [](const Spread& s) { return s.median > 0 ? (s.max - s.min) / s.median : 0; };
    const bool weights = l.param_bytes > 0;
    const double fwd = static_cast<double>(l.flops) * static_cast<double>(batch);
    const double bwd = (l.index == 0 ? 1 : 2) * fwd;
    if (weights && l.flops > 0) {
      weighted_flops += fwd + bwd;
      weighted_s += l.forward.median + l.backward.median;
    }
    std::printf("  %-5lld %-14s %12.4f %7.0f%% %12.4f %7.0f%% %12lld %10lld %13s %13s\n",
                static_cast<long long>(l.index), l.type.c_str(), l.forward.median * 1e3,
                100 * spread(l.forward), l.backward.median * 1e3, 100 * spread(l.backward),
                static_cast<long long>(l.activation_bytes), static_cast<long long>(l.param_bytes),
                rate(fwd, l.forward.median, sgemm, weights).c_str(),
                rate(bwd, l.backward.median, sgemm, weights).c_str());
  }
  if (weighted_s > 0) {
    const double gflops = weighted_flops / weighted_s / 1e9;
    std::printf("  layers with weights, forward and backward: %.1f GFLOP/s", gflops);
    if (sgemm > 0) std::printf(", %.0f%% of sgemm", 100 * gflops / sgemm);
    std::printf("\n");
  }
  const Sustained& su = d.sustained;
  if (su.passes > 0) {
    std::printf(
        "  sustained: %.4f ms per pass over %.2f s (%d passes), %.4f ms in the layers' "
        "medians: x%.2f; %.2f cores",
        su.pass_s * 1e3, su.window_s, su.passes, su.burst_pass_s * 1e3, su.scale(), su.cpu_cores);
    if (su.quota_cores > 0) std::printf(" (cgroup quota %.2f)", su.quota_cores);
    // Under a quota the window's CPU per pass over the quota is the pass the quota allows:
    // beside the wall time, it says whether the process got the quota in full.
    if (su.cpu_pass_s > 0) {
      std::printf("; %.4f ms of CPU per pass", su.cpu_pass_s * 1e3);
      if (su.quota_cores > 0)
        std::printf(", %.4f ms over the quota", su.cpu_pass_s / su.quota_cores * 1e3);
    }
    std::printf("\n");
  }
}

// Per device and layer, this profile's medians over the earlier one's; the largest
// deviation tells how repeatable the measurement is on this machine.
void compare(const Profile& now, const Profile& before, const std::string& before_path) {
  TANDEM_CHECK_MSG(now.model == before.model && now.batch == before.batch, InvalidArgument,
                   before_path << " profiles model '" << before.model << "' at batch "
                               << before.batch << ", not '" << now.model << "' at batch "
                               << now.batch);
  std::printf("\nagainst %s (median now / median then):\n", before_path.c_str());
  for (const DeviceProfile& d : now.devices) {
    const DeviceProfile* old = nullptr;
    for (const DeviceProfile& o : before.devices)
      if (o.device.name == d.device.name) old = &o;
    if (!old || old->layers.size() != d.layers.size()) {
      std::printf("  %s: not in %s\n", d.device.name.c_str(), before_path.c_str());
      continue;
    }
    if (old->batchIn(before) != d.batchIn(now)) {
      std::printf("  %s: measured at batch %lld there, %lld here\n", d.device.name.c_str(),
                  static_cast<long long>(old->batchIn(before)),
                  static_cast<long long>(d.batchIn(now)));
      continue;
    }
    // Over all layers, and over those taking 1 ms or more (sub-millisecond layers are
    // dominated by launch and timer noise).
    double worst = 1, worst_big = 1;
    std::string worst_at = "-", worst_big_at = "-";
    for (size_t i = 0; i < d.layers.size(); ++i) {
      const LayerProfile &a = d.layers[i], &b = old->layers[i];
      for (auto [x, y, what] : {std::tuple{a.forward.median, b.forward.median, "forward"},
                                {a.backward.median, b.backward.median, "backward"}}) {
        const double off = y > 0 && x > 0 ? std::max(x / y, y / x) : 1;
        const std::string at = "layer " + std::to_string(i) + " " + what;
        if (off > worst) worst = off, worst_at = at;
        if (std::min(x, y) >= 1e-3 && off > worst_big) worst_big = off, worst_big_at = at;
      }
    }
    std::printf(
        "  %s: layers of 1 ms or more within a factor %.2f (largest: %s); all layers "
        "within %.2f (%s)\n",
        d.device.name.c_str(), worst_big, worst_big_at.c_str(), worst, worst_at.c_str());
  }
}

// What a tensor-split stage's ranks pay to meet on this host (the partitioner prices it),
// said as it is measured.
std::vector<GroupAllreduce> measureGroupAllreduce() {
  std::vector<GroupAllreduce> g = runtime::measureGroupAllreduce();
  std::printf(
      "\nan all-reduce of 2 ranks in one process: %.1f us at %lld KiB, %.1f us at %lld KiB\n",
      g.front().seconds * 1e6, static_cast<long long>(g.front().bytes >> 10),
      g.back().seconds * 1e6, static_cast<long long>(g.back().bytes >> 10));
  return g;
}

// The matrix as a table: bandwidth and latency per ordered pair of nodes.
void printLinks(const LinkSet& set) {
  std::printf("\nlinks over %s (%lld-byte messages): bandwidth MB/s, latency us; row = from\n",
              set.transport.c_str(), static_cast<long long>(set.message_bytes));
  std::vector<std::string> nodes;
  for (const LinkProfile& l : set.links)
    if (std::find(nodes.begin(), nodes.end(), l.from) == nodes.end()) nodes.push_back(l.from);
  std::printf("  %-12s", "");
  for (const std::string& n : nodes) std::printf(" %20s", n.c_str());
  std::printf("\n");
  for (const std::string& from : nodes) {
    std::printf("  %-12s", from.c_str());
    for (const std::string& to : nodes) {
      std::string cell = "-";
      for (const LinkProfile& l : set.links)
        if (l.from == from && l.to == to) {
          char buf[64];
          std::snprintf(buf, sizeof buf, "%.0f / %.0f", l.bandwidth / 1e6, l.latency_s * 1e6);
          cell = buf;
        }
      std::printf(" %20s", cell.c_str());
    }
    std::printf("\n");
  }
}

// Each node's devices beside the fastest: what they sustain, as the partitioner prices
// them (a whole pass at the sustained rate).
void printNodeSpeeds(const std::vector<std::string>& names, const std::vector<Profile>& got) {
  double fastest = 0;
  for (const Profile& p : got)
    for (const DeviceProfile& d : p.devices) {
      const double pass = d.sustained.burst_pass_s * d.sustained.scale();
      if (pass > 0 && (fastest == 0 || pass < fastest)) fastest = pass;
    }
  std::printf("\n%-14s %-10s %14s %12s %10s %8s\n", "node", "device", "pass ms", "burst ms",
              "speed", "quota");
  for (size_t i = 0; i < got.size(); ++i)
    for (const DeviceProfile& d : got[i].devices) {
      const Sustained& su = d.sustained;
      const double pass = su.burst_pass_s * su.scale();
      std::printf("%-14s %-10s %14.3f %12.3f %10.3f %8s\n", names[i].c_str(), d.device.name.c_str(),
                  pass * 1e3, su.burst_pass_s * 1e3, pass > 0 ? fastest / pass : 0.0,
                  su.quota_cores > 0 ? std::to_string(su.quota_cores).substr(0, 4).c_str() : "-");
    }
  std::printf("(speed: the fastest device's sustained pass time over this one's)\n");
}

struct ProfileArgs {
  std::string model, out, against, cluster, out_dir;
  std::vector<std::string> devices{"cpu"};
  ProfileOptions options;
  int threads = 1;
  bool links = false;
  runtime::LinkSurveyOptions survey;
  std::string key;
  int link_timeout_s = 30;
  int load = 0;
};

// --model with --cluster: every node's daemon measures the devices the cluster file lists
// for it (a profile task, as `partition: auto` sends; cached there), and --links the links.
void profileNodes(ProfileArgs& a) {
  const runtime::ModelSource source = runtime::readModelSource(a.model);
  if (!a.out_dir.empty()) std::filesystem::create_directories(a.out_dir);
  const runtime::ClusterDaemons daemons(partitioner::loadCluster(a.cluster), a.key,
                                        tandemdProgram());
  a.survey.timeout = std::chrono::seconds(a.link_timeout_s);
  auto sessions = daemons.connect("tandem profile", a.survey.timeout);
  std::vector<runtime::Channel*> channels;
  std::vector<std::string> names;
  std::vector<runtime::ProfileTask> tasks;
  for (size_t i = 0; i < daemons.nodes().size(); ++i) {
    runtime::ProfileTask t =
        runtime::nodeProfileTask(daemons.cluster().nodes[i], source.spec_yaml, a.options.batch,
                                 [](const partitioner::ClusterDevice&) { return true; });
    t.warmup = a.options.warmup;
    t.repeats = a.options.repeats;
    channels.push_back(sessions[i].get());
    names.push_back(daemons.nodes()[i].name);
    tasks.push_back(std::move(t));
  }
  std::vector<int> cached;
  const std::vector<Profile> got =
      runtime::profileOnNodes(channels, names, tasks, std::chrono::seconds(600), &cached);
  for (size_t i = 0; i < got.size(); ++i) {
    std::printf("\nnode %s%s:", names[i].c_str(), cached[i] ? " (from its cache)" : "");
    for (const DeviceProfile& d : got[i].devices) printDevice(d, d.batchIn(got[i]));
    if (!a.out_dir.empty()) {
      const std::string path = a.out_dir + "/" + names[i] + ".json";
      const std::string json = profileToJson(got[i]);
      runtime::writeFileAtomically(
          path, std::span(reinterpret_cast<const uint8_t*>(json.data()), json.size()), 0666);
      std::printf("wrote %s\n", path.c_str());
    }
  }
  printNodeSpeeds(names, got);
  if (a.links) {
    Profile links;
    links.links = runtime::surveyLinks(daemons, sessions,
                                       runtime::allLinkPairs(daemons.nodes().size()), a.survey);
    printLinks(*links.links);
    if (!a.out_dir.empty()) {
      const std::string path = a.out_dir + "/links.json";
      const std::string json = profileToJson(links);
      runtime::writeFileAtomically(
          path, std::span(reinterpret_cast<const uint8_t*>(json.data()), json.size()), 0666);
      std::printf("wrote %s\n", path.c_str());
    }
  }
  runtime::leaveAll(sessions, "profiling is done");
}

}  // namespace

void addProfile(CLI::App& app) {
  auto a = std::make_shared<ProfileArgs>();
  CLI::App* c = app.add_subcommand(
      "profile",
      "Measure each layer of a model on each device, and/or the links between the nodes of a "
      "cluster (the partitioner's input)");
  c->add_option("--model", a->model, "Model spec (YAML), ONNX model (.onnx) or Hugging Face folder")
      ->check(CLI::ExistingPath);
  c->add_option("--devices", a->devices, "Comma-separated devices, e.g. cpu,opencl:0")
      ->delimiter(',');
  c->add_option("--batch", a->options.batch, "Samples per forward pass")->check(positiveNumber());
  c->add_option("--repeats", a->options.repeats, "Timed runs per layer and direction")
      ->check(CLI::Range(1, 100000));
  c->add_option("--warmup", a->options.warmup, "Untimed runs first")->check(CLI::Range(0, 1000));
  c->add_option("--threads", a->threads, "CPU threads")->check(CLI::Range(1, 1024));
  c->add_option("--out", a->out, "Write the profile (JSON) here");
  c->add_option("--out-dir", a->out_dir,
                "With --model and --cluster: write each node's profile as DIR/NODE.json");
  c->add_option("--against", a->against, "An earlier profile to compare medians with")
      ->check(CLI::ExistingFile);
  c->add_option("--sustain", a->options.sustain_s,
                "Least seconds of back-to-back passes measuring what the device sustains "
                "(under a CPU quota: 40 of its periods, up to 4 s); 0: none")
      ->check(CLI::Range(0.0, 60.0));
  c->add_option("--load", a->load,
                "Copies of the model training on the same device beside the measured one, as "
                "that many other stages of the node would (e.g. cores - 1)")
      ->check(CLI::Range(0, 256));
  c->add_flag("--links", a->links,
              "Measure bandwidth and latency between the nodes of --cluster (and within each)");
  c->add_option("--cluster", a->cluster,
                "Cluster file whose nodes' daemons measure: with --model, their devices (as "
                "`partition: auto` has them measured); with --links, the links between them")
      ->check(CLI::ExistingFile);
  c->add_option("--link-bytes", a->survey.probe.message_bytes,
                "Bytes per message of the bandwidth runs (a multiple of 4)")
      ->check(CLI::Range(int64_t{8}, int64_t{1} << 30));
  c->add_option("--link-window", a->survey.probe.window, "Messages per timed bandwidth run")
      ->check(CLI::Range(1, 64));
  c->add_option("--link-repeats", a->survey.probe.repeats, "Timed runs per link and kind")
      ->check(CLI::Range(1, 10000));
  c->add_flag(
      "--link-unloaded", [a](int64_t) { a->survey.loaded = false; },
      "No loaded runs: a link's CPU per byte is what its bandwidth runs cost idle ends");
  c->add_option("--key", a->key,
                "Cluster key file for --links (default: the cluster file's `key`)");
  c->add_option("--link-timeout", a->link_timeout_s, "Seconds to wait for a node's answer")
      ->check(CLI::Range(1, 3600));
  c->callback([a] {
    TANDEM_CHECK_MSG(!a->model.empty() || a->links, InvalidArgument,
                     "profile needs --model (devices) or --links --cluster (links), or both");
    TANDEM_CHECK_MSG(!a->links || !a->cluster.empty(), InvalidArgument, "--links needs --cluster");
    const bool on_nodes = !a->cluster.empty() && !a->model.empty();
    TANDEM_CHECK_MSG(a->out_dir.empty() || on_nodes, InvalidArgument,
                     "--out-dir is for --model with --cluster (a profile per node)");
    TANDEM_CHECK_MSG(!on_nodes || (a->out.empty() && a->against.empty()), InvalidArgument,
                     "--model with --cluster profiles every node: write them with --out-dir "
                     "(--out and --against are for this machine's devices)");
    TANDEM_CHECK_MSG(!on_nodes || a->devices == std::vector<std::string>{"cpu"}, InvalidArgument,
                     "--model with --cluster measures the devices the cluster file lists; "
                     "--devices is for this machine");
    if (on_nodes) {
      profileNodes(*a);
      return;
    }
    TANDEM_CHECK_MSG(a->against.empty() || !a->model.empty(), InvalidArgument,
                     "--against compares device profiles: give --model");
    // Read and checked before measuring, so that a bad file is named at once.
    if (!a->out.empty()) checkWritable(a->out, "profile");
    std::optional<Profile> before;
    if (!a->against.empty()) before = parseProfile(readFile(a->against, "profile"), a->against);
    Profile p;
    if (!a->model.empty()) {
      const ModelSpec spec = runtime::readModelSource(a->model).spec;
      p.model = spec.name;
      p.input = spec.input;
      p.batch = a->options.batch;
      p.warmup = a->options.warmup;
      p.repeats = a->options.repeats;
      p.load = a->load;
      // Every device opened before any is measured: one that does not exist is named at
      // once, not after minutes of measuring the others.
      std::vector<std::unique_ptr<Backend>> backends;
      for (const std::string& name : a->devices)
        backends.push_back(makeBackend(name, BackendOptions{a->threads}));
      for (size_t i = 0; i < a->devices.size(); ++i) {
        const std::string& name = a->devices[i];
        Backend* backend = backends[i].get();
        const BackgroundLoad load(
            spec, [&] { return makeBackend(name, BackendOptions{a->threads}); }, a->load,
            a->options.batch);
        p.devices.push_back(profileDevice(spec, *backend, a->options));
        printDevice(p.devices.back(), p.devices.back().batchIn(p));
      }
      p.group_allreduce = measureGroupAllreduce();
    }
    if (a->links) {
      a->survey.timeout = std::chrono::seconds(a->link_timeout_s);
      // Each node's daemon (or one started here for a node without an address) measures.
      const runtime::ClusterDaemons daemons(partitioner::loadCluster(a->cluster), a->key,
                                            tandemdProgram());
      auto sessions = daemons.connect("tandem profile --links", a->survey.timeout);
      p.links = runtime::surveyLinks(daemons, sessions,
                                     runtime::allLinkPairs(daemons.nodes().size()), a->survey);
      runtime::leaveAll(sessions, "the survey is over");
      printLinks(*p.links);
    }
    if (!a->out.empty()) {
      std::ofstream out(a->out, std::ios::trunc);
      out << profileToJson(p);
      TANDEM_CHECK_MSG(out.good(), IoError, "cannot write the profile to '" << a->out << "'");
      std::printf("\nwrote %s\n", a->out.c_str());
    }
    if (before) compare(p, *before, a->against);
  });
}

}  // namespace tandem::cli
