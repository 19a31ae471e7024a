// tandem nodes: asks every node daemon of a cluster file (or, for a cluster without
// addresses, the tandemd started here for each node, as a run would) who it is — its build and
// protocol version, devices, memory, load, cached models — and measures the round trip
// and clock offset to it. Nodes are asked at once, so an unreachable one costs the
// timeout once. Exit 1 if any node could not be asked.
#include <cstdio>
#include <future>
#include <memory>

#include "core/error.h"
#include "partitioner/cluster.h"
#include "runtime/control/handshake.h"
#include "runtime/job/cluster_daemons.h"
#include "runtime/node/node_info.h"
#include "targets/tandem/commands.h"

namespace tandem::cli {

namespace {

struct NodesArgs {
  std::string cluster, key;
  double timeout_s = 5;
};

struct Answer {
  runtime::NodeInfo info;
  runtime::ProtocolVersion version;
  runtime::ClockEstimate clock;
};

Answer ask(const Endpoint& at, const runtime::ClusterKey& key, std::chrono::milliseconds timeout) {
  runtime::HandshakeOptions o;
  o.build = runtime::buildName();
  o.timeout = timeout;
  // (A daemon under a flood of connections without the key may close ours unanswered.)
  std::unique_ptr<runtime::Channel> c = runtime::connectChannelRetrying(at, key, o, 3);
  Answer a;
  a.version = c->peerHello().version;
  const std::optional<runtime::Message> first = c->recv(timeout);
  if (!first) throw Timeout(at.str() + " did not say who it is within the timeout");
  const auto* info = std::get_if<runtime::NodeInfo>(&*first);
  if (!info)
    throw FormatError(at.str() + " sent '" + runtime::messageName(*first) +
                      "' where its node info was due");
  a.info = *info;
  c->send(runtime::NodeInfo{"tandem nodes", runtime::buildName(), "", 0, 0, 0, 0, {}, {}, {}});
  a.clock = runtime::estimateClock(*c, 8, timeout);
  c->send(runtime::Leave{"done asking"});
  c->close();
  return a;
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / (1 << 30));
  return buf;
}

int runNodes(const NodesArgs& a) {
  // The nodes' daemons, or for a cluster without addresses one started here per node:
  // what a run on this cluster would reach.
  const runtime::ClusterDaemons daemons(partitioner::loadCluster(a.cluster), a.key,
                                        tandemdProgram());
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000));
  std::vector<std::future<Answer>> answers;
  for (const runtime::DaemonNode& n : daemons.nodes())
    answers.push_back(std::async(std::launch::async, ask, n.address, daemons.key(), timeout));
  std::printf("%-12s %-22s %-14s %-8s %4s %15s %5s %8s %10s\n", "node", "address", "build", "arch",
              "cpus", "memory free/GiB", "load", "rtt ms", "clock ms");
  int failed = 0;
  for (size_t i = 0; i < daemons.nodes().size(); ++i) {
    const runtime::DaemonNode& n = daemons.nodes()[i];
    const std::string at =
        n.address.str() + (daemons.onThisMachine() ? " (started here)" : std::string());
    try {
      const Answer r = answers[i].get();
      const std::string mem = gib(r.info.free_memory_bytes) + "/" + gib(r.info.memory_bytes);
      std::printf("%-12s %-22s %-14s %-8s %4d %15s %5.2f %8.3f %+10.3f\n", n.name.c_str(),
                  at.c_str(), r.info.build.c_str(), r.info.arch.c_str(), r.info.cpus, mem.c_str(),
                  r.info.load, r.clock.rtt_s * 1e3, r.clock.offset_s * 1e3);
      std::printf("  protocol %s, node name '%s'\n", r.version.str().c_str(), r.info.name.c_str());
      if (r.info.cpu_quota > 0)
        std::printf("  cpu quota: %.2f cores (its control group's), %.2f usable\n",
                    r.info.cpu_quota, r.info.cpu_cores);
      for (const auto& d : r.info.devices)
        std::printf("  device %-10s %s, %d compute units, %s GiB%s\n", d.id.c_str(), d.name.c_str(),
                    d.compute_units, gib(d.memory_bytes).c_str(), d.fp16 ? ", fp16" : "");
      std::printf("  cached models: %zu\n", r.info.cached_weights.size());
    } catch (const Error& e) {
      ++failed;
      std::printf("%-12s %-22s unreachable: %s\n", n.name.c_str(), at.c_str(), e.what());
    }
  }
  std::fflush(stdout);
  if (failed > 0)
    throw Error(std::to_string(failed) + " of the cluster's nodes could not be asked (see above)");
  return 0;
}

}  // namespace

void addNodes(CLI::App& app) {
  auto a = std::make_shared<NodesArgs>();
  CLI::App* c = app.add_subcommand(
      "nodes", "Ask each node daemon of a cluster: build, devices, memory, load, round trip");
  c->add_option("--cluster", a->cluster,
                "Cluster file (nodes without an `address`: a tandemd started here for each)")
      ->required();
  c->add_option("--key", a->key, "Cluster key file (default: the cluster file's `key`)");
  c->add_option("--timeout", a->timeout_s, "Seconds to wait for each node")
      ->check(positiveNumber())
      ->capture_default_str();
  c->callback([a] { runNodes(*a); });
}

}  // namespace tandem::cli
