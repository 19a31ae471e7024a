#include "transport/socket_mesh.h"

#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "core/comm/pairs.h"
#include "core/error.h"
#include "transport/local_tcp.h"

namespace tandem::transport {

namespace {

constexpr uint32_t kHelloMagic = 0x4c454854;  // "THEL"

// The first bytes on every connection, from the connecting (higher) rank.
struct Hello {
  uint32_t magic;
  int32_t size, from, to;
  uint64_t group_id;
};
static_assert(sizeof(Hello) == 24);

class Rendezvous {
 public:
  Rendezvous(const SocketGroupOptions& o)
      : o_(o),
        tcp_(o.transport == "tcp"),
        socket_options_{o.socket_buffer_bytes, true},
        deadline_(tcp::Clock::now() + o.connect_timeout) {
    mesh_.peers.resize(static_cast<size_t>(o.size));
  }

  SocketMesh run(const Exchange& exchange) {
    // Listen first, so that a peer that learns this address can connect at once.
    std::string path;
    tcp::Address here;
    if (tcp_) {
      here = tcp::Address::resolve(o_.host, "0", true);
    } else {
      path = (std::filesystem::path(o_.ipc_dir) /
              ("tandem-group-" + std::to_string(::getpid()) + "-" + std::to_string(o_.group_id) +
               "-" + std::to_string(o_.rank)))
                 .string();
      here = tcp::Address::unixPath(path);
    }
    tcp::Listener listener(here, "group rank " + std::to_string(o_.rank) + " at " +
                                     (tcp_ ? o_.host : path),
                           o_.size, socket_options_);
    const std::string mine =
        tcp_ ? "tcp " + o_.host + " " + std::to_string(listener.port()) : "ipc " + path;

    const std::vector<std::string> all = exchange(mine);
    TANDEM_CHECK_MSG(all.size() == static_cast<size_t>(o_.size), FormatError,
                     "group: the exchange returned " << all.size() << " ranks, not " << o_.size);
    for (int p = 0; p < o_.rank; ++p) connectTo(p, all[static_cast<size_t>(p)]);
    acceptFromAbove(listener);
    for (const tcp::Socket& s : mesh_.peers)
      if (s.valid() && (!tcp_ || peerIsLocal(s.get()))) ++mesh_.ranks_here;
    return std::move(mesh_);
  }

 private:
  std::string rankName(int rank) const { return tandem::rankName(rank, o_.size); }
  std::string timeoutText() const { return std::to_string(o_.connect_timeout.count()) + " ms"; }

  // A new connection's TCP options: no Nagle delay; the local congestion control.
  void tune(int fd) const {
    if (!tcp_) return;
    tcp::setNoDelay(fd);
    chooseLocalCongestion(fd, o_.local_congestion);
  }

  void connectTo(int p, const std::string& published) {
    // "tcp HOST PORT", or "ipc PATH" (the path may hold spaces).
    std::istringstream words(published);
    std::string kind, where, port, extra;
    words >> kind;
    if (kind == "tcp") {
      words >> where >> port;
      if (words >> extra) where.clear();
    } else if (kind == "ipc" && published.size() > 4) {
      where = published.substr(4);
    }
    TANDEM_CHECK_MSG(kind == o_.transport && !where.empty() && (kind != "tcp" || !port.empty()),
                     FormatError,
                     "group: rank " << p << " published '" << published << "', not a "
                                    << o_.transport << " address");
    const tcp::Address there =
        kind == "tcp" ? tcp::Address::resolve(where, port, false) : tcp::Address::unixPath(where);
    const std::string who = "group: connecting to " + rankName(p) + " at " + published;
    tcp::Socket s;
    try {
      s = tcp::connectTo(there, socket_options_, deadline_, who);
    } catch (const Timeout& e) {
      throw Timeout(std::string(e.what()) + " (connect timeout " + timeoutText() + ")");
    }
    tune(s.get());
    const Hello hello{kHelloMagic, o_.size, o_.rank, p, o_.group_id};
    if (!tcp::writeAll(s.get(), &hello, sizeof(hello), deadline_, who))
      throw Timeout(who + ": it took no greeting within " + timeoutText());
    mesh_.peers[static_cast<size_t>(p)] = std::move(s);
  }

  // Every higher rank connects here; a connection that does not greet as one of them (a
  // stray client, another group's rank) is closed and the wait goes on.
  void acceptFromAbove(tcp::Listener& listener) {
    int missing = o_.size - 1 - o_.rank;
    std::string turned_away;
    while (missing > 0) {
      std::optional<tcp::Socket> s = listener.accept(deadline_, socket_options_);
      if (!s) {
        std::string names;
        for (int p = o_.rank + 1; p < o_.size; ++p)
          if (!mesh_.peers[static_cast<size_t>(p)].valid())
            names.append(" ").append(std::to_string(p));
        throw Timeout("group rendezvous: rank(s)" + names + " of " + std::to_string(o_.size) +
                      " did not connect to rank " + std::to_string(o_.rank) + " within " +
                      timeoutText() + turned_away);
      }
      Hello hello{};
      try {
        if (!tcp::readAll(s->get(), &hello, sizeof(hello), deadline_, "a connecting peer"))
          continue;
      } catch (const IoError&) {
        continue;
      }
      std::ostringstream why;
      if (hello.magic != kHelloMagic) {
        why << "a connection that is not a tandem group's";
      } else if (hello.group_id != o_.group_id || hello.size != o_.size || hello.to != o_.rank) {
        why << "rank " << hello.from << " of " << hello.size << " of group " << hello.group_id
            << " looking for rank " << hello.to;
      } else if (hello.from <= o_.rank || hello.from >= o_.size ||
                 mesh_.peers[static_cast<size_t>(hello.from)].valid()) {
        why << "a second or unexpected rank " << hello.from;
      }
      if (!why.str().empty()) {
        turned_away = " (turned away: " + why.str() + ")";
        continue;
      }
      tune(s->get());
      mesh_.peers[static_cast<size_t>(hello.from)] = std::move(*s);
      --missing;
    }
  }

  const SocketGroupOptions& o_;
  const bool tcp_;
  const tcp::SocketOptions socket_options_;
  const tcp::Clock::time_point deadline_;
  SocketMesh mesh_;
};

}  // namespace

SocketMesh connectMesh(const SocketGroupOptions& o, const Exchange& exchange) {
  return Rendezvous(o).run(exchange);
}

}  // namespace tandem::transport
