// The launcher of coordinator.h whose workers node daemons start (daemon.h): one
// authenticated channel per node, `launch` per worker, `worker ended` back.
#include <spdlog/spdlog.h>

#include <deque>
#include <map>
#include <set>
#include <thread>

#include "core/error.h"
#include "runtime/control/handshake.h"
#include "runtime/job/coordinator.h"
#include "runtime/node/node_info.h"

namespace tandem::runtime {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class DaemonLauncher final : public Launcher {
 public:
  DaemonLauncher(const std::vector<DaemonNode>& nodes, const std::vector<int>& node_of_slot,
                 const ClusterKey& key, std::chrono::milliseconds timeout,
                 const std::vector<WorkerNeeds>& needs)
      : nodes_(nodes), node_of_slot_(node_of_slot), timeout_(timeout) {
    HandshakeOptions o;
    o.build = buildName();
    o.timeout = timeout;
    std::set<int> used(node_of_slot.begin(), node_of_slot.end());
    channels_.resize(nodes.size());
    for (int n : used) {
      const DaemonNode& node = nodes.at(static_cast<size_t>(n));
      try {
        // (A daemon under a flood may close a new connection unanswered: again, twice.)
        auto c = connectChannelRetrying(node.address, key, o, 3);
        const std::optional<Message> first = c->recv(timeout);
        if (!first || !std::holds_alternative<NodeInfo>(*first))
          throw FormatError("it did not say who it is");
        checkWorkersFit(node.name, std::get<NodeInfo>(*first), n, node_of_slot, needs);
        c->send(NodeInfo{"tandem run", buildName(), "", 0, 0, 0, 0, {}, {}, {}});
        const ClockEstimate clock = estimateClock(*c, 8, timeout);  // NTP-style, best of 8
        offsets_[n] = clock.offset_s;
        spdlog::info("node '{}' ({}): round trip {:.3f} ms, clock {:+.3f} ms from ours", node.name,
                     node.address.str(), clock.rtt_s * 1e3, clock.offset_s * 1e3);
        channels_[static_cast<size_t>(n)] = std::move(c);
      } catch (const InvalidArgument&) {
        throw;
      } catch (const Error& e) {
        throw IoError("node '" + node.name + "' (" + node.address.str() + "): " + e.what());
      }
    }
  }

  ~DaemonLauncher() override { stopAll(); }

  int64_t start(int slot, const Endpoint& coordinator, const ClusterKey& key) override {
    const int n = node_of_slot_.at(static_cast<size_t>(slot));
    Channel& c = *channels_[static_cast<size_t>(n)];
    // The coordinator as this node reaches it: the address this side has on the node's
    // connection, when it listens on every address.
    Endpoint to = coordinator;
    if (to.host == "0.0.0.0" || to.host == "::") to.host = c.localHost();
    c.send(Launch{slot, to.str(), key.bytes});
    const auto deadline = Clock::now() + timeout_;
    while (Clock::now() < deadline) {
      const std::optional<Message> m = receive(n, 100ms);
      if (!m) continue;
      if (const auto* l = std::get_if<Launched>(&*m); l && l->slot == slot) return l->pid;
      if (const auto* e = std::get_if<ErrorReply>(&*m))
        throw Error("node '" + nodes_[static_cast<size_t>(n)].name + "' could not start worker " +
                    std::to_string(slot) + ": " + e->message);
    }
    throw Timeout("node '" + nodes_[static_cast<size_t>(n)].name + "' did not start worker " +
                  std::to_string(slot) + " within " + std::to_string(timeout_.count() / 1000) +
                  " s");
  }

  std::optional<Ended> ended() override {
    for (size_t n = 0; n < channels_.size(); ++n)
      if (channels_[n]) receive(static_cast<int>(n), 0ms);
    if (ended_.empty()) return std::nullopt;
    Ended e = ended_.front();
    ended_.pop_front();
    return e;
  }

  std::string finish(std::chrono::milliseconds grace) override {
    const auto until = Clock::now() + grace;
    std::string bad;
    for (;;) {
      while (const auto e = ended()) bad += endedBadly(*e);
      if (outstanding() == 0 || Clock::now() >= until) break;
      std::this_thread::sleep_for(5ms);
    }
    if (const size_t left = outstanding(); left > 0)
      bad += std::to_string(left) + " workers did not exit after finishing";
    stopAll();
    return bad;
  }

