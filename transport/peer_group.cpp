#include "transport/peer_group.h"

#include <algorithm>
#include <string>

#include "core/comm/reduce.h"
#include "core/error.h"

namespace tandem::transport {

PeerGroup::PeerGroup(int rank, int size, Codec codec) : codec_(codec), rank_(rank), size_(size) {
  TANDEM_CHECK_MSG(size >= 1 && rank >= 0 && rank < size, InvalidArgument,
                   "group: rank " << rank << " of " << size);
  TANDEM_CHECK_MSG(codec != Codec::kI8, InvalidArgument,
                   "group: int8 chunks are not supported (fp32, fp16 or bf16)");
}

void PeerGroup::allreduce(std::span<float> data, const AllreduceOptions& o) {
  Call c = begin("allreduce", o);
  if (data.empty() || size_ == 1) {
    finishReduce(data, o.op, size_);
    return;
  }
  const bool direct =
      o.algorithm == AllreduceAlgorithm::kDirect ||
      (o.algorithm == AllreduceAlgorithm::kAuto && data.size_bytes() <= o.small_bytes);
  if (direct) {
    std::vector<Send> sends;
    for (int p = 0; p < size_; ++p)
      if (p != rank_) sends.push_back({p, data});
    const std::vector<std::vector<float>> got = fromEveryone(c, sends, data.size());
    // This rank's own data as the codec carried it to the others, so that every rank
    // adds the same values.
    std::vector<float> own(data.begin(), data.end());
    asSent(own);
    reduceInRankOrder(data, own, got, o.op);
    return;
  }
  ringReduceScatter(c, data, o.op, true);
  const Slice own = sliceOf(data.size(), size_, rank_);
  asSent(data.subspan(own.begin, own.size()));  // as the others will receive it
  ringAllGather(c, data);
}

void PeerGroup::reduceScatter(std::span<float> data, const AllreduceOptions& o) {
  Call c = begin("reduce-scatter", o);
  if (size_ == 1) {
    finishReduce(data, o.op, 1);
    return;
  }
  ringReduceScatter(c, data, o.op, false);
}

void PeerGroup::allGather(std::span<float> data, const CollectiveOptions& o) {
  Call c = begin("all-gather", o);
  if (size_ > 1) ringAllGather(c, data);
}

void PeerGroup::broadcast(std::span<float> data, const RootOptions& o) {
  Call c = begin("broadcast", o);
  checkRoot(c, o.root);
  if (size_ == 1 || data.empty()) return;
  if (rank_ == o.root) {
    std::vector<Send> sends;
    for (int p = 0; p < size_; ++p)
      if (p != rank_) sends.push_back({p, data});
    transfer(c, 0, sends, {});
    asSent(data);
  } else {
    const Recv r{o.root, data.size(), data, {}};
    transfer(c, 0, {}, {&r, 1});
  }
}

void PeerGroup::reduce(std::span<float> data, const ReduceOptions& o) {
  Call c = begin("reduce", o);
  checkRoot(c, o.root);
  if (size_ == 1 || data.empty()) {
    finishReduce(data, o.op, size_);
    return;
  }
  if (rank_ != o.root) {
    const Send s{o.root, data};
    transfer(c, 0, {&s, 1}, {});
    return;
  }
  const std::vector<std::vector<float>> got = fromEveryone(c, {}, data.size());
  reduceInRankOrder(data, data, got, o.op);
}

void PeerGroup::gather(std::span<const float> in, std::span<float> out, const RootOptions& o) {
  Call c = begin("gather", o);
  checkRoot(c, o.root);
  if (rank_ != o.root) {
    if (!in.empty()) {
      const Send s{o.root, in};
      transfer(c, 0, {&s, 1}, {});
    }
    return;
  }
  TANDEM_CHECK_MSG(out.size() == static_cast<size_t>(size_) * in.size(), InvalidArgument,
                   callName(c) << ": the root's output holds " << out.size() << " elements, not "
                               << size_ << " x " << in.size());
  std::vector<Recv> recvs;
  for (int p = 0; p < size_; ++p) {
    const std::span<float> part = out.subspan(static_cast<size_t>(p) * in.size(), in.size());
    if (p == rank_) {
      std::copy(in.begin(), in.end(), part.begin());
    } else if (!in.empty()) {
      recvs.push_back({p, in.size(), part, {}});
    }
  }
  if (!recvs.empty()) transfer(c, 0, {}, recvs);
}

void PeerGroup::scatter(std::span<const float> in, std::span<float> out, const RootOptions& o) {
  Call c = begin("scatter", o);
  checkRoot(c, o.root);
  if (rank_ != o.root) {
    if (!out.empty()) {
      const Recv r{o.root, out.size(), out, {}};
      transfer(c, 0, {}, {&r, 1});
    }
    return;
  }
  TANDEM_CHECK_MSG(in.size() == static_cast<size_t>(size_) * out.size(), InvalidArgument,
                   callName(c) << ": the root's input holds " << in.size() << " elements, not "
                               << size_ << " x " << out.size());
  std::vector<Send> sends;
  for (int p = 0; p < size_; ++p) {
    const std::span<const float> part = in.subspan(static_cast<size_t>(p) * out.size(), out.size());
    if (p == rank_) {
      std::copy(part.begin(), part.end(), out.begin());
    } else if (!out.empty()) {
      sends.push_back({p, part});
    }
  }
  if (!sends.empty()) transfer(c, 0, sends, {});
}

void PeerGroup::barrier(const CollectiveOptions& o) {
  Call c = begin("barrier", o);
  if (size_ == 1) return;
  const float token = 0;
  std::vector<Send> sends;
  for (int p = 0; p < size_; ++p)
    if (p != rank_) sends.push_back({p, {&token, 1}});
  fromEveryone(c, sends, 1);
}

std::string PeerGroup::callName(const Call& c) {
  return std::string(c.what) + " (tag " + std::to_string(c.tag) + ")";
}

std::string PeerGroup::rankName(int rank) const {
  return "rank " + std::to_string(rank) + " of " + std::to_string(size_);
}

std::string PeerGroup::silentPeer(const Call& c, int peer) const {
  return callName(c) + ": " + rankName(peer) + " sent nothing within " +
         std::to_string(c.timeout.count()) + " ms";
}

PeerGroup::Call PeerGroup::begin(const char* what, const CollectiveOptions& o) {
  TANDEM_CHECK_MSG(o.timeout.count() > 0, InvalidArgument,
                   what << " (tag " << o.tag << "): the timeout must be positive");
  return {what, o.tag, seq_++, Clock::now() + o.timeout, o.timeout};
}

void PeerGroup::checkRoot(const Call& c, int root) const {
  TANDEM_CHECK_MSG(root >= 0 && root < size_, InvalidArgument,
                   callName(c) << ": root " << root << " in a group of " << size_);
}

void PeerGroup::shift(const Call& c, int step, std::span<const float> out, Recv in) {
  const Send s{mod(rank_ + 1), out};
  in.peer = mod(rank_ - 1);
  transfer(c, step, {&s, 1}, {&in, 1});
}

std::vector<std::vector<float>> PeerGroup::fromEveryone(const Call& c, std::span<const Send> sends,
                                                        size_t count) {
  std::vector<std::vector<float>> got(static_cast<size_t>(size_));
  std::vector<Recv> recvs;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    got[static_cast<size_t>(p)].resize(count);
    recvs.push_back({p, count, got[static_cast<size_t>(p)], {}});
  }
  transfer(c, 0, sends, recvs);
  return got;
}

