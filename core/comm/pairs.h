// Pairs: the primitive every cross-process collective is written over (Gloo's pairs).
// A rank of `size()` holds a connection to every other rank; a transfer sends whole
// buffers to some peers and receives whole buffers from some peers, all at once.
// Implementations (transport/) differ only in how a transfer moves its bytes: plain
// sockets (socket_pairs.h) or ZeroMQ links (zmq_pairs.h). The collectives' algorithms
// are free functions over Pairs (core/comm/collectives.h); a Group made of Pairs
// (makePairGroup) is what trainers hold, beside the in-process group that shares memory.
//
// Threading: one thread at a time calls a Pairs.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

namespace tandem {

// One collective call: what it is, the caller's tag, the Pairs' call number, the step
// within the call, and when the call must be done. Every rank's transfers of one call
// carry the same (what, tag, seq, step); a peer whose differ is out of step.
struct Transfer {
  using Clock = std::chrono::steady_clock;
  const char* what = "";
  uint64_t tag = 0, seq = 0;
  int step = 0;
  Clock::time_point deadline;
  std::chrono::milliseconds timeout{0};
};

struct PairSend {
  int peer = 0;
  std::span<const float> data;
};

// `count` values from `peer`: received straight into `into` when it is given (it holds
// `count`), else handed to take(offset, values) piece by piece, in order.
struct PairRecv {
  int peer = 0;
  size_t count = 0;
  std::span<float> into;
  std::function<void(size_t, std::span<const float>)> take;
};

class Pairs {
 public:
  virtual ~Pairs() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Moves every send to its peer and every receive from its peer before returning, the
  // two directions at once so that no rank waits on a peer that waits on it. A peer
  // appears at most once among the sends and once among the receives. A receive whose
  // count differs from what the peer sent raises InvalidArgument naming the peer ("rank
  // P sent N values where this rank has M"); a peer that does not send by the deadline,
  // Timeout naming it (silentPeer); a closed connection, IoError naming it.
  virtual void transfer(const Transfer& t, std::span<const PairSend> sends,
                        std::span<const PairRecv> recvs) = 0;

  // `x` as a transfer delivers it to the peers: unchanged for fp32, rounded for a
  // reduced-precision wire. The collectives use a rank's own contribution this way, so
  // that every rank adds the same values.
  virtual void asSent(std::span<float> x) const = 0;

  // The number of the next collective call on these pairs: every rank counts the same.
  uint64_t nextCall() { return calls_++; }

 private:
  uint64_t calls_ = 0;
};

// "allreduce (tag 5)": how messages name a call.
std::string callName(const Transfer& t);
// "rank 2 of 4".
std::string rankName(int rank, int size);
// The message that names a peer that did not send within the call's timeout.
std::string silentPeer(const Transfer& t, int peer, int size);

}  // namespace tandem
