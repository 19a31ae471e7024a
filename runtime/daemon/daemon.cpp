#include "runtime/daemon/daemon.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <condition_variable>
#include <map>
#include <optional>
#include <set>
#include <variant>

#include "backends/registry.h"
#include "core/error.h"
#include "core/host_limits.h"
#include "core/profile/link_probe.h"
#include "runtime/control/channel_io.h"
#include "runtime/node/link_rules.h"
#include "runtime/node/node_info.h"
#include "runtime/node/node_profile.h"
#include "runtime/node/weight_cache.h"
#include "runtime/worker/launcher.h"
#include "transport/socket_link.h"

namespace tandem::runtime {

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace std::chrono_literals;

namespace {

// What one run may start on a node: more is refused, so no peer can exhaust the node's
// processes.
constexpr size_t kMaxWorkersPerRun = 256;
// Links a connection may hold open for measuring.
constexpr size_t kMaxOpenLinks = 64;

std::string hostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "node";
  return buf;
}

}  // namespace

HandshakeOptions daemonHandshakeOptions() {
  HandshakeOptions o;
  o.channel.max_message_bytes = size_t{4} << 20;
  o.channel.max_queued_bytes = size_t{8} << 20;
  return o;
}

bool isLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  boost::system::error_code ec;
  const asio::ip::address a = asio::ip::make_address(host, ec);
  return !ec && a.is_loopback();
}

struct Daemon::Impl {
  struct Conn {
    std::thread thread;
    std::atomic<bool> done{false};
    bool authenticated = false;  // under mu
  };

  explicit Impl(DaemonOptions o)
      : options(std::move(o)),
        acceptor(io),
        admission(io, admissionOptions(options), "tandemd",
                  [this](std::unique_ptr<asio::io_context> conn_io, tcp::socket s,
                         std::shared_ptr<Admission::Ticket> ticket) {
                    startSession(std::move(conn_io), std::move(s), std::move(ticket));
                  }) {
    if (options.name.empty()) options.name = hostName();
    if (options.handshake.build.empty()) options.handshake.build = buildName();
    const Endpoint at = parseEndpoint(options.listen, /*allow_any_port=*/true);
    boost::system::error_code ec;
    tcp::resolver resolver(io);
    const auto found = resolver.resolve(at.host, std::to_string(at.port), ec);
    if (ec || found.empty())
      throw IoError("cannot listen on " + at.str() + ": " +
                    (ec ? ec.message() : std::string("no such address")));
    const tcp::endpoint e = found.begin()->endpoint();
    acceptor.open(e.protocol(), ec);
    if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(e, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) throw IoError("cannot listen on " + at.str() + ": " + ec.message());
    info = localNodeInfo(options.name);
  }

  static AdmissionOptions admissionOptions(const DaemonOptions& o) {
    AdmissionOptions a = o.admission;
    a.hello_timeout = o.handshake.timeout;
    return a;
  }

  // A connection that holds a handshake slot: a thread of its own for the handshake and
  // the session. On the io thread.
  void startSession(std::unique_ptr<asio::io_context> conn_io, tcp::socket moved,
                    std::shared_ptr<Admission::Ticket> ticket) {
    if (stopping) {
      // Closed here: the parameters may go in any order, and an open socket must not
      // outlive its io_context.
      boost::system::error_code ignored;
      moved.close(ignored);
      return;
    }
    std::lock_guard lock(mu);
    conns.remove_if([](Conn& c) {
      if (!c.done) return false;
      c.thread.join();
      return true;
    });
    int authenticated = 0;
    for (const Conn& c : conns) authenticated += c.authenticated ? 1 : 0;
    Conn& c = conns.emplace_back();
    c.thread =
        std::thread([this, &c, io = std::move(conn_io), s = std::move(moved), t = std::move(ticket),
                     busy = authenticated >= options.max_connections]() mutable {
          serve(std::move(io), std::move(s), busy, c, *t);
          t.reset();
          c.done = true;
        });
  }

