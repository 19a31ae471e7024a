#include "runtime/job/cluster_daemons.h"

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "runtime/control/handshake.h"
#include "runtime/daemon/daemon.h"
#include "runtime/node/node_info.h"

namespace tandem::runtime {

ClusterDaemons::ClusterDaemons(const partitioner::Cluster& cluster, const std::string& key_file,
                               const std::string& tandemd_program)
    : cluster_(cluster) {
  const partitioner::ClusterNode* with = nullptr;
  const partitioner::ClusterNode* without = nullptr;
  for (const partitioner::ClusterNode& n : cluster.nodes) (n.address ? with : without) = &n;
  if (with && without)
    throw InvalidArgument(without->where + ": node '" + without->name +
                          "' has no 'address' (HOST:PORT of its tandemd) while node '" +
                          with->name + "' has one: give every node's, or none to run them all " +
                          "on this machine");
  if (with) {
    const std::string key = !key_file.empty() ? key_file : cluster.key;
    if (key.empty())
      throw InvalidArgument("no cluster key: give --key FILE, or `key: FILE` in " + cluster.source);
    key_ = readClusterKey(key);
    for (const partitioner::ClusterNode& n : cluster.nodes) {
      nodes_.push_back({n.name, *n.address});
      remote_ = remote_ || !isLoopbackHost(n.address->host);
    }
    return;
  }
  // This machine: a tandemd per node on loopback, with a key made for the command.
  key_ = generateClusterKey();
  for (const partitioner::ClusterNode& n : cluster.nodes) {
    TANDEM_CHECK_MSG(isLoopbackHost(n.host), InvalidArgument,
                     n.where << ": node '" << n.name << "' on " << n.host
                             << " has no 'address' (HOST:PORT of its tandemd)");
    local_.push_back(std::make_unique<LocalDaemon>(tandemd_program, key_, n.name));
    nodes_.push_back({n.name, local_.back()->endpoint()});
  }
}

ClusterDaemons::~ClusterDaemons() = default;

std::vector<std::unique_ptr<Channel>> ClusterDaemons::connect(const std::string& who,
                                                              std::chrono::seconds timeout) const {
  HandshakeOptions ho;
  ho.build = buildName();
  ho.timeout = timeout;
  std::vector<std::unique_ptr<Channel>> out;
  for (const DaemonNode& n : nodes_) {
    try {
      // (A daemon under a flood may close a new connection unanswered: again, twice.)
      std::unique_ptr<Channel> c = connectChannelRetrying(n.address, key_, ho, 3);
      const std::optional<Message> first = c->recv(timeout);
      if (!first || !std::holds_alternative<NodeInfo>(*first))
        throw FormatError("it did not say who it is");
      c->send(NodeInfo{who, buildName(), "", 0, 0, 0, 0, {}, {}, {}});
      out.push_back(std::move(c));
    } catch (const Error& e) {
      leaveAll(out, "a node could not be reached");
      throw Error("node '" + n.name + "' (" + n.address.str() + "): " + e.what());
    }
  }
  return out;
}

void leaveAll(std::vector<std::unique_ptr<Channel>>& sessions, const std::string& reason) {
  for (auto& c : sessions) {
    try {
      c->send(Leave{reason}, std::chrono::seconds(1));
      c->close(std::chrono::seconds(1));
    } catch (const Error&) {  // it is gone already
    }
  }
  sessions.clear();
}

partitioner::Cluster localCluster(int devices, int threads) {
  partitioner::Cluster c;
  c.source = "the local cluster";
  partitioner::ClusterNode n;
  n.name = "local";
  n.where = c.source;
  for (int d = 0; d < devices; ++d) {
    partitioner::ClusterDevice cd;
    cd.name = "cpu" + std::to_string(d);
    cd.threads = threads;
    cd.where = c.source;
    n.devices.push_back(cd);
  }
  c.nodes.push_back(n);
  return c;
}

namespace {

// The sending end's part of what both ends spent; 0 (not known) unless both spent some.
double senderShare(double from_s, double to_s) {
  return from_s > 0 && to_s > 0 ? from_s / (from_s + to_s) : 0;
}

// The tasks of one survey, over the sessions to its nodes.
class Survey {
 public:
  Survey(const ClusterDaemons& d, std::vector<std::unique_ptr<Channel>>& sessions,
         const LinkSurveyOptions& o)
      : cluster_(d.cluster()), sessions_(sessions), options_(o) {}

