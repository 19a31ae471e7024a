#include "core/comm/collectives.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/reduce.h"
#include "core/error.h"

namespace tandem {

std::string callName(const Transfer& t) {
  return std::string(t.what) + " (tag " + std::to_string(t.tag) + ")";
}

std::string rankName(int rank, int size) {
  return "rank " + std::to_string(rank) + " of " + std::to_string(size);
}

std::string silentPeer(const Transfer& t, int peer, int size) {
  return callName(t) + ": " + rankName(peer, size) + " sent nothing within " +
         std::to_string(t.timeout.count()) + " ms";
}

namespace {

// One collective call on `p`: its transfers are `call` with their own step.
class Call {
 public:
  Call(Pairs& p, const char* what, const CollectiveOptions& o) : p_(p) {
    TANDEM_CHECK_MSG(o.timeout.count() > 0, InvalidArgument,
                     what << " (tag " << o.tag << "): the timeout must be positive");
    t_ = {what, o.tag, p.nextCall(), 0, Transfer::Clock::now() + o.timeout, o.timeout};
    rank_ = p.rank();
    size_ = p.size();
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string name() const { return callName(t_); }

  void transfer(int step, std::span<const PairSend> sends, std::span<const PairRecv> recvs) {
    Transfer t = t_;
    t.step = step;
    p_.transfer(t, sends, recvs);
  }
  void asSent(std::span<float> x) const {
    if (!x.empty()) p_.asSent(x);
  }

  void checkRoot(int root) const {
    TANDEM_CHECK_MSG(root >= 0 && root < size_, InvalidArgument,
                     name() << ": root " << root << " in a group of " << size_);
  }

  int mod(int x) const { return ((x % size_) + size_) % size_; }

  // One transfer of `out` to the right-hand rank and `in` from the left.
  void shift(int step, std::span<const float> out, PairRecv in) {
    const PairSend s{mod(rank_ + 1), out};
    in.peer = mod(rank_ - 1);
    transfer(step, {&s, 1}, {&in, 1});
  }

  // Receives `count` values from each other rank (got[rank]; empty for this one) while
  // `sends` go out.
  std::vector<std::vector<float>> fromEveryone(std::span<const PairSend> sends, size_t count) {
    std::vector<std::vector<float>> got(static_cast<size_t>(size_));
    std::vector<PairRecv> recvs;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      got[static_cast<size_t>(q)].resize(count);
      recvs.push_back({q, count, got[static_cast<size_t>(q)], {}});
    }
    transfer(0, sends, recvs);
    return got;
  }

  // Every other rank, with `data`.
  std::vector<PairSend> toEveryone(std::span<const float> data) const {
    std::vector<PairSend> sends;
    for (int q = 0; q < size_; ++q)
      if (q != rank_) sends.push_back({q, data});
    return sends;
  }

  // data = op over ranks in rank order: `own` in this rank's place, got[q] in rank q's
  // (`own` may be `data`).
  void reduceInRankOrder(std::span<float> data, std::span<const float> own,
                         const std::vector<std::vector<float>>& got, ReduceOp op) const {
    std::vector<const float*> src;
    for (int q = 0; q < size_; ++q)
      src.push_back(q == rank_ ? own.data() : got[static_cast<size_t>(q)].data());
    float* const out[] = {data.data()};
    reduceInto(out, src, 0, data.size(), op);
  }

  // The root of a reduce that is part of an allreduce's buffer (ReduceOptions::
  // allreduce_count): each element of `data` (the buffer's from allreduce_offset) as the
  // ring reduces it — slice j from rank j + 1 around to rank j, this rank's own `data`
  // among them — or in rank order where that allreduce would run direct.
  void reduceAsAllreduce(std::span<float> data, const std::vector<std::vector<float>>& got,
                         const ReduceOptions& o) const {
    const size_t whole = o.allreduce_count;
    const bool direct =
        o.algorithm == AllreduceAlgorithm::kDirect ||
        (o.algorithm == AllreduceAlgorithm::kAuto && whole * sizeof(float) <= o.small_bytes);
    if (direct) {
      reduceInRankOrder(data, data, got, o.op);
      return;
    }
    std::vector<float> acc;
    for (int j = 0; j < size_; ++j) {
      const Slice ring = sliceOf(whole, size_, j);
      const size_t lo = std::max(ring.begin, o.allreduce_offset);
      const size_t hi = std::min(ring.end, o.allreduce_offset + data.size());
      if (lo >= hi) continue;
      const size_t at = lo - o.allreduce_offset, n = hi - lo;
      auto from = [&](int q) {
        return q == rank_ ? std::span<const float>(data.subspan(at, n))
                          : std::span<const float>(got[static_cast<size_t>(q)]).subspan(at, n);
      };
      const std::span<const float> first = from(mod(j + 1));
      acc.assign(first.begin(), first.end());
      for (int k = 2; k <= size_; ++k) accumulate(acc, from(mod(j + k)), o.op);
      finishReduce(acc, o.op, size_);
      std::copy(acc.begin(), acc.end(), data.begin() + static_cast<std::ptrdiff_t>(at));
    }
  }