  // One connection, on its own thread. Never throws: nothing a peer does ends the daemon.
  void serve(std::unique_ptr<asio::io_context> conn_io, tcp::socket socket, bool busy, Conn& conn,
             Admission::Ticket& ticket) noexcept {
    const std::string peer = peerName(socket);
    try {
      std::unique_ptr<Channel> channel;
      try {
        HandshakeOptions handshake = options.handshake;
        handshake.on_hello = [&ticket] { ticket.hello(); };
        channel =
            acceptChannel(std::move(conn_io), std::move(socket), options.key, handshake, busy);
      } catch (const Error& e) {
        ticket.settle();
        admission.refused(e.what(), ticket.evicted());
        return;
      }
      ticket.settle();
      {
        std::lock_guard lock(mu);
        conn.authenticated = true;
        ++stats.accepted;
      }
      spdlog::info("{} connected ({})", peer, channel->peerHello().build);
      NodeInfo now = info;
      const NodeInfo fresh = localNodeInfo(options.name, false);  // load and memory now
      now.load = fresh.load;
      now.free_memory_bytes = fresh.free_memory_bytes;
      if (!options.cache_dir.empty()) {
        now.cached_weights = WeightCache(options.cache_dir, 0).hashes();
        if (now.cached_weights.size() > kMaxCachedWeights)
          now.cached_weights.resize(kMaxCachedWeights);
      }
      channel->send(now);
      answer(*channel);
    } catch (const std::exception& e) {
      spdlog::warn("connection with {} ended: {}", peer, e.what());
    }
    std::lock_guard lock(mu);
    conn.authenticated = false;  // its slot is free (its thread is ending)
  }

  // The workers a connection started: stopped however the connection ends.
  struct Workers {
    Impl& daemon;
    std::unique_ptr<Launcher> launcher;
    std::set<int> slots;  // started by this connection
    ~Workers() {
      if (!launcher) return;
      launcher->stopAll();
      {
        std::lock_guard lock(daemon.mu);
        daemon.job_owner = nullptr;
      }
      daemon.owner_freed.notify_all();
    }
  };

  // True once no other connection's run holds this node (waiting up to kOwnerWait for one
  // that is stopping its workers): a node in a run serves only that run's coordinator,
  // node information aside.
  bool freeOfOtherRuns(const Channel& channel) {
    std::unique_lock lock(mu);
    return owner_freed.wait_for(lock, kOwnerWait,
                                [&] { return !job_owner || job_owner == &channel; });
  }

  void launch(Channel& channel, const Launch& l, Workers& workers) {
    if (options.worker_program.empty())
      return channel.send(ErrorReply{"this daemon starts no workers"});
    Endpoint coordinator;
    try {
      coordinator = parseEndpoint(l.coordinator);
    } catch (const InvalidArgument& e) {
      return channel.send(ErrorReply{std::string("launch: ") + e.what()});
    }
    {
      // A run that has just ended (its coordinator said `leave`, or recovers from a lost
      // node and starts anew) may still be stopping its workers: wait for them a while.
      std::unique_lock lock(mu);
      if (!owner_freed.wait_for(lock, kOwnerWait,
                                [&] { return !job_owner || job_owner == &channel; }))
        return channel.send(
            ErrorReply{"this node runs the workers of another run; one run at a time"});
      job_owner = &channel;
    }
    if (workers.slots.count(l.slot))
      return channel.send(
          ErrorReply{"launch: worker " + std::to_string(l.slot) + " was started already"});
    if (workers.slots.size() >= kMaxWorkersPerRun)
      return channel.send(ErrorReply{"launch: a run may start at most " +
                                     std::to_string(kMaxWorkersPerRun) + " workers on a node"});
    if (!workers.launcher)
      workers.launcher = processLauncher(options.worker_program, options.worker_args);
    workers.slots.insert(l.slot);
    ClusterKey key;
    key.bytes = l.key;
    const int64_t pid = workers.launcher->start(l.slot, coordinator, key);
    spdlog::info("started worker {} (pid {}) for {}'s run", l.slot, pid, channel.peer());
    channel.send(Launched{l.slot, pid});
  }

  // The links a connection opened to measure (link tasks), by pair.
  struct Links {
    std::unique_ptr<Backend> backend;
    std::map<int64_t, std::unique_ptr<transport::SocketLink>> open;
  };