  double clockOffset(int slot) const override {
    const auto it = offsets_.find(node_of_slot_.at(static_cast<size_t>(slot)));
    return it == offsets_.end() ? 0 : it->second;
  }

  void stopAll() override {
    for (auto& c : channels_) {
      if (!c) continue;
      try {
        c->send(Leave{"the run is over"}, 1s);
        c->close(1s);
      } catch (const Error&) {  // the node is gone already
      }
      c.reset();
    }
  }

 private:
  // Workers launched whose end has not been heard of.
  size_t outstanding() const {
    size_t n = 0;
    for (int slot : launched_) n += reported_ended_.count(slot) == 0;
    return n;
  }

  // The next message of node `n` that is not a `worker ended` (those are queued for
  // ended()); nullopt after `timeout`. A lost node ends every worker it ran.
  std::optional<Message> receive(int n, std::chrono::milliseconds timeout) {
    auto& c = channels_[static_cast<size_t>(n)];
    if (!c) return std::nullopt;
    try {
      for (;;) {
        std::optional<Message> m = c->recv(timeout);
        if (!m) return std::nullopt;
        if (const auto* e = std::get_if<WorkerEnded>(&*m)) {
          if (reported_ended_.insert(e->slot).second)
            ended_.push_back({e->slot, e->how, e->killed});
          timeout = 0ms;
          continue;
        }
        if (const auto* l = std::get_if<Launched>(&*m)) launched_.insert(l->slot);
        return m;
      }
    } catch (const Error& e) {
      const DaemonNode& node = nodes_[static_cast<size_t>(n)];
      for (int slot = 0; slot < static_cast<int>(node_of_slot_.size()); ++slot)
        if (node_of_slot_[static_cast<size_t>(slot)] == n && reported_ended_.insert(slot).second)
          ended_.push_back(
              {slot,
               "was lost with node '" + node.name + "' (" + node.address.str() + "): " + e.what(),
               true});
      c.reset();
      return std::nullopt;
    }
  }

  std::vector<DaemonNode> nodes_;
  std::vector<int> node_of_slot_;
  std::chrono::milliseconds timeout_;
  std::vector<std::unique_ptr<Channel>> channels_;  // by node; null: unused or lost
  std::deque<Ended> ended_;
  std::set<int> launched_, reported_ended_;
  std::map<int, double> offsets_;  // by node: its clock minus ours (s)
};

}  // namespace

void checkWorkersFit(const std::string& name, const NodeInfo& info, int n,
                     const std::vector<int>& node_of_slot, const std::vector<WorkerNeeds>& needs) {
  if (needs.empty()) return;
  int64_t need = 0;
  std::string workers;
  for (size_t s = 0; s < node_of_slot.size(); ++s) {
    if (node_of_slot[s] != n) continue;
    const WorkerNeeds& w = needs.at(s);
    const std::string who = w.worker.empty() ? "worker " + std::to_string(s) : w.worker;
    if (!w.device.empty()) {
      std::string has;
      bool found = false;
      for (const NodeDevice& d : info.devices) {
        found = found || d.id == w.device;
        has += (has.empty() ? "" : ", ") + d.id;
      }
      if (!found)
        throw InvalidArgument("node '" + name + "' has no device '" + w.device + "' for " + who +
                              " (it has " + has + "); nothing was started");
    }
    need += w.memory_bytes;
    workers +=
        (workers.empty() ? "" : ", ") + who + ": " + std::to_string(w.memory_bytes >> 20) + " MiB";
  }
  if (info.free_memory_bytes <= 0 || need <= info.free_memory_bytes) return;
  throw InvalidArgument("node '" + name + "' has " + std::to_string(info.free_memory_bytes >> 20) +
                        " MiB of memory free, and its workers need about " +
                        std::to_string(need >> 20) + " MiB (" + workers +
                        "): the job does not fit, and nothing was started");
}

std::unique_ptr<Launcher> daemonLauncher(const std::vector<DaemonNode>& nodes,
                                         const std::vector<int>& node_of_slot,
                                         const ClusterKey& cluster_key,
                                         std::chrono::milliseconds timeout,
                                         const std::vector<WorkerNeeds>& needs) {
  return std::make_unique<DaemonLauncher>(nodes, node_of_slot, cluster_key, timeout, needs);
}

}  // namespace tandem::runtime
