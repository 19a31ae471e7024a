#include "runtime/control/admission.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <mutex>

namespace tandem::runtime {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {
// How long a connection in its handshake may leave bytes unread before it counts as idle.
constexpr std::chrono::milliseconds kUnreadGrace{250};
}  // namespace

// A handshake slot. Under State::mu. `kill_fd` (a duplicate of the socket, closed only
// when the slot is settled, so never a reused number) shuts the connection down if it is
// evicted while still idle.
struct Admission::Ticket::Slot {
  std::string source;
  std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
  bool hello = false, evicted = false, settled = false;
  int kill_fd = -1;
};

struct Admission::Ticket::State {
  mutable std::mutex mu;
  std::list<std::shared_ptr<Slot>> pending;  // in accept order
  AdmissionStats stats;
  // The log's rate limit: kLogBurst lines per kLogWindow, the rest counted.
  static constexpr int kLogBurst = 10;
  static constexpr std::chrono::seconds kLogWindow{10};
  std::chrono::steady_clock::time_point window_start{};
  int logged = 0;
  uint64_t unlogged = 0;

  // Whether a line may be logged now. Under mu.
  bool mayLog() {
    const auto now = std::chrono::steady_clock::now();
    if (now - window_start >= kLogWindow) {
      if (unlogged > 0)
        spdlog::warn("{} more refused or evicted connections were not logged in the last {} s",
                     unlogged, kLogWindow.count());
      window_start = now;
      logged = 0;
      unlogged = 0;
    }
    if (logged < kLogBurst) {
      ++logged;
      return true;
    }
    ++unlogged;
    return false;
  }

  void settle(Slot& s) {
    std::lock_guard lock(mu);
    if (s.settled) return;
    s.settled = true;
    if (s.kill_fd >= 0) ::close(s.kill_fd);
    s.kill_fd = -1;
    pending.remove_if([&](const std::shared_ptr<Slot>& p) { return p.get() == &s; });
  }
};

Admission::Ticket::Ticket(std::shared_ptr<State> state, std::shared_ptr<Slot> slot)
    : state_(std::move(state)), slot_(std::move(slot)) {}
Admission::Ticket::~Ticket() { settle(); }
void Admission::Ticket::hello() {
  std::lock_guard lock(state_->mu);
  slot_->hello = true;
}
void Admission::Ticket::settle() { state_->settle(*slot_); }
bool Admission::Ticket::evicted() const {
  std::lock_guard lock(state_->mu);
  return slot_->evicted;
}
const std::string& Admission::Ticket::source() const { return slot_->source; }

struct Admission::Waiting {
  Waiting(asio::io_context& io, tcp::socket s, std::string from)
      : socket(std::move(s)), timer(io), source(std::move(from)) {}
  tcp::socket socket;
  asio::steady_timer timer;
  std::string source;
  bool done = false;
};

Admission::Admission(asio::io_context& io, AdmissionOptions options, std::string what, Ready ready)
    : io_(io),
      options_(options),
      what_(std::move(what)),
      ready_(std::move(ready)),
      state_(std::make_shared<Ticket::State>()) {}

Admission::~Admission() = default;

void Admission::dropWaiting(const std::shared_ptr<Waiting>& w) {
  w->done = true;
  boost::system::error_code ignored;
  w->timer.cancel();
  w->socket.close(ignored);
  waiting_.remove(w);
}

void Admission::acceptFrom(tcp::acceptor& acceptor) {
  acceptor.async_accept(io_, [this, &acceptor](boost::system::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || stopped_) return;
    if (ec)
      spdlog::warn("{}: accepting a connection failed: {}", what_, ec.message());
    else
      add(std::move(socket));
    acceptFrom(acceptor);
  });
}