  // Runs one link task (core/profile/link_probe.h) and answers it.
  void linkTask(Channel& channel, const LinkTask& t, Links& links) {
    if (!links.backend) links.backend = makeBackend("cpu");
    // Sealed as a run's tcp links are, so that what is measured is what a run pays; the
    // key is the one both daemons hold, the cluster's.
    const transport::LinkKey key = dataPlaneLinkKey(options.key);
    auto options = [&] {
      checkBindHost(t.bind_host);
      transport::LinkOptions o;
      o.bind = "tcp://" + t.bind_host + ":*";
      o.timeout = std::chrono::seconds(30);
      return o;
    };
    // The loaded runs compute on a one-thread CPU backend beside the link, as a stage does;
    // never within the node, where one process holds both ends and neither cost is its own.
    std::function<std::unique_ptr<Backend>()> load;
    if (t.loaded && t.kind != LinkTaskKind::kLocal)
      load = [] { return makeBackend("cpu", BackendOptions{1}); };
    const LinkProbeOptions probe{t.message_bytes, t.window, t.warmup, t.repeats, load};
    auto result = [&](const LinkMeasurement& m) {
      return LinkResult{t.pair,
                        "",
                        m.bandwidth,
                        m.latency_s,
                        m.round_trip.median,
                        m.round_trip.min,
                        m.round_trip.max,
                        static_cast<int32_t>(m.round_trip.repeats),
                        m.host_cpu_s,
                        m.data_bytes,
                        hostBootId(),
                        m.process_cpu_s,
                        m.loaded_cpu_s,
                        m.loaded_bytes};
    };
    switch (t.kind) {
      case LinkTaskKind::kOpen: {
        if (links.open.size() >= kMaxOpenLinks)
          throw InvalidArgument("at most " + std::to_string(kMaxOpenLinks) + " links open");
        auto link = std::make_unique<transport::SocketLink>(options(), key);
        const std::string endpoint = link->endpoint();
        links.open[t.pair] = std::move(link);
        return channel.send(LinkResult{t.pair, endpoint, 0, 0, 0, 0, 0, 0});
      }
      case LinkTaskKind::kServe:
      case LinkTaskKind::kMeasure: {
        const auto it = links.open.find(t.pair);
        if (it == links.open.end())
          throw InvalidArgument("pair " + std::to_string(t.pair) + " was never opened");
        std::unique_ptr<transport::SocketLink> link = std::move(it->second);
        links.open.erase(it);
        checkPeerEndpoint(t.peer);
        link->connect(t.peer);
        if (t.kind == LinkTaskKind::kServe) {
          const EchoCpu cpu = echoLink(*link, *links.backend, load);
          return channel.send(LinkResult{t.pair, "", 0, 0, 0, 0, 0, 0, cpu.host_cpu_s, 0,
                                         hostBootId(), cpu.process_cpu_s, cpu.loaded_cpu_s});
        }
        return channel.send(result(measureLink(*link, *links.backend, probe)));
      }
      case LinkTaskKind::kLocal: {
        // Both ends on this node: the echo side on a thread of its own with its own
        // backend (one thread drives a link, and a backend).
        transport::SocketLink near(options(), key), far(options(), key);
        near.connect(far.endpoint());
        far.connect(near.endpoint());
        LinkMeasurement measured;
        bothEnds(
            [&] {
              auto backend = makeBackend("cpu");
              echoLink(far, *backend);
            },
            [&] { measured = measureLink(near, *links.backend, probe); });
        return channel.send(result(measured));
      }
    }
  }

