#include "transport/local_group.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>

#include "core/comm/reduce.h"
#include "core/error.h"
#include "core/spin.h"

namespace tandem::transport {

namespace {

using Clock = std::chrono::steady_clock;

// What one rank asked for in one collective.
struct Call {
  const char* what = "";
  uint64_t tag = 0;
  size_t count = 0;  // elements of data (or of in, for gather and scatter at non-roots)
  int root = -1;
  ReduceOp op = ReduceOp::kSum;
  int algorithm = 0;  // allreduce: 1 direct, 2 ring (they meet a different number of times)
  float* data = nullptr;
  const float* in = nullptr;
  size_t in_count = 0, out_count = 0;
};

class Hub {
 public:
  explicit Hub(int size)
      : size_(size),
        spin_(waitBeforeSleeping(size)),
        claims_(static_cast<size_t>(size)),
        here_(static_cast<size_t>(size), false) {
    for (auto& c : calls_) c.resize(static_cast<size_t>(size));
    for (auto& s : scratch_) s.resize(static_cast<size_t>(size));
  }

  int size() const { return size_; }
  // The next value of the counter of `owner`'s blocks (see LocalGroup::reduceShared).
  size_t claim(int owner) {
    return claims_[static_cast<size_t>(owner)].n.fetch_add(1, std::memory_order_relaxed);
  }
  void completed() { completions_.fetch_add(1, std::memory_order_release); }
  size_t completions() const { return completions_.load(std::memory_order_acquire); }
  Call& call(uint64_t seq, int rank) { return calls_[seq & 1][static_cast<size_t>(rank)]; }
  std::vector<float>& scratch(uint64_t seq, int rank) {
    return scratch_[seq & 1][static_cast<size_t>(rank)];
  }

  // Returns once every rank has arrived; Timeout naming the missing ranks at the deadline.
  // A waiting rank yields its core for a while first (see local_group.h).
  void sync(int rank, const Call& c, Clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    if (!broken_.empty()) throw Timeout(broken_);
    const uint64_t generation = generation_.load(std::memory_order_relaxed);
    here_[static_cast<size_t>(rank)] = true;
    if (++arrived_ == size_) {
      arrived_ = 0;
      std::fill(here_.begin(), here_.end(), false);
      generation_.store(generation + 1, std::memory_order_release);
      cv_.notify_all();
      return;
    }
    lock.unlock();
    const auto passed = [&] { return generation_.load(std::memory_order_acquire) != generation; };
    if (yieldFor(spin_, passed)) return;
    lock.lock();
    cv_.wait_until(lock, deadline, [&] {
      return generation_.load(std::memory_order_relaxed) != generation || !broken_.empty();
    });
    if (generation_.load(std::memory_order_relaxed) != generation) return;
    if (broken_.empty()) {  // this rank's deadline passed first
      std::ostringstream why;
      why << c.what << " (tag " << c.tag << "): rank";
      std::string missing;
      int n = 0;
      for (int r = 0; r < size_; ++r)
        if (!here_[static_cast<size_t>(r)]) missing += (n++ ? ", " : " ") + std::to_string(r);
      why << (n > 1 ? "s" : "") << missing << " of " << size_
          << " did not arrive in time; the group is broken";
      broken_ = why.str();
      cv_.notify_all();
    }
    throw Timeout(broken_);
  }

 private:
  const int size_;
  const std::chrono::microseconds spin_;  // see waitBeforeSleeping
  std::mutex mutex_;
  std::condition_variable cv_;
  struct alignas(64) Counter {
    std::atomic<size_t> n = 0;
  };
  std::vector<Counter> claims_;  // by rank: claims of its own range of blocks
  std::atomic<size_t> completions_ = 0;
  std::atomic<uint64_t> generation_ = 0;  // written under mutex_; read spinning without
  int arrived_ = 0;
  std::vector<bool> here_;
  std::string broken_;
  // Per call parity, per rank: a rank may publish its next call while others still read
  // this one's, but not the one after (it would have to pass this call's barrier first).
  std::array<std::vector<Call>, 2> calls_;
  std::array<std::vector<std::vector<float>>, 2> scratch_;
};

class LocalGroup final : public Group {
 public:
  LocalGroup(std::shared_ptr<Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }

  void allreduce(std::span<float> data, const AllreduceOptions& o) override {
    const bool direct =
        o.algorithm == AllreduceAlgorithm::kDirect ||
        (o.algorithm == AllreduceAlgorithm::kAuto && data.size_bytes() <= o.small_bytes);
    Call c = basic("allreduce", o, data.size());
    c.op = o.op;
    c.algorithm = direct ? 1 : 2;
    c.data = data.data();
    const uint64_t seq = begin(c);
    if (direct) {
      std::vector<float>& mine = hub_->scratch(seq, rank_);
      mine.assign(data.begin(), data.end());
      meet(seq, c, o);
      std::vector<const float*> src;
      for (int r = 0; r < size(); ++r) src.push_back(hub_->scratch(seq, r).data());
      float* const out[] = {data.data()};
      reduceInto(out, src, 0, data.size(), o.op);
      return;
    }
    meet(seq, c, o);
    reduceShared(seq, c, o.op);
  }