void Admission::add(tcp::socket socket) {
  boost::system::error_code addr_ec;
  const auto remote = socket.remote_endpoint(addr_ec);
  const std::string source = addr_ec ? std::string("?") : remote.address().to_string();
  // A full waiting room (in all, or for this source) gives up its oldest connection.
  const auto from_source = std::count_if(waiting_.begin(), waiting_.end(),
                                         [&](const auto& w) { return w->source == source; });
  const bool source_full = from_source >= options_.max_waiting_per_source;
  if (source_full || static_cast<int>(waiting_.size()) >= options_.max_waiting) {
    for (const auto& w : waiting_)
      if (!source_full || w->source == source) {
        const std::shared_ptr<Waiting> oldest = w;
        {
          std::lock_guard lock(state_->mu);
          ++state_->stats.evicted;
          if (state_->mayLog())
            spdlog::warn("{}: closed an idle connection from {} to make room for one from {}",
                         what_, oldest->source, source);
        }
        dropWaiting(oldest);
        break;
      }
  }
  auto w = std::make_shared<Waiting>(io_, std::move(socket), source);
  waiting_.push_back(w);
  w->timer.expires_after(options_.hello_timeout);
  w->timer.async_wait([this, w](boost::system::error_code ec) {
    if (ec || w->done) return;
    {
      std::lock_guard lock(state_->mu);
      ++state_->stats.refused;
      if (state_->mayLog())
        spdlog::warn("{}: closed a connection from {}: it said nothing within {} ms", what_,
                     w->source, options_.hello_timeout.count());
    }
    dropWaiting(w);
  });
  w->socket.async_wait(tcp::socket::wait_read, [this, w](boost::system::error_code ec) {
    if (w->done) return;
    w->done = true;
    w->timer.cancel();
    waiting_.remove(w);
    if (ec || stopped_) return;
    startHandshake(std::move(w->socket), w->source);
  });
}

void Admission::startHandshake(tcp::socket socket, const std::string& source) {
  std::shared_ptr<Ticket::Slot> slot;
  {
    std::lock_guard lock(state_->mu);
    int from_source = 0;
    for (const auto& p : state_->pending)
      if (!p->evicted && p->source == source) ++from_source;
    const int pending = static_cast<int>(std::count_if(
        state_->pending.begin(), state_->pending.end(), [](const auto& p) { return !p->evicted; }));
    const bool source_full = from_source >= options_.max_pending_per_source;
    if (pending >= options_.max_pending || source_full) {
      // Idle: no hello read yet, and nothing waiting to be read (its thread may not have
      // run yet on a loaded machine) unless it has had kUnreadGrace to read it.
      const auto now = std::chrono::steady_clock::now();
      auto idle = [&](const Ticket::Slot& s) {
        int unread = 0;
        return !s.hello && s.kill_fd >= 0 && ::ioctl(s.kill_fd, FIONREAD, &unread) == 0 &&
               (unread == 0 || now - s.since >= kUnreadGrace);
      };
      std::shared_ptr<Ticket::Slot> victim;
      for (const auto& p : state_->pending)  // oldest first
        if (!p->evicted && (!source_full || p->source == source) && idle(*p)) {
          victim = p;
          break;
        }
      if (!victim) {
        ++state_->stats.refused;
        if (state_->mayLog())
          spdlog::warn(
              "{}: closed a connection from {} unanswered: {} connections are in their "
              "handshake and none is idle",
              what_, source, source_full ? options_.max_pending_per_source : options_.max_pending);
        boost::system::error_code ignored;
        socket.close(ignored);
        return;
      }
      ::shutdown(victim->kill_fd, SHUT_RDWR);  // its handshake's read ends; its thread exits
      victim->evicted = true;
      ++state_->stats.evicted;
      if (state_->mayLog())
        spdlog::warn(
            "{}: shut an idle connection from {} (no hello yet) to make room for one "
            "from {}",
            what_, victim->source, source);
    }
    slot = std::make_shared<Ticket::Slot>();
    slot->source = source;
    slot->kill_fd = ::fcntl(socket.native_handle(), F_DUPFD_CLOEXEC, 0);
    state_->pending.push_back(slot);
  }
  auto ticket = std::make_shared<Ticket>(state_, std::move(slot));
  // The connection's own io_context, for the thread its owner starts.
  boost::system::error_code ec;
  const auto protocol = socket.local_endpoint(ec).protocol();
  if (ec) return;  // gone already (the ticket settles as it goes)
  auto conn_io = std::make_unique<asio::io_context>();
  tcp::socket moved(*conn_io, protocol, socket.release(ec));
  if (ec) return;
  ready_(std::move(conn_io), std::move(moved), std::move(ticket));
}

void Admission::stop() {
  stopped_ = true;
  while (!waiting_.empty()) dropWaiting(waiting_.front());
  std::lock_guard lock(state_->mu);
  for (const auto& p : state_->pending)
    if (p->kill_fd >= 0) ::shutdown(p->kill_fd, SHUT_RDWR);
}

void Admission::refused(const std::string& why, bool evicted) {
  std::lock_guard lock(state_->mu);
  ++state_->stats.refused;
  if (!evicted && state_->mayLog()) spdlog::warn("{}: refused {}", what_, why);
}

AdmissionStats Admission::stats() const {
  std::lock_guard lock(state_->mu);
  return state_->stats;
}

}  // namespace tandem::runtime