  // After it, this rank's slice holds the reduction (steps 0 .. n-2). With `in_place`
  // (allreduce, whose all-gather overwrites the rest) the partial sums are kept in the
  // other slices of `data`, each sent on from where it was summed; else the rest of
  // `data` is left as it was and they travel in `carry` and `partial`.
  void ringReduceScatter(std::span<float> data, ReduceOp op, bool in_place) {
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
      shift(
          s,
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
  void ringAllGather(std::span<float> data) {
    for (int s = 0; s + 1 < size_; ++s) {
      const Slice out = sliceOf(data.size(), size_, mod(rank_ - s));
      const Slice in = sliceOf(data.size(), size_, mod(rank_ - s - 1));
      shift(size_ + s, data.subspan(out.begin, out.size()),
            {0, in.size(), data.subspan(in.begin, in.size()), {}});
    }
  }

 private:
  Pairs& p_;
  Transfer t_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

void allreduce(Pairs& p, std::span<float> data, const AllreduceOptions& o) {
  Call c(p, "allreduce", o);
  if (data.empty() || c.size() == 1) {
    finishReduce(data, o.op, c.size());
    return;
  }
  const bool direct =
      o.algorithm == AllreduceAlgorithm::kDirect ||
      (o.algorithm == AllreduceAlgorithm::kAuto && data.size_bytes() <= o.small_bytes);
  if (direct) {
    const std::vector<std::vector<float>> got = c.fromEveryone(c.toEveryone(data), data.size());
    // This rank's own data as the wire carried it to the others, so that every rank adds
    // the same values.
    std::vector<float> own(data.begin(), data.end());
    c.asSent(own);
    c.reduceInRankOrder(data, own, got, o.op);
    return;
  }
  c.ringReduceScatter(data, o.op, true);
  const Slice own = sliceOf(data.size(), c.size(), c.rank());
  c.asSent(data.subspan(own.begin, own.size()));  // as the others will receive it
  c.ringAllGather(data);
}

void reduceScatter(Pairs& p, std::span<float> data, const AllreduceOptions& o) {
  Call c(p, "reduce-scatter", o);
  if (c.size() == 1) {
    finishReduce(data, o.op, 1);
    return;
  }
  c.ringReduceScatter(data, o.op, false);
}

void allGather(Pairs& p, std::span<float> data, const CollectiveOptions& o) {
  Call c(p, "all-gather", o);
  if (c.size() > 1) c.ringAllGather(data);
}

void broadcast(Pairs& p, std::span<float> data, const RootOptions& o) {
  Call c(p, "broadcast", o);
  c.checkRoot(o.root);
  if (c.size() == 1 || data.empty()) return;
  if (c.rank() == o.root) {
    c.transfer(0, c.toEveryone(data), {});
    c.asSent(data);
  } else {
    const PairRecv r{o.root, data.size(), data, {}};
    c.transfer(0, {}, {&r, 1});
  }
}

void reduce(Pairs& p, std::span<float> data, const ReduceOptions& o) {
  Call c(p, "reduce", o);
  c.checkRoot(o.root);
  if (c.size() == 1 || data.empty()) {
    finishReduce(data, o.op, c.size());
    return;
  }
  if (c.rank() != o.root) {
    const PairSend s{o.root, data};
    c.transfer(0, {&s, 1}, {});
    return;
  }
  const std::vector<std::vector<float>> got = c.fromEveryone({}, data.size());
  if (o.allreduce_count > 0) {
    TANDEM_CHECK_MSG(o.allreduce_offset + data.size() <= o.allreduce_count, InvalidArgument,
                     c.name() << ": elements [" << o.allreduce_offset << ", "
                              << o.allreduce_offset + data.size() << ") of an allreduce of "
                              << o.allreduce_count);
    c.reduceAsAllreduce(data, got, o);
    return;
  }
  c.reduceInRankOrder(data, data, got, o.op);
}

void gather(Pairs& p, std::span<const float> in, std::span<float> out, const RootOptions& o) {
  Call c(p, "gather", o);
  c.checkRoot(o.root);
  if (c.rank() != o.root) {
    if (!in.empty()) {
      const PairSend s{o.root, in};
      c.transfer(0, {&s, 1}, {});
    }
    return;
  }
  TANDEM_CHECK_MSG(out.size() == static_cast<size_t>(c.size()) * in.size(), InvalidArgument,
                   c.name() << ": the root's output holds " << out.size() << " elements, not "
                            << c.size() << " x " << in.size());
  std::vector<PairRecv> recvs;
  for (int q = 0; q < c.size(); ++q) {
    const std::span<float> part = out.subspan(static_cast<size_t>(q) * in.size(), in.size());
    if (q == c.rank()) {
      std::copy(in.begin(), in.end(), part.begin());
    } else if (!in.empty()) {
      recvs.push_back({q, in.size(), part, {}});
    }
  }
  if (!recvs.empty()) c.transfer(0, {}, recvs);
}

void scatter(Pairs& p, std::span<const float> in, std::span<float> out, const RootOptions& o) {
  Call c(p, "scatter", o);
  c.checkRoot(o.root);
  if (c.rank() != o.root) {
    if (!out.empty()) {
      const PairRecv r{o.root, out.size(), out, {}};
      c.transfer(0, {}, {&r, 1});
    }
    return;
  }
  TANDEM_CHECK_MSG(in.size() == static_cast<size_t>(c.size()) * out.size(), InvalidArgument,
                   c.name() << ": the root's input holds " << in.size() << " elements, not "
                            << c.size() << " x " << out.size());
  std::vector<PairSend> sends;
  for (int q = 0; q < c.size(); ++q) {
    const std::span<const float> part = in.subspan(static_cast<size_t>(q) * out.size(), out.size());
    if (q == c.rank()) {
      std::copy(part.begin(), part.end(), out.begin());
    } else if (!out.empty()) {
      sends.push_back({q, part});
    }
  }
  if (!sends.empty()) c.transfer(0, sends, {});
}

void barrier(Pairs& p, const CollectiveOptions& o) {
  Call c(p, "barrier", o);
  if (c.size() == 1) return;
  const float token = 0;
  c.fromEveryone(c.toEveryone({&token, 1}), 1);
}

namespace {

class PairGroup final : public Group {
 public:
  explicit PairGroup(std::unique_ptr<Pairs> pairs) : pairs_(std::move(pairs)) {
    TANDEM_CHECK_MSG(pairs_ != nullptr, InvalidArgument, "a pair group needs its pairs");
  }
  int rank() const override { return pairs_->rank(); }
  int size() const override { return pairs_->size(); }
  void allreduce(std::span<float> data, const AllreduceOptions& o) override {
    tandem::allreduce(*pairs_, data, o);
  }
  void reduceScatter(std::span<float> data, const AllreduceOptions& o) override {
    tandem::reduceScatter(*pairs_, data, o);
  }
  void allGather(std::span<float> data, const CollectiveOptions& o) override {
    tandem::allGather(*pairs_, data, o);
  }
  void broadcast(std::span<float> data, const RootOptions& o) override {
    tandem::broadcast(*pairs_, data, o);
  }
  void reduce(std::span<float> data, const ReduceOptions& o) override {
    tandem::reduce(*pairs_, data, o);
  }
  void gather(std::span<const float> in, std::span<float> out, const RootOptions& o) override {
    tandem::gather(*pairs_, in, out, o);
  }
  void scatter(std::span<const float> in, std::span<float> out, const RootOptions& o) override {
    tandem::scatter(*pairs_, in, out, o);
  }
  void barrier(const CollectiveOptions& o) override { tandem::barrier(*pairs_, o); }

  Pairs& pairs() const { return *pairs_; }

 private:
  std::unique_ptr<Pairs> pairs_;
};

}  // namespace

std::unique_ptr<Group> makePairGroup(std::unique_ptr<Pairs> pairs) {
  return std::make_unique<PairGroup>(std::move(pairs));
}

Pairs* pairsOf(Group& group) {
  auto* g = dynamic_cast<PairGroup*>(&group);
  return g ? &g->pairs() : nullptr;
}

const Pairs* pairsOf(const Group& group) {
  const auto* g = dynamic_cast<const PairGroup*>(&group);
  return g ? &g->pairs() : nullptr;
}

}  // namespace tandem
