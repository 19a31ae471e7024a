#include "transport/zmq_group.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "transport/zmq_link.h"

namespace tandem::transport {

namespace {

using Clock = std::chrono::steady_clock;

class ZmqGroup final : public Group {
 public:
  ZmqGroup(Context& ctx, Backend& host, const ZmqGroupOptions& o, const Exchange& exchange)
      : host_(host), codec_(o.codec), rank_(o.rank), size_(o.size) {
    TANDEM_CHECK_MSG(o.size >= 1 && o.rank >= 0 && o.rank < o.size, InvalidArgument,
                     "group: rank " << o.rank << " of " << o.size);
    TANDEM_CHECK_MSG(o.transport == "tcp" || o.transport == "ipc", InvalidArgument,
                     "group: transport '" << o.transport << "' (expected tcp or ipc)");
    TANDEM_CHECK_MSG(o.codec != Codec::kI8, InvalidArgument,
                     "group: int8 chunks are not supported (fp32, fp16 or bf16)");
    const std::vector<float> probe(1);
    TANDEM_CHECK_MSG(host.adoptHost(const_cast<float*>(probe.data()), 4, [] {}) != nullptr,
                     InvalidArgument,
                     "group: backend '" << host.info().name << "' does not hold host memory");
    // One link per peer, bound here; its endpoint goes to that peer through the exchange.
    links_.resize(static_cast<size_t>(size_));
    std::string mine;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) {
        mine += "- ";
        continue;
      }
      LinkOptions lo;
      lo.bind = o.transport == "tcp" ? "tcp://" + o.host + ":*"
                                     : "ipc://" + o.ipc_dir + "/tandem-group-" +
                                           std::to_string(getpid()) + "-" + std::to_string(o.job) +
                                           "-" + std::to_string(rank_) + "-" + std::to_string(p);
      lo.codec = o.codec;
      lo.timeout = o.link_timeout;
      lo.job = o.job;
      lo.stage = rank_;
      lo.peer_stage = p;
      links_[static_cast<size_t>(p)] = std::make_unique<ZmqLink>(ctx, lo);
      mine += links_[static_cast<size_t>(p)]->endpoint() + " ";
    }
    const std::vector<std::string> all = exchange(mine);
    TANDEM_CHECK_MSG(all.size() == static_cast<size_t>(size_), FormatError,
                     "group: the exchange returned " << all.size() << " ranks, not " << size_);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      std::istringstream words(all[static_cast<size_t>(p)]);
      std::vector<std::string> endpoints;
      for (std::string w; words >> w;) endpoints.push_back(w);
      TANDEM_CHECK_MSG(
          endpoints.size() == static_cast<size_t>(size_), FormatError,
          "group: rank " << p << " published " << endpoints.size() << " endpoints, not " << size_);
      links_[static_cast<size_t>(p)]->connect(endpoints[static_cast<size_t>(rank_)]);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce(std::span<float> data, const AllreduceOptions& o) override {
    Call c = begin("allreduce", o);
    if (data.empty() || size_ == 1) {
      finishReduce(data, o.op, size_);
      return;
    }
    const bool direct =
        o.algorithm == AllreduceAlgorithm::kDirect ||
        (o.algorithm == AllreduceAlgorithm::kAuto && data.size_bytes() <= o.small_bytes);
    if (direct) {
      for (int p = 0; p < size_; ++p)
        if (p != rank_) send(c, p, 0, data);
      std::vector<Tensor> got(static_cast<size_t>(size_));
      for (int p = 0; p < size_; ++p)
        if (p != rank_) got[static_cast<size_t>(p)] = recv(c, p, 0, data.size());
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

  void reduceScatter(std::span<float> data, const AllreduceOptions& o) override {
    Call c = begin("reduce-scatter", o);
    if (size_ == 1) {
      finishReduce(data, o.op, 1);
      return;
    }
    ringReduceScatter(c, data, o.op, false);
  }

  void allGather(std::span<float> data, const CollectiveOptions& o) override {
    Call c = begin("all-gather", o);
    if (size_ > 1) ringAllGather(c, data);
  }

  void broadcast(std::span<float> data, const RootOptions& o) override {
    Call c = begin("broadcast", o);
    checkRoot(c, o.root);
    if (size_ == 1 || data.empty()) return;
    if (rank_ == o.root) {
      for (int p = 0; p < size_; ++p)
        if (p != rank_) send(c, p, 0, data);
      asSent(data);
    } else {
      copyFrom(recv(c, o.root, 0, data.size()), data);
    }
  }

  void reduce(std::span<float> data, const ReduceOptions& o) override {
    Call c = begin("reduce", o);
    checkRoot(c, o.root);
    if (size_ == 1 || data.empty()) {
      finishReduce(data, o.op, size_);
      return;
    }
    if (rank_ != o.root) {
      send(c, o.root, 0, data);
      return;
    }
    std::vector<Tensor> got(static_cast<size_t>(size_));
    for (int p = 0; p < size_; ++p)
      if (p != rank_) got[static_cast<size_t>(p)] = recv(c, p, 0, data.size());
    const std::vector<float> own(data.begin(), data.end());
    reduceInRankOrder(data, own, got, o.op);
  }

  void gather(std::span<const float> in, std::span<float> out, const RootOptions& o) override {
    Call c = begin("gather", o);
    checkRoot(c, o.root);
    if (rank_ != o.root) {
      if (!in.empty()) send(c, o.root, 0, in);
      return;
    }
    TANDEM_CHECK_MSG(out.size() == static_cast<size_t>(size_) * in.size(), InvalidArgument,
                     c.what << " (tag " << c.tag << "): the root's output holds " << out.size()
                            << " elements, not " << size_ << " x " << in.size());
    for (int p = 0; p < size_; ++p) {
      const std::span<float> part = out.subspan(static_cast<size_t>(p) * in.size(), in.size());
      if (p == rank_) {
        std::copy(in.begin(), in.end(), part.begin());
      } else if (!in.empty()) {
        copyFrom(recv(c, p, 0, in.size()), part);
      }
    }
  }

  void scatter(std::span<const float> in, std::span<float> out, const RootOptions& o) override {
    Call c = begin("scatter", o);
    checkRoot(c, o.root);
    if (rank_ != o.root) {
      if (!out.empty()) copyFrom(recv(c, o.root, 0, out.size()), out);
      return;
    }
    TANDEM_CHECK_MSG(in.size() == static_cast<size_t>(size_) * out.size(), InvalidArgument,
                     c.what << " (tag " << c.tag << "): the root's input holds " << in.size()
                            << " elements, not " << size_ << " x " << out.size());
    for (int p = 0; p < size_; ++p) {
      const std::span<const float> part =
          in.subspan(static_cast<size_t>(p) * out.size(), out.size());
      if (p == rank_) {
        std::copy(part.begin(), part.end(), out.begin());
      } else if (!out.empty()) {
        send(c, p, 0, part);
      }
    }
  }

  void barrier(const CollectiveOptions& o) override {
    Call c = begin("barrier", o);
    const float token = 0;
    for (int p = 0; p < size_; ++p)
      if (p != rank_) send(c, p, 0, {&token, 1});
    for (int p = 0; p < size_; ++p)
      if (p != rank_) recv(c, p, 0, 1);
  }

 private:
  struct Call {
    const char* what;
    uint64_t tag, seq;
    Clock::time_point deadline;
    std::chrono::milliseconds timeout;
  };

  Call begin(const char* what, const CollectiveOptions& o) {
    TANDEM_CHECK_MSG(o.timeout.count() > 0, InvalidArgument,
                     what << " (tag " << o.tag << "): the timeout must be positive");
    return {what, o.tag, seq_++, Clock::now() + o.timeout, o.timeout};
  }

  void checkRoot(const Call& c, int root) const {
    TANDEM_CHECK_MSG(
        root >= 0 && root < size_, InvalidArgument,
        c.what << " (tag " << c.tag << "): root " << root << " in a group of " << size_);
  }

  // Messages of one collective are told apart by (tag, call number, step, chunk); the
  // tag makes ranks that disagree on it miss each other (and time out) rather than mix
  // data. 12 + 24 + 10 + 17 bits: a positive int64.
  MessageTag tagOf(const Call& c, int step, size_t chunk) const {
    const uint64_t id = ((c.tag & 0xfff) << 51) | ((c.seq & 0xffffff) << 27) |
                        ((static_cast<uint64_t>(step) & 0x3ff) << 17) | (chunk & 0x1ffff);
    return {MessageKind::kControl, static_cast<int64_t>(id)};
  }

  void send(const Call& c, int peer, int step, std::span<const float> x, size_t chunk = 0) {
    ZmqLink& link = *links_[static_cast<size_t>(peer)];
    // A view of the caller's memory; send() copies it into the message.
    const Tensor t(host_.adoptHost(const_cast<float*>(x.data()), x.size_bytes(), [] {}),
                   Shape{static_cast<int64_t>(x.size())}, DType::kF32);
    link.send(tagOf(c, step, chunk), t);
  }

  Tensor recv(const Call& c, int peer, int step, size_t count, size_t chunk = 0) {
    ZmqLink& link = *links_[static_cast<size_t>(peer)];
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - Clock::now());
    link.setTimeout(std::max(left, std::chrono::milliseconds(1)));
    Tensor t;
    try {
      t = link.recv(tagOf(c, step, chunk), host_);
    } catch (const Timeout& e) {
      throw Timeout(std::string(c.what) + " (tag " + std::to_string(c.tag) + "): rank " +
                    std::to_string(peer) + " of " + std::to_string(size_) +
                    " sent nothing within " + std::to_string(c.timeout.count()) + " ms (" +
                    e.what() + ")");
    }
    TANDEM_CHECK_MSG(t.dtype() == DType::kF32 && static_cast<size_t>(t.numel()) == count,
                     InvalidArgument,
                     c.what << " (tag " << c.tag << "): rank " << peer << " sent " << t.numel()
                            << " values where this rank has " << count);
    return t;
  }

  std::span<const float> view(const Tensor& t) const {
    return {static_cast<const float*>(host_.hostData(t)), static_cast<size_t>(t.numel())};
  }

  void copyFrom(const Tensor& t, std::span<float> out) const {
    const std::span<const float> v = view(t);
    std::copy(v.begin(), v.end(), out.begin());
  }

  int mod(int x) const { return ((x % size_) + size_) % size_; }

  // data = op over ranks in rank order: `own` in this rank's place, got[p] in rank p's.
  void reduceInRankOrder(std::span<float> data, std::span<const float> own,
                         const std::vector<Tensor>& got, ReduceOp op) const {
    for (int p = 0; p < size_; ++p) {
      const std::span<const float> x = p == rank_ ? own : view(got[static_cast<size_t>(p)]);
      if (p == 0) {
        std::copy(x.begin(), x.end(), data.begin());
      } else {
        accumulate(data, x, op);
      }
    }
    finishReduce(data, op, size_);
  }

  // One ring step: `out` goes to the right-hand rank while `in_count` values come from
  // the left, both in chunks of kChunk with up to kWindow chunks sent ahead, so that the
  // two transfers and the reduction overlap; take(offset, values) consumes each chunk.
  static constexpr size_t kChunk = size_t{1} << 18;  // floats: 1 MiB
  static constexpr size_t kWindow = 4;
  void ringStep(const Call& c, int step, std::span<const float> out, size_t in_count,
                const std::function<void(size_t, std::span<const float>)>& take) {
    const int right = mod(rank_ + 1), left = mod(rank_ - 1);
    const size_t out_chunks = (out.size() + kChunk - 1) / kChunk;
    const size_t in_chunks = (in_count + kChunk - 1) / kChunk;
    size_t sent = 0;
    auto sendNext = [&] {
      const size_t b = sent * kChunk;
      send(c, right, step, out.subspan(b, std::min(kChunk, out.size() - b)), sent);
      ++sent;
    };
    while (sent < std::min(kWindow, out_chunks)) sendNext();
    for (size_t i = 0; i < in_chunks; ++i) {
      const size_t b = i * kChunk, n = std::min(kChunk, in_count - b);
      take(b, view(recv(c, left, step, n, i)));
      if (sent < out_chunks) sendNext();
    }
    while (sent < out_chunks) sendNext();
  }

  // After it, this rank's slice holds the reduction (steps 0 .. n-2). With `in_place`
  // (allreduce, whose all-gather overwrites the rest) the partial sums are kept in the
  // other slices of `data`, each sent on from where it was summed; else the rest of
  // `data` is left as it was and they travel in `carry` and `partial`.
  void ringReduceScatter(const Call& c, std::span<float> data, ReduceOp op, bool in_place) {
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
      ringStep(
          c, s,
          in_place || s == 0 ? data.subspan(out.begin, out.size()) : std::span<const float>(carry),
          in.size(), [&](size_t at, std::span<const float> got) {
            // The partial sum from the left first, then this rank's: one order per slice.
            combine(sum.subspan(at, got.size()), got, mine.subspan(at, got.size()), op);
          });
      if (!in_place) std::swap(carry, partial);
    }
    const Slice own = sliceOf(data.size(), size_, rank_);
    finishReduce(data.subspan(own.begin, own.size()), op, size_);
  }