  void reduceScatter(std::span<float> data, const AllreduceOptions& o) override {
    Call c = basic("reduce-scatter", o, data.size());
    c.op = o.op;
    c.data = data.data();
    const uint64_t seq = begin(c);
    meet(seq, c, o);
    reduceOwnSlice(seq, data, o.op);
    meet(seq, c, o);
  }

  void allGather(std::span<float> data, const CollectiveOptions& o) override {
    Call c = basic("all-gather", o, data.size());
    c.data = data.data();
    const uint64_t seq = begin(c);
    meet(seq, c, o);
    gatherSlices(seq, data);
    meet(seq, c, o);
  }

  void broadcast(std::span<float> data, const RootOptions& o) override {
    Call c = basic("broadcast", o, data.size());
    c.root = o.root;
    c.data = data.data();
    const uint64_t seq = begin(c);
    meet(seq, c, o);
    if (rank_ != o.root && !data.empty())
      std::memcpy(data.data(), hub_->call(seq, o.root).data, data.size_bytes());
    meet(seq, c, o);
  }

  void reduce(std::span<float> data, const ReduceOptions& o) override {
    Call c = basic("reduce", o, data.size());
    c.root = o.root;
    c.op = o.op;
    c.data = data.data();
    const uint64_t seq = begin(c);
    meet(seq, c, o);
    float* const out[] = {data.data()};
    if (rank_ == o.root) reduceInto(out, buffers(seq), 0, data.size(), o.op);
    meet(seq, c, o);
  }

  void gather(std::span<const float> in, std::span<float> out, const RootOptions& o) override {
    Call c = basic("gather", o, in.size());
    c.root = o.root;
    c.in = in.data();
    c.in_count = in.size();
    c.out_count = out.size();
    c.data = out.data();
    const uint64_t seq = begin(c);
    meet(seq, c, o);
    if (rank_ == o.root && !in.empty())
      for (int r = 0; r < size(); ++r)
        std::memcpy(out.data() + static_cast<size_t>(r) * in.size(), hub_->call(seq, r).in,
                    in.size_bytes());
    meet(seq, c, o);
  }

  void scatter(std::span<const float> in, std::span<float> out, const RootOptions& o) override {
    Call c = basic("scatter", o, out.size());
    c.root = o.root;
    c.in = in.data();
    c.in_count = in.size();
    c.out_count = out.size();
    const uint64_t seq = begin(c);
    meet(seq, c, o);
    if (!out.empty())
      std::memcpy(out.data(), hub_->call(seq, o.root).in + static_cast<size_t>(rank_) * out.size(),
                  out.size_bytes());
    meet(seq, c, o);
  }

  void barrier(const CollectiveOptions& o) override {
    const Call c = basic("barrier", o, 0);
    const uint64_t seq = begin(c);
    meet(seq, c, o);
  }

 private:
  Call basic(const char* what, const CollectiveOptions& o, size_t count) const {
    Call c;
    c.what = what;
    c.tag = o.tag;
    c.count = count;
    return c;
  }

  // Publishes this rank's call; returns its sequence number.
  uint64_t begin(const Call& c) {
    const uint64_t seq = seq_++;
    hub_->call(seq, rank_) = c;
    deadline_ = Clock::time_point::max();
    return seq;
  }

  // A barrier with every rank; after the first of a call, checks that all ranks called
  // the same thing (each rank finds the same mismatch, so all raise together).
  void meet(uint64_t seq, const Call& c, const CollectiveOptions& o) {
    if (deadline_ == Clock::time_point::max()) {
      deadline_ = Clock::now() + o.timeout;
      hub_->sync(rank_, c, deadline_);
      check(seq, c);
    } else {
      hub_->sync(rank_, c, deadline_);
    }
  }

  void check(uint64_t seq, const Call& mine) {
    const Call& first = hub_->call(seq, 0);
    for (int r = 0; r < size(); ++r) {
      const Call& other = hub_->call(seq, r);
      const bool same = std::string_view(other.what) == first.what && other.tag == first.tag &&
                        other.count == first.count && other.root == first.root &&
                        other.op == first.op && other.algorithm == first.algorithm;
      TANDEM_CHECK_MSG(
          same, InvalidArgument,
          "collectives out of step: rank 0 called "
              << first.what << " (tag " << first.tag << ", " << first.count << " elements, "
              << reduceOpName(first.op) << ", root " << first.root << ") but rank " << r << " "
              << other.what << " (tag " << other.tag << ", " << other.count << " elements, "
              << reduceOpName(other.op) << ", root " << other.root << ")"
              << (other.algorithm != first.algorithm ? " with another algorithm" : ""));
    }
    if (first.root >= 0) {
      TANDEM_CHECK_MSG(first.root < size(), InvalidArgument,
                       mine.what << " (tag " << mine.tag << "): root " << first.root
                                 << " in a group of " << size());
      const Call& root = hub_->call(seq, first.root);
      const bool gather = std::string_view(first.what) == "gather";
      const bool scatter = std::string_view(first.what) == "scatter";
      const size_t want = static_cast<size_t>(size()) * first.count;
      TANDEM_CHECK_MSG(!gather || root.out_count == want, InvalidArgument,
                       "gather (tag " << mine.tag << "): the root's output holds " << root.out_count
                                      << " elements, not " << size() << " x " << first.count);
      TANDEM_CHECK_MSG(!scatter || root.in_count == want, InvalidArgument,
                       "scatter (tag " << mine.tag << "): the root's input holds " << root.in_count
                                       << " elements, not " << size() << " x " << first.count);
    }
  }

