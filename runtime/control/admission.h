// Admission: what a listener that authenticates its connections (the node daemon's, the
// coordinator's) does before the handshake, so that connections without the key cannot
// lock out the clients that have it.
//
// A connection that has sent nothing yet waits in a waiting room without a thread of its
// own (a descriptor and a timer): the room holds at most `max_waiting` in all and
// `max_waiting_per_source` from one address, and past either the oldest is closed; one
// silent for `hello_timeout` is closed too. Its first bytes give it a handshake slot
// (a Ticket), for which its owner starts a thread: at most `max_pending` in all and
// `max_pending_per_source` from one address. Past either a new connection takes the slot
// of the oldest that has not said hello and has nothing waiting to be read, or has left
// it unread for 250 ms (it is shut down, so its handshake's read ends); when there is
// none, the new one is closed unanswered (connectChannelRetrying tries again). A client that says
// its hello at once is never idle for long, so a flood of idle (or one-byte) connections does not
// keep it out. Refusals and evictions are counted, and logged at most 10 times per 10 s (the rest
// summed up in a line).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>

namespace tandem::runtime {

struct AdmissionOptions {
  int max_waiting = 512, max_waiting_per_source = 256;
  int max_pending = 64, max_pending_per_source = 32;
  std::chrono::milliseconds hello_timeout{5000};
};

struct AdmissionStats {
  uint64_t refused = 0;  // closed unanswered or silent, and handshakes that failed
  uint64_t evicted = 0;  // idle connections closed or shut to make room for new ones
};

class Admission {
 public:
  // A connection's handshake slot, from its first bytes until settle() (or the ticket's
  // end). Thread-safe.
  class Ticket {
   public:
    ~Ticket();
    void hello();   // its hello was read: it is no longer idle
    void settle();  // the handshake is over (passed or failed): the slot is free
    bool evicted() const;
    const std::string& source() const;

    struct State;
    struct Slot;
    Ticket(std::shared_ptr<State> state, std::shared_ptr<Slot> slot);

   private:
    std::shared_ptr<State> state_;
    std::shared_ptr<Slot> slot_;
  };

  // Called on the io thread for a connection that has spoken and holds a slot, its socket
  // moved onto an io_context of its own: start its handshake on a thread of its own.
  using Ready =
      std::function<void(std::unique_ptr<boost::asio::io_context> io,
                         boost::asio::ip::tcp::socket socket, std::shared_ptr<Ticket> ticket)>;

  // `what` names the listener in log lines ("the daemon", "the run").
  Admission(boost::asio::io_context& io, AdmissionOptions options, std::string what, Ready ready);
  ~Admission();
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Accepts on `acceptor` (on the admission's io) into the waiting room, again and again,
  // until stop() or the acceptor is closed; a failed accept is logged.
  void acceptFrom(boost::asio::ip::tcp::acceptor& acceptor);
  // A connection just accepted: into the waiting room. On the io thread.
  void add(boost::asio::ip::tcp::socket socket);
  // Stops accepting, closes every waiting connection and shuts every pending handshake
  // down. On the io thread.
  void stop();
  // A handshake that failed (counted, logged at the bounded rate); `evicted` ones that
  // were shut to make room are counted already and not logged again.
  void refused(const std::string& why, bool evicted);
  AdmissionStats stats() const;

 private:
  struct Waiting;
  void dropWaiting(const std::shared_ptr<Waiting>& w);
  void startHandshake(boost::asio::ip::tcp::socket socket, const std::string& source);

  boost::asio::io_context& io_;
  AdmissionOptions options_;
  std::string what_;
  Ready ready_;
  std::shared_ptr<Ticket::State> state_;
  std::list<std::shared_ptr<Waiting>> waiting_;  // the room, in accept order (io thread only)
  bool stopped_ = false;                         // io thread only
};

}  // namespace tandem::runtime