  void answer(Channel& channel) {
    Workers workers{*this, nullptr, {}};
    Links links;
    while (!stopping) {
      if (workers.launcher)
        while (const auto e = workers.launcher->ended()) {
          spdlog::info("worker {} {}", e->slot, e->how);
          channel.send(WorkerEnded{e->slot, e->how, e->killed});
        }
      std::optional<Message> m;
      try {
        m = channel.recv(200ms);
      } catch (const FormatError& e) {
        {
          std::lock_guard lock(mu);
          ++stats.bad_messages;
        }
        spdlog::warn("{}", e.what());
        channel.send(ErrorReply{std::string(e.what()).substr(0, kMaxTextBytes)});
        continue;
      } catch (const IoError& e) {
        spdlog::info("{}", e.what());
        return;
      }
      if (!m) continue;
      if ((std::holds_alternative<LinkTask>(*m) || std::holds_alternative<ProfileTask>(*m)) &&
          !freeOfOtherRuns(channel)) {
        channel.send(ErrorReply{std::string(messageName(*m)) +
                                ": this node runs another run's workers; only that run's "
                                "coordinator may give it tasks"});
        continue;
      }
      if (const auto* ping = std::get_if<Ping>(&*m)) {
        const int64_t received = realtimeNs();
        channel.send(Pong{ping->id, ping->sent_ns, received, realtimeNs()});
      } else if (const auto* leave = std::get_if<Leave>(&*m)) {
        spdlog::info("{} left: {}", channel.peer(), leave->reason);
        channel.close();
        return;
      } else if (const auto* l = std::get_if<Launch>(&*m)) {
        try {
          launch(channel, *l, workers);
        } catch (const Error& e) {
          channel.send(ErrorReply{std::string("launch: ") + e.what()});
        }
      } else if (const auto* t = std::get_if<LinkTask>(&*m)) {
        try {
          linkTask(channel, *t, links);
        } catch (const Error& e) {
          channel.send(
              ErrorReply{(std::string("link task: ") + e.what()).substr(0, kMaxTextBytes)});
        }
      } else if (const auto* t = std::get_if<ProfileTask>(&*m)) {
        // On this connection's thread (heartbeats go on on the channel's): a peer that
        // leaves meanwhile gets no answer, and the next task waits for this one.
        try {
          channel.send(profileHere(*t, options.cache_dir));
        } catch (const std::exception& e) {  // bad_alloc too: a model too big for the node
          spdlog::warn("{}: profile task failed: {}", channel.peer(), e.what());
          channel.send(
              ErrorReply{(std::string("profile task: ") + e.what()).substr(0, kMaxTextBytes)});
        }
      } else if (const auto* node = std::get_if<NodeInfo>(&*m)) {
        spdlog::info("{} is {} ({})", channel.peer(), node->name, node->build);
      } else {
        {
          std::lock_guard lock(mu);
          ++stats.bad_messages;
        }
        spdlog::warn("{} sent an unexpected '{}' message", channel.peer(), messageName(*m));
        channel.send(ErrorReply{std::string("unexpected '") + messageName(*m) + "' message"});
      }
    }
    channel.send(Leave{"the daemon is stopping"});
    channel.close(1s);
  }

  DaemonOptions options;
  asio::io_context io;
  tcp::acceptor acceptor;
  NodeInfo info;  // gathered once; load and free memory are refreshed per connection
  const Channel* job_owner = nullptr;   // the connection whose workers run now (under mu)
  std::condition_variable owner_freed;  // job_owner became null
  // How long a launch waits for another run's workers to be stopped (they get SIGTERM,
  // then SIGKILL after 3 s).
  static constexpr std::chrono::milliseconds kOwnerWait{5000};
  std::atomic<bool> stopping{false};
  Admission admission;
  mutable std::mutex mu;  // conns, stats
  std::list<Conn> conns;
  DaemonStats stats;
};

Daemon::Daemon(DaemonOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Daemon::~Daemon() {
  stop();
  std::lock_guard lock(impl_->mu);
  for (Impl::Conn& c : impl_->conns)
    if (c.thread.joinable()) c.thread.join();
}

Endpoint Daemon::endpoint() const {
  const tcp::endpoint e = impl_->acceptor.local_endpoint();
  return {e.address().to_string(), e.port()};
}

void Daemon::run() {
  spdlog::info("tandemd {} ({}) listening on {} as node '{}'", impl_->info.build, impl_->info.arch,
               endpoint().str(), impl_->options.name);
  impl_->admission.acceptFrom(impl_->acceptor);
  impl_->io.run();
  std::list<Impl::Conn> conns;
  {
    std::lock_guard lock(impl_->mu);
    conns.swap(impl_->conns);
  }
  for (Impl::Conn& c : conns) c.thread.join();
}

void Daemon::stop() {
  impl_->stopping = true;
  asio::post(impl_->io, [this] {
    boost::system::error_code ignored;
    impl_->acceptor.close(ignored);
    impl_->admission.stop();
  });
}

DaemonStats Daemon::stats() const {
  DaemonStats s;
  {
    std::lock_guard lock(impl_->mu);
    s = impl_->stats;
  }
  const AdmissionStats a = impl_->admission.stats();
  s.refused = a.refused;
  s.evicted = a.evicted;
  return s;
}

}  // namespace tandem::runtime