  std::vector<const float*> buffers(uint64_t seq) const {
    std::vector<const float*> b;
    for (int r = 0; r < size(); ++r) b.push_back(hub_->call(seq, r).data);
    return b;
  }

  // This rank's slice of `data` becomes the reduction of every rank's.
  void reduceOwnSlice(uint64_t seq, std::span<float> data, ReduceOp op) {
    const Slice own = sliceOf(data.size(), size(), rank_);
    float* const out[] = {data.data()};
    reduceInto(out, buffers(seq), own.begin, own.end, op);
  }

  // Blocks of every rank's buffer, each reduced in rank order and written to every
  // rank's buffer. Rank order makes the result the same whichever rank does a block.
  // Each rank owns a contiguous range of the blocks, claims them first, then claims what
  // is left of the others' ranges: a rank that is off its core (more ranks than cores, or
  // a busy machine) costs nothing, and when every rank is running each does the same
  // blocks in every call, so its part of the buffers stays in its core's cache (with
  // blocks taken from one shared counter, a block went to either core by chance and its
  // lines moved between the cores' caches: 1 MiB x 2 ranks on two cores took 43-45 us a
  // call, one thread alone 28-37 us). A rank returns once every block is done, without
  // waiting for the others to arrive: its buffer is complete, and nobody reads or writes
  // it again in this call.
  //
  // The hub's counters only grow. In one call each rank tries every range until it finds
  // it done, so range k is claimed blocks(k) + size() times, and a rank's claims in the
  // next call follow everyone's last claim in this one (its first barrier): each rank
  // knows from the earlier calls where this call's counts start. Blocks are 8 to 64 KiB,
  // about four per rank, whole tiles of reduceInto (32 values).
  void reduceShared(uint64_t seq, const Call& c, ReduceOp op) {
    const size_t count = c.count, ranks = static_cast<size_t>(size());
    const size_t per = count / (4 * ranks);
    const size_t block = (std::clamp<size_t>(per, 2048, 16384) + 31) / 32 * 32;
    const size_t blocks = (count + block - 1) / block;
    std::vector<float*> dst;
    for (int r = 0; r < size(); ++r) dst.push_back(hub_->call(seq, r).data);
    const std::vector<const float*> src(dst.begin(), dst.end());
    claimed_.resize(ranks);
    for (size_t i = 0; i < ranks; ++i) {
      const size_t owner = (static_cast<size_t>(rank_) + i) % ranks;
      const size_t first = owner * blocks / ranks, mine = (owner + 1) * blocks / ranks - first;
      for (;;) {
        const size_t b = hub_->claim(static_cast<int>(owner)) - claimed_[owner];
        if (b >= mine) break;
        const size_t begin = (first + b) * block;
        reduceInto(dst, src, begin, std::min(count, begin + block), op);
        hub_->completed();
      }
      claimed_[owner] += mine + ranks;
    }
    completed_ += blocks;
    if (!yieldFor(deadline_ - Clock::now(), [&] { return hub_->completions() >= completed_; }))
      throw Timeout(std::string(c.what) + " (tag " + std::to_string(c.tag) +
                    "): the group's ranks did not finish reducing in time");
  }

  // Copies every other rank's slice from its owner.
  void gatherSlices(uint64_t seq, std::span<float> data) {
    for (int r = 0; r < size(); ++r) {
      const Slice s = sliceOf(data.size(), size(), r);
      if (r == rank_ || s.size() == 0) continue;
      std::memcpy(data.data() + s.begin, hub_->call(seq, r).data + s.begin,
                  s.size() * sizeof(float));
    }
  }

  std::shared_ptr<Hub> hub_;
  const int rank_;
  uint64_t seq_ = 0;
  std::vector<size_t> claimed_;  // by range: the hub's claims after the earlier calls
  size_t completed_ = 0;         // the hub's completions after them (see reduceShared)
  Clock::time_point deadline_;
};

}  // namespace

std::vector<std::unique_ptr<Group>> makeLocalGroup(int size) {
  TANDEM_CHECK_MSG(size >= 1, InvalidArgument, "a group of " << size << " ranks");
  auto hub = std::make_shared<Hub>(size);
  std::vector<std::unique_ptr<Group>> groups;
  for (int r = 0; r < size; ++r) groups.push_back(std::make_unique<LocalGroup>(hub, r));
  return groups;
}

}  // namespace tandem::transport
