// The collectives of the cross-process groups, written once over one primitive: a
// transfer, in which this rank sends whole buffers to some peers and receives whole
// buffers from some peers, all at once. The groups (ZmqGroup over links, SocketGroup
// over plain sockets) differ only in how a transfer moves its bytes.
//
//   allreduce, ring (large): reduce-scatter then all-gather around the ring of ranks,
//     2(n-1) transfers each moving one slice; slice k is accumulated starting at rank
//     k+1 and ending at rank k, the same order on every run, each partial sum kept in
//     the slice of the buffer that the all-gather overwrites later.
//   allreduce, direct (small): every rank sends its buffer to every other and reduces all
//     of them in rank order (one transfer; the in-process group's order).
//   reduce-scatter / all-gather: the ring's halves. broadcast, scatter: the root sends to
//     each rank; reduce, gather: each rank sends to the root, which reduces in rank order.
//
// With a lossy codec every rank uses the values as the codec carries them — its own
// contribution and the root's broadcast data too — so that ranks stay identical.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/comm/group.h"
#include "transport/codec.h"

namespace tandem::transport {

class PeerGroup : public Group {
 public:
  PeerGroup(int rank, int size, Codec codec);

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce(std::span<float> data, const AllreduceOptions& o) override;
  void reduceScatter(std::span<float> data, const AllreduceOptions& o) override;
  void allGather(std::span<float> data, const CollectiveOptions& o) override;
  void broadcast(std::span<float> data, const RootOptions& o) override;
  void reduce(std::span<float> data, const ReduceOptions& o) override;
  void gather(std::span<const float> in, std::span<float> out, const RootOptions& o) override;
  void scatter(std::span<const float> in, std::span<float> out, const RootOptions& o) override;
  void barrier(const CollectiveOptions& o) override;

 protected:
  using Clock = std::chrono::steady_clock;

  // One collective call: what it is, the caller's tag, this group's call number, and
  // when it must be done.
  struct Call {
    const char* what;
    uint64_t tag, seq;
    Clock::time_point deadline;
    std::chrono::milliseconds timeout;
  };

  struct Send {
    int peer;
    std::span<const float> data;
  };
  // `count` values from `peer`: received straight into `into` when it is given (it holds
  // `count`), else handed to take(offset, values) piece by piece, in order.
  struct Recv {
    int peer;
    size_t count;
    std::span<float> into;
    std::function<void(size_t, std::span<const float>)> take;
  };

  // Moves every send to its peer and every receive from its peer before returning, the
  // two directions at once so that no rank waits on a peer that waits on it. `step`
  // tells the transfers of one call apart; a peer appears at most once among the sends
  // and once among the receives. A receive whose count differs from what the peer sent
  // raises InvalidArgument naming the peer ("rank P sent N values where this rank has
  // M"); a peer that does not send in time, Timeout naming it.
  virtual void transfer(const Call& c, int step, std::span<const Send> sends,
                        std::span<const Recv> recvs) = 0;

  // "allreduce (tag 5)": how messages name the call.
  static std::string callName(const Call& c);
  // "rank 2 of 4".
  std::string rankName(int rank) const;
  // The message that names a peer that did not send within the call's timeout.
  std::string silentPeer(const Call& c, int peer) const;

  const Codec codec_;
  const int rank_, size_;

 private:
  Call begin(const char* what, const CollectiveOptions& o);
  void checkRoot(const Call& c, int root) const;
  int mod(int x) const { return ((x % size_) + size_) % size_; }
  // One transfer of `out` to the right-hand rank and `in` from the left.
  void shift(const Call& c, int step, std::span<const float> out, Recv in);
  // Receives `count` values from each other rank (got[rank]; empty for this one).
  std::vector<std::vector<float>> fromEveryone(const Call& c, std::span<const Send> sends,
                                               size_t count);
  void reduceInRankOrder(std::span<float> data, std::span<const float> own,
                         const std::vector<std::vector<float>>& got, ReduceOp op) const;
  void ringReduceScatter(const Call& c, std::span<float> data, ReduceOp op, bool in_place);
  void ringAllGather(const Call& c, std::span<float> data);
  // `x` as the codec delivers it (unchanged for raw fp32).
  void asSent(std::span<float> x) const;

  uint64_t seq_ = 0;
};

}  // namespace tandem::transport