  LinkProfile measure(size_t from, size_t to, int64_t pair) {
    LinkResult m;
    // What the data cost both ends while it went: their processes' CPU (what a quota on
    // each is charged, read to the nanosecond), or, from daemons before protocol 3.6, their
    // hosts' busy CPU (10 ms ticks).
    double cpu_s = 0;
    const char* cpu_of = "processes'";
    double loaded_s = 0;  // per byte, over the loaded runs (0: none)
    // Each end's part, of the idle runs and of the loaded ones (0, 0: not known).
    double idle_from = 0, idle_to = 0, loaded_from = 0, loaded_to = 0;
    if (from == to) {  // one process holds both ends
      send(from, task(pair, LinkTaskKind::kLocal, from));
      m = result(from, pair);
      cpu_s = m.process_cpu_s;
      if (!(cpu_s > 0)) {
        cpu_s = m.host_cpu_s;
        cpu_of = "host's";
      }
    } else {
      send(from, task(pair, LinkTaskKind::kOpen, from));
      send(to, task(pair, LinkTaskKind::kOpen, to));
      const std::string from_end = result(from, pair).endpoint;
      const std::string to_end = result(to, pair).endpoint;
      send(to, task(pair, LinkTaskKind::kServe, to, from_end));
      send(from, task(pair, LinkTaskKind::kMeasure, from, to_end));
      m = result(from, pair);
      const LinkResult echo = result(to, pair);
      loaded_s = m.loaded_bytes > 0
                     ? (m.loaded_cpu_s + echo.loaded_cpu_s) / static_cast<double>(m.loaded_bytes)
                     : 0;
      cpu_s = m.process_cpu_s + echo.process_cpu_s;
      idle_from = m.process_cpu_s;
      idle_to = echo.process_cpu_s;
      loaded_from = m.loaded_cpu_s;
      loaded_to = echo.loaded_cpu_s;
      if (!(m.process_cpu_s > 0 && echo.process_cpu_s > 0)) {
        idle_from = idle_to = 0;
        // Two ends on one host (namespaces, containers) read the same CPUs: once.
        const bool one_host = !m.host.empty() && m.host == echo.host;
        cpu_s = m.host_cpu_s + (one_host ? 0 : echo.host_cpu_s);
        cpu_of = "hosts'";
      }
    }
    const std::string &a = cluster_.nodes[from].name, &z = cluster_.nodes[to].name;
    LinkProfile l{a,
                  z,
                  m.bandwidth,
                  m.latency_s,
                  {m.rtt_median, m.rtt_min, m.rtt_max, static_cast<int>(m.rtt_repeats)},
                  m.data_bytes > 0 ? cpu_s / static_cast<double>(m.data_bytes) : 0};
    if (!(l.bandwidth > 0))
      throw FormatError("node '" + a + "' measured bandwidth " + std::to_string(l.bandwidth) +
                        " to '" + z + "'");
    spdlog::info(
        "link {} -> {}: {:.1f} MB/s, latency {:.1f} us, CPU {:.2f} us per KiB (both ends' {}), "
        "{:.2f} beside a computation",
        a, z, l.bandwidth / 1e6, l.latency_s * 1e6, l.cpu_s_per_byte * 1024 * 1e6, cpu_of,
        loaded_s * 1024 * 1e6);
    // Messages arrive while stages compute: where they cost more there, that is their cost.
    // The measuring end sent the data: its part of whichever figure is taken is the
    // sender's.
    const bool loaded = loaded_s > l.cpu_s_per_byte;
    l.cpu_s_per_byte = std::max(l.cpu_s_per_byte, loaded_s);
    l.sender_share = senderShare(loaded ? loaded_from : idle_from, loaded ? loaded_to : idle_to);
    if (l.sender_share > 0)
      spdlog::info(
          "link {} -> {}: the sender {} spends {:.0f}% of its CPU, the receiver {} {:.0f}%", a, z,
          a, 100 * l.sender_share, z, 100 * (1 - l.sender_share));
    return l;
  }

 private:
  LinkTask task(int64_t pair, LinkTaskKind kind, size_t node, const std::string& peer = "") {
    const LinkProbeOptions& p = options_.probe;
    return {pair,
            kind,
            cluster_.nodes[node].host,
            peer,
            p.message_bytes,
            p.window,
            p.warmup,
            p.repeats,
            options_.loaded && kind != LinkTaskKind::kLocal};
  }

  void send(size_t node, const LinkTask& t) { sessions_.at(node)->send(t); }

  // The node's answer to its task on `pair`; Error naming the node otherwise.
  LinkResult result(size_t node, int64_t pair) {
    try {
      const std::optional<Message> m = sessions_.at(node)->recv(options_.timeout);
      if (!m) throw Timeout("no answer within " + std::to_string(options_.timeout.count()) + " s");
      if (const auto* e = std::get_if<ErrorReply>(&*m)) throw Error(e->message);
      const auto* r = std::get_if<LinkResult>(&*m);
      if (!r || r->pair != pair)
        throw FormatError(std::string("sent '") + messageName(*m) + "' where the result of pair " +
                          std::to_string(pair) + " was due");
      return *r;
    } catch (const Error& e) {
      throw Error("node '" + cluster_.nodes[node].name + "': " + e.what());
    }
  }

  const partitioner::Cluster& cluster_;
  std::vector<std::unique_ptr<Channel>>& sessions_;
  LinkSurveyOptions options_;
};

}  // namespace

LinkSet surveyLinks(const ClusterDaemons& daemons, std::vector<std::unique_ptr<Channel>>& sessions,
                    const std::vector<std::pair<size_t, size_t>>& pairs,
                    const LinkSurveyOptions& options) {
  TANDEM_CHECK(sessions.size() == daemons.nodes().size());
  LinkSet set{"tcp", options.probe.message_bytes, options.probe.warmup, options.probe.repeats, {}};
  Survey survey(daemons, sessions, options);
  int64_t id = 0;
  for (const auto& [from, to] : pairs) set.links.push_back(survey.measure(from, to, id++));
  return set;
}

std::vector<std::pair<size_t, size_t>> allLinkPairs(size_t nodes) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t a = 0; a < nodes; ++a)
    for (size_t z = 0; z < nodes; ++z) out.push_back({a, z});
  return out;
}

}  // namespace tandem::runtime
