#include "targets/tandem/links.h"

#include <spdlog/spdlog.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "backends/registry.h"
#include "core/error.h"
#include "targets/tandem/commands.h"
#include "targets/tandem/control.h"
#include "transport/zmq_link.h"

namespace tandem::cli {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool onThisMachine(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

void putProbe(Json& message, const LinkProbeOptions& o) {
  message["message_bytes"] = o.message_bytes;
  message["window"] = o.window;
  message["warmup"] = o.warmup;
  message["repeats"] = o.repeats;
}

LinkProbeOptions probeOf(const Json& message) {
  LinkProbeOptions o;
  o.message_bytes = field<int64_t>(message, "message_bytes");
  o.window = static_cast<int>(field<int64_t>(message, "window"));
  o.warmup = static_cast<int>(field<int64_t>(message, "warmup"));
  o.repeats = static_cast<int>(field<int64_t>(message, "repeats"));
  return o;
}

Json measuredJson(const std::string& node, int64_t pair, const LinkMeasurement& m) {
  return {{"type", "measured"},
          {"node", node},
          {"pair", pair},
          {"bandwidth", m.bandwidth},
          {"latency_s", m.latency_s},
          {"rtt_median", m.round_trip.median},
          {"rtt_min", m.round_trip.min},
          {"rtt_max", m.round_trip.max},
          {"rtt_repeats", static_cast<int64_t>(m.round_trip.repeats)}};
}

// The coordinator's side: the agents, their control channels, and the wait for answers.
class Survey {
 public:
  Survey(const partitioner::Cluster& cluster, const LinkSurveyOptions& o)
      : cluster_(cluster), options_(o), in_(ctx_, o.listen) {}

  ~Survey() {
    for (auto& [node, out] : out_) {
      try {
        out->send({{"type", "quit"}}, 1s);
      } catch (const Error&) {  // it is gone already
      }
    }
    std::vector<pid_t> pids;
    for (const auto& [node, pid] : children_) pids.push_back(pid);
    stopChildren(pids, 5s);
  }

  LinkSet run() {
    start();
    LinkSet set{
        "tcp", options_.probe.message_bytes, options_.probe.warmup, options_.probe.repeats, {}};
    int64_t pair = 0;
    for (const auto& from : cluster_.nodes)
      for (const auto& to : cluster_.nodes)
        set.links.push_back(measure(from.name, to.name, pair++));
    return set;
  }

 private:
  void start() {
    for (const auto& n : cluster_.nodes) {
      const std::vector<std::string> args = {
          "link-agent", "--control", in_.endpoint(),
          "--node",     n.name,      "--host",
          n.host,       "--timeout", std::to_string(options_.timeout.count())};
      if (onThisMachine(n.host)) {
        children_[n.name] = spawnSelf(args);
      } else {
        std::string line = "tandem";
        for (const std::string& a : args) line += " " + a;
        std::printf("on %s (node %s), run: %s\n  (with this machine's address for %s)\n",
                    n.host.c_str(), n.name.c_str(), line.c_str(), in_.endpoint().c_str());
        std::fflush(stdout);
      }
    }
    for (size_t said = 0; said < cluster_.nodes.size();) {
      const Json m = next("hello", "", -1);
      const std::string node = field<std::string>(m, "node");
      if (out_.count(node)) throw FormatError("a second link agent says it is node '" + node + "'");
      out_[node] = std::make_unique<ControlOut>(ctx_, field<std::string>(m, "control"));
      ++said;
    }
  }

  LinkProfile measure(const std::string& from, const std::string& to, int64_t pair) {
    Json m;
    if (from == to) {
      Json local{{"type", "local"}, {"pair", pair}};
      putProbe(local, options_.probe);
      out_.at(from)->send(local);
      m = next("measured", from, pair);
    } else {
      out_.at(from)->send({{"type", "open"}, {"pair", pair}});
      out_.at(to)->send({{"type", "open"}, {"pair", pair}});
      const std::string from_end = field<std::string>(next("opened", from, pair), "endpoint");
      const std::string to_end = field<std::string>(next("opened", to, pair), "endpoint");
      out_.at(to)->send({{"type", "serve"}, {"pair", pair}, {"peer", from_end}});
      Json measure{{"type", "measure"}, {"pair", pair}, {"peer", to_end}};
      putProbe(measure, options_.probe);
      out_.at(from)->send(measure);
      m = next("measured", from, pair);
      next("served", to, pair);
    }
    LinkProfile l{
        from,
        to,
        field<double>(m, "bandwidth"),
        field<double>(m, "latency_s"),
        {field<double>(m, "rtt_median"), field<double>(m, "rtt_min"), field<double>(m, "rtt_max"),
         static_cast<int>(field<int64_t>(m, "rtt_repeats"))}};
    if (!(l.bandwidth > 0) || !(l.latency_s >= 0))
      throw FormatError("link agent of node '" + from + "' measured bandwidth " +
                        std::to_string(l.bandwidth) + " and latency " +
                        std::to_string(l.latency_s) + " to '" + to + "'");
    spdlog::info("link {} -> {}: {:.1f} MB/s, latency {:.1f} us", from, to, l.bandwidth / 1e6,
                 l.latency_s * 1e6);
    return l;
  }

  // The next message of `type` from `node` (any node if empty) about `pair` (any if < 0).
  // Answers from two agents may come in either order: others wait in `early_`.
  Json next(const std::string& type, const std::string& node, int64_t pair) {
    auto wanted = [&](const Json& m) {
      return field<std::string>(m, "type") == type &&
             (node.empty() || field<std::string>(m, "node") == node) &&
             (pair < 0 || field<int64_t>(m, "pair") == pair);
    };
    for (auto it = early_.begin(); it != early_.end(); ++it)
      if (wanted(*it)) {
        Json m = std::move(*it);
        early_.erase(it);
        return m;
      }
    const auto deadline = Clock::now() + options_.timeout;
    while (Clock::now() < deadline) {
      checkChildren();
      const std::optional<Json> m = in_.recv(200ms);
      if (!m) continue;
      const std::string from = field<std::string>(*m, "node");
      if (field<std::string>(*m, "type") == "error")
        throw Error("link agent of node '" + from + "': " + field<std::string>(*m, "message"));
      bool known = false;
      for (const auto& n : cluster_.nodes) known = known || n.name == from;
      if (!known)
        throw FormatError("a link agent says it is node '" + from + "', not in the cluster");
      if (wanted(*m)) return *m;
      // At most one answer per agent can be early.
      if (early_.size() >= cluster_.nodes.size())
        throw FormatError("link agent of node '" + from + "' sent '" +
                          field<std::string>(*m, "type") + "' unasked");
      early_.push_back(*m);
    }
    throw Timeout((node.empty() ? std::string("not every link agent") : "node '" + node + "'") +
                  " answered '" + type + "' within " + std::to_string(options_.timeout.count()) +
                  " s");
  }

  void checkChildren() {
    for (auto it = children_.begin(); it != children_.end(); ++it) {
      const std::string node = it->first;
      const pid_t pid = it->second;
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        children_.erase(it);
        throw Error("the link agent of node '" + node + "' (pid " + std::to_string(pid) + ") " +
                    (WIFSIGNALED(status)
                         ? "was killed by signal " + std::to_string(WTERMSIG(status))
                         : "exited with code " + std::to_string(WEXITSTATUS(status))));
      }
    }
  }

  const partitioner::Cluster& cluster_;
  LinkSurveyOptions options_;
  transport::Context ctx_;
  ControlIn in_;
  std::map<std::string, std::unique_ptr<ControlOut>> out_;  // by node
  std::map<std::string, pid_t> children_;                   // agents started here, by node
  std::vector<Json> early_;                                 // answers not yet asked for
};

struct AgentArgs {
  std::string control, node, host = "127.0.0.1";
  int timeout_s = 30;
};

// One node's agent: answers the coordinator until told to quit.
void runAgent(const AgentArgs& a) {
  transport::Context ctx;
  ControlIn in(ctx, "tcp://" + a.host + ":*");
  ControlOut out(ctx, a.control);
  const std::chrono::seconds timeout(a.timeout_s);
  auto linkOptions = [&] {
    transport::LinkOptions o;
    o.bind = "tcp://" + a.host + ":*";
    o.timeout = timeout;
    return o;
  };
  auto backend = makeBackend("cpu");
  std::map<int64_t, std::unique_ptr<transport::ZmqLink>> links;  // opened, by pair
  out.send({{"type", "hello"}, {"node", a.node}, {"control", in.endpoint()}});
  try {
    for (;;) {
      const std::optional<Json> m = in.recv(timeout);
      if (!m)
        throw Timeout("no word from the coordinator at " + a.control + " for " +
                      std::to_string(a.timeout_s) + " s");
      const std::string type = field<std::string>(*m, "type");
      if (type == "quit") return;
      const int64_t pair = field<int64_t>(*m, "pair");
      if (type == "open") {
        links[pair] = std::make_unique<transport::ZmqLink>(ctx, linkOptions());
        out.send({{"type", "opened"},
                  {"node", a.node},
                  {"pair", pair},
                  {"endpoint", links[pair]->endpoint()}});
      } else if (type == "serve" || type == "measure") {
        const auto it = links.find(pair);
        if (it == links.end())
          throw FormatError("'" + type + "' for pair " + std::to_string(pair) + ", never opened");
        std::unique_ptr<transport::ZmqLink> link = std::move(it->second);
        links.erase(it);
        link->connect(field<std::string>(*m, "peer"));
        if (type == "serve") {
          echoLink(*link, *backend);
          out.send({{"type", "served"}, {"node", a.node}, {"pair", pair}});
        } else {
          out.send(measuredJson(a.node, pair, measureLink(*link, *backend, probeOf(*m))));
        }
      } else if (type == "local") {
        // Within the node: two links of this process, the echo side on its own thread
        // with its own backend (one thread drives a link, and a backend).
        transport::ZmqLink near(ctx, linkOptions()), far(ctx, linkOptions());
        near.connect(far.endpoint());
        far.connect(near.endpoint());
        std::exception_ptr echo_error;
        std::thread echo([&] {
          try {
            auto echo_backend = makeBackend("cpu");
            echoLink(far, *echo_backend);
          } catch (...) {
            echo_error = std::current_exception();
          }
        });
        std::optional<LinkMeasurement> measured;
        std::exception_ptr error;
        try {
          measured = measureLink(near, *backend, probeOf(*m));
        } catch (...) {
          error = std::current_exception();
        }
        echo.join();
        if (error) std::rethrow_exception(error);
        if (echo_error) std::rethrow_exception(echo_error);
        out.send(measuredJson(a.node, pair, *measured));
      } else {
        throw FormatError("unknown control message '" + type + "'");
      }
    }
  } catch (const Error& e) {
    out.send({{"type", "error"}, {"node", a.node}, {"message", e.what()}});
    throw;
  }
}

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

void addLinkAgent(CLI::App& app) {
  auto a = std::make_shared<AgentArgs>();
  CLI::App* c = app.add_subcommand(
      "link-agent",
      "One node's side of `tandem profile --links` (started by it, or by hand on another host)");
  c->add_option("--control", a->control, "The coordinator's control endpoint")->required();
  c->add_option("--node", a->node, "This node's name in the cluster file")->required();
  c->add_option("--host", a->host, "Address to listen on (the node's host)");
  c->add_option("--timeout", a->timeout_s, "Seconds to wait for the coordinator or a peer")
      ->check(CLI::Range(1, 3600));
  c->callback([a] { runAgent(*a); });
}

}  // namespace tandem::cli