// data = op over ranks in rank order: `own` in this rank's place, got[p] in rank p's
// (`own` may be `data`).
void PeerGroup::reduceInRankOrder(std::span<float> data, std::span<const float> own,
                                  const std::vector<std::vector<float>>& got, ReduceOp op) const {
  std::vector<const float*> src;
  for (int p = 0; p < size_; ++p)
    src.push_back(p == rank_ ? own.data() : got[static_cast<size_t>(p)].data());
  float* const out[] = {data.data()};
  reduceInto(out, src, 0, data.size(), op);
}

// After it, this rank's slice holds the reduction (steps 0 .. n-2). With `in_place`
// (allreduce, whose all-gather overwrites the rest) the partial sums are kept in the
// other slices of `data`, each sent on from where it was summed; else the rest of
// `data` is left as it was and they travel in `carry` and `partial`.
void PeerGroup::ringReduceScatter(const Call& c, std::span<float> data, ReduceOp op,
                                  bool in_place) {
  std::vector<float> carry, partial;
  for (int s = 0; s + 1 < size_; ++s) {
    const Slice out = sliceOf(data.size(), size_, mod(rank_ - 1 - s));
    const Slice in = sliceOf(data.size(), size_, mod(rank_ - 2 - s));
    const std::span<const float> mine = data.subspan(in.begin, in.size());
    // The last step sums into this rank's own slice.
    std::span<float> sum = data.subspan(in.begin, in.size());
    if (!in_place && s + 2 < size_) {
      partial.resize(in.size());
      sum = partial;
    }
    shift(c, s,
          in_place || s == 0 ? data.subspan(out.begin, out.size()) : std::span<const float>(carry),
          {0, in.size(), {}, [&](size_t at, std::span<const float> got) {
             // The partial sum from the left first, then this rank's: one order per slice.
             combine(sum.subspan(at, got.size()), got, mine.subspan(at, got.size()), op);
           }});
    if (!in_place) std::swap(carry, partial);
  }
  const Slice own = sliceOf(data.size(), size_, rank_);
  finishReduce(data.subspan(own.begin, own.size()), op, size_);
}

// Every rank's slice to every rank (steps n-1 .. 2n-3).
void PeerGroup::ringAllGather(const Call& c, std::span<float> data) {
  for (int s = 0; s + 1 < size_; ++s) {
    const Slice out = sliceOf(data.size(), size_, mod(rank_ - s));
    const Slice in = sliceOf(data.size(), size_, mod(rank_ - s - 1));
    shift(c, size_ + s, data.subspan(out.begin, out.size()),
          {0, in.size(), data.subspan(in.begin, in.size()), {}});
  }
}

void PeerGroup::asSent(std::span<float> x) const {
  if (codec_ == Codec::kRaw || x.empty()) return;
  Encoded e;
  encode(codec_, x, e);
  decode(codec_, e.payload, e.scales, e.block, x);
}

}  // namespace tandem::transport