  // `x` as the link's codec delivers it (unchanged for raw fp32).
  void asSent(std::span<float> x) const {
    if (codec_ == Codec::kRaw || x.empty()) return;
    Encoded e;
    encode(codec_, x, e);
    decode(codec_, e.payload, e.scales, e.block, x);
  }

  // Every rank's slice to every rank (steps n-1 .. 2n-3).
  void ringAllGather(const Call& c, std::span<float> data) {
    for (int s = 0; s + 1 < size_; ++s) {
      const Slice out = sliceOf(data.size(), size_, mod(rank_ - s));
      const Slice in = sliceOf(data.size(), size_, mod(rank_ - s - 1));
      ringStep(c, size_ + s, data.subspan(out.begin, out.size()), in.size(),
               [&](size_t at, std::span<const float> got) {
                 std::copy(got.begin(), got.end(),
                           data.begin() + static_cast<std::ptrdiff_t>(in.begin + at));
               });
    }
  }

  Backend& host_;
  const Codec codec_;
  const int rank_, size_;
  std::vector<std::unique_ptr<ZmqLink>> links_;  // by peer rank; null for this one
  uint64_t seq_ = 0;
};

}  // namespace

Exchange fileExchange(const std::string& dir, int rank, int size,
                      std::chrono::milliseconds timeout) {
  return [dir, rank, size, timeout](const std::string& mine) {
    namespace fs = std::filesystem;
    fs::create_directories(dir);
    const fs::path final_path = fs::path(dir) / ("rank-" + std::to_string(rank));
    const fs::path tmp = fs::path(dir) / (".rank-" + std::to_string(rank) + ".tmp");
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << mine;
      TANDEM_CHECK_MSG(out.good(), IoError, "rendezvous: cannot write " << tmp.string());
    }
    fs::rename(tmp, final_path);
    std::vector<std::string> all(static_cast<size_t>(size));
    std::vector<bool> have(static_cast<size_t>(size), false);
    const auto deadline = Clock::now() + timeout;
    for (int found = 0; found < size;) {
      for (int r = 0; r < size; ++r) {
        if (have[static_cast<size_t>(r)]) continue;
        std::ifstream in(fs::path(dir) / ("rank-" + std::to_string(r)));
        if (!in) continue;
        std::stringstream text;
        text << in.rdbuf();
        all[static_cast<size_t>(r)] = text.str();
        have[static_cast<size_t>(r)] = true;
        ++found;
      }
      if (found == size) break;
      if (Clock::now() > deadline) {
        std::string missing;
        for (int r = 0; r < size; ++r)
          if (!have[static_cast<size_t>(r)]) missing.append(" ").append(std::to_string(r));
        throw Timeout(std::string("rendezvous in ").append(dir) + ": rank(s)" + missing + " of " +
                      std::to_string(size) + " did not arrive within " +
                      std::to_string(timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return all;
  };
}

std::unique_ptr<Group> makeZmqGroup(Context& ctx, Backend& host, const ZmqGroupOptions& options,
                                    const Exchange& exchange) {
  return std::make_unique<ZmqGroup>(ctx, host, options, exchange);
}

}  // namespace tandem::transport
