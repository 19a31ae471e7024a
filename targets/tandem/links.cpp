#include "targets/tandem/links.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>

#include "core/error.h"
#include "targets/runtime/daemon.h"
#include "targets/runtime/handshake.h"
#include "targets/runtime/local_daemon.h"
#include "targets/runtime/node_info.h"
#include "targets/tandem/commands.h"

namespace tandem::cli {

namespace {

// The coordinator's side: a channel to each node's daemon, and the tasks of each pair.
class Survey {
 public:
  Survey(const partitioner::Cluster& cluster, const LinkSurveyOptions& o)
      : cluster_(cluster), options_(o) {
    const std::string key_file = !o.key.empty() ? o.key : cluster.key;
    std::optional<runtime::ClusterKey> key;
    runtime::HandshakeOptions ho;
    ho.build = runtime::buildName();
    ho.timeout = o.timeout;
    for (const auto& n : cluster.nodes) {
      std::unique_ptr<runtime::Channel> c;
      try {
        if (n.address) {
          if (!key) {
            TANDEM_CHECK_MSG(!key_file.empty(), InvalidArgument,
                             "no cluster key for node '" << n.name
                                                         << "': give --key FILE, or `key: FILE` in "
                                                         << cluster.source);
            key = runtime::readClusterKey(key_file);
          }
          c = runtime::connectChannel(*n.address, *key, ho);
        } else {
          // A node on this machine without a daemon: one for the survey, on its host.
          TANDEM_CHECK_MSG(runtime::isLoopbackHost(n.host), InvalidArgument,
                           n.where << ": node '" << n.name << "' on " << n.host
                                   << " has no 'address' (HOST:PORT of its tandemd)");
          const runtime::ClusterKey local_key = runtime::generateClusterKey();
          local_.push_back(
              std::make_unique<runtime::LocalDaemon>(tandemdProgram(), local_key, n.name));
          c = runtime::connectChannel(local_.back()->endpoint(), local_key, ho);
        }
        const std::optional<runtime::Message> first = c->recv(o.timeout);
        if (!first || !std::holds_alternative<runtime::NodeInfo>(*first))
          throw FormatError("it did not say who it is");
        c->send(runtime::NodeInfo{
            "tandem profile --links", runtime::buildName(), "", 0, 0, 0, 0, {}, {}, {}});
      } catch (const Error& e) {
        throw Error("node '" + n.name + "'" +
                    (n.address ? " (" + n.address->str() + ")" : std::string()) + ": " + e.what());
      }
      channels_[n.name] = std::move(c);
    }
  }

  ~Survey() {
    for (auto& [node, c] : channels_) {
      try {
        c->send(runtime::Leave{"the survey is over"}, std::chrono::seconds(1));
        c->close(std::chrono::seconds(1));
      } catch (const Error&) {  // it is gone already
      }
    }
  }

  LinkSet run() {
    LinkSet set{
        "tcp", options_.probe.message_bytes, options_.probe.warmup, options_.probe.repeats, {}};
    int64_t pair = 0;
    for (const auto& from : cluster_.nodes)
      for (const auto& to : cluster_.nodes) set.links.push_back(measure(from, to, pair++));
    return set;
  }

 private:
  runtime::LinkTask task(int64_t pair, runtime::LinkTaskKind kind,
                         const partitioner::ClusterNode& node, const std::string& peer = "") {
    const LinkProbeOptions& p = options_.probe;
    return {pair, kind, node.host, peer, p.message_bytes, p.window, p.warmup, p.repeats};
  }

  LinkProfile measure(const partitioner::ClusterNode& from, const partitioner::ClusterNode& to,
                      int64_t pair) {
    runtime::LinkResult m;
    if (from.name == to.name) {
      send(from, task(pair, runtime::LinkTaskKind::kLocal, from));
      m = result(from, pair);
    } else {
      send(from, task(pair, runtime::LinkTaskKind::kOpen, from));
      send(to, task(pair, runtime::LinkTaskKind::kOpen, to));
      const std::string from_end = result(from, pair).endpoint;
      const std::string to_end = result(to, pair).endpoint;
      send(to, task(pair, runtime::LinkTaskKind::kServe, to, from_end));
      send(from, task(pair, runtime::LinkTaskKind::kMeasure, from, to_end));
      m = result(from, pair);
      result(to, pair);
    }
    LinkProfile l{from.name,
                  to.name,
                  m.bandwidth,
                  m.latency_s,
                  {m.rtt_median, m.rtt_min, m.rtt_max, static_cast<int>(m.rtt_repeats)}};
    if (!(l.bandwidth > 0))
      throw FormatError("node '" + from.name + "' measured bandwidth " +
                        std::to_string(l.bandwidth) + " to '" + to.name + "'");
    spdlog::info("link {} -> {}: {:.1f} MB/s, latency {:.1f} us", from.name, to.name,
                 l.bandwidth / 1e6, l.latency_s * 1e6);
    return l;
  }

  void send(const partitioner::ClusterNode& node, const runtime::LinkTask& t) {
    channels_.at(node.name)->send(t);
  }

  // The node's answer to its task on `pair`; Error naming the node otherwise.
  runtime::LinkResult result(const partitioner::ClusterNode& node, int64_t pair) {
    runtime::Channel& c = *channels_.at(node.name);
    try {
      const std::optional<runtime::Message> m = c.recv(options_.timeout);
      if (!m) throw Timeout("no answer within " + std::to_string(options_.timeout.count()) + " s");
      if (const auto* e = std::get_if<runtime::ErrorReply>(&*m)) throw Error(e->message);
      const auto* r = std::get_if<runtime::LinkResult>(&*m);
      if (!r || r->pair != pair)
        throw FormatError(std::string("sent '") + runtime::messageName(*m) +
                          "' where the result of pair " + std::to_string(pair) + " was due");
      return *r;
    } catch (const Error& e) {
      throw Error("node '" + node.name + "': " + e.what());
    }
  }

  const partitioner::Cluster& cluster_;
  LinkSurveyOptions options_;
  std::vector<std::unique_ptr<runtime::LocalDaemon>> local_;           // outlive the channels
  std::map<std::string, std::unique_ptr<runtime::Channel>> channels_;  // by node
};

}  // namespace

LinkSet surveyLinks(const partitioner::Cluster& cluster, const LinkSurveyOptions& options) {
  Survey survey(cluster, options);
  return survey.run();
}

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

}  // namespace tandem::cli
