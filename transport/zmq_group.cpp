#include "transport/zmq_group.h"

#include <unistd.h>

#include <sstream>

#include "core/error.h"
#include "core/comm/collectives.h"
#include "transport/codec_pairs.h"
#include "transport/zmq_link.h"

namespace tandem::transport {

namespace {

class ZmqPairs final : public CodecPairs {
 public:
  ZmqPairs(Context& ctx, Backend& host, const ZmqGroupOptions& o, const Exchange& exchange)
      : CodecPairs(o.rank, o.size, o.codec), host_(host) {
    TANDEM_CHECK_MSG(o.transport == "tcp" || o.transport == "ipc", InvalidArgument,
                     "group: transport '" << o.transport << "' (expected tcp or ipc)");
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
      lo.bind = o.transport == "tcp"
                    ? "tcp://" + o.host + ":*"
                    : "ipc://" + o.ipc_dir + "/tandem-group-" + std::to_string(getpid()) + "-" +
                          std::to_string(o.group_id) + "-" + std::to_string(rank_) + "-" +
                          std::to_string(p);
      lo.codec = o.codec;
      lo.timeout = o.link_timeout;
      lo.job = o.group_id;  // the wire header's job field: the group's links carry its id
      lo.stage = rank_;
      lo.peer_stage = p;
      lo.local_congestion = o.local_congestion;
      lo.curve_secret_key = o.curve_secret_key;
      lo.curve_peer_public_key = o.curve_public_key;
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

 private:
  // Each buffer travels in chunks of kChunk, up to kWindow of them sent to each peer
  // ahead of what has been received, so that the transfers and the reduction overlap.
  static constexpr size_t kChunk = size_t{1} << 18;  // floats: 1 MiB
  static constexpr size_t kWindow = 4;

  void transfer(const Transfer& t, std::span<const PairSend> sends,
                std::span<const PairRecv> recvs) override {
    std::vector<size_t> sent(sends.size(), 0);
    auto sendRound = [&] {  // the next chunk of each buffer not yet all sent
      bool more = false;
      for (size_t k = 0; k < sends.size(); ++k) {
        const std::span<const float> x = sends[k].data;
        const size_t b = sent[k] * kChunk;
        if (b >= x.size()) continue;
        send(t, sends[k].peer, x.subspan(b, std::min(kChunk, x.size() - b)), sent[k]++);
        more = true;
      }
      return more;
    };
    for (size_t k = 0; k < kWindow; ++k) sendRound();
    for (const PairRecv& r : recvs)
      for (size_t i = 0, b = 0; b < r.count; ++i, b += kChunk) {
        const Tensor got = recv(t, r.peer, std::min(kChunk, r.count - b), i);
        const std::span<const float> v{static_cast<const float*>(host_.hostData(got)),
                                       static_cast<size_t>(got.numel())};
        if (r.take) {
          r.take(b, v);
        } else {
          std::copy(v.begin(), v.end(), r.into.begin() + static_cast<std::ptrdiff_t>(b));
        }
        sendRound();
      }
    while (sendRound()) {
    }
  }

  // Messages of one collective are told apart by (tag, call number, step, chunk); the
  // tag makes ranks that disagree on it miss each other (and time out) rather than mix
  // data. 12 + 24 + 10 + 17 bits: a positive int64.
  MessageTag tagOf(const Transfer& t, size_t chunk) const {
    const uint64_t id = ((t.tag & 0xfff) << 51) | ((t.seq & 0xffffff) << 27) |
                        ((static_cast<uint64_t>(t.step) & 0x3ff) << 17) | (chunk & 0x1ffff);
    return {MessageKind::kCollective, static_cast<int64_t>(id)};
  }

  void send(const Transfer& t, int peer, std::span<const float> x, size_t chunk) {
    ZmqLink& link = *links_[static_cast<size_t>(peer)];
    // A view of the caller's memory; send() copies it into the message.
    const Tensor view(host_.adoptHost(const_cast<float*>(x.data()), x.size_bytes(), [] {}),
                   Shape{static_cast<int64_t>(x.size())}, DType::kF32);
    link.send(tagOf(t, chunk), view);
  }

  Tensor recv(const Transfer& t, int peer, size_t count, size_t chunk) {
    ZmqLink& link = *links_[static_cast<size_t>(peer)];
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(t.deadline - Transfer::Clock::now());
    link.setTimeout(std::max(left, std::chrono::milliseconds(1)));
    Tensor got;
    try {
      got = link.recv(tagOf(t, chunk), host_);
    } catch (const Timeout& e) {
      throw Timeout(silentPeer(t, peer, size_) + " (" + e.what() + ")");
    }
    TANDEM_CHECK_MSG(got.dtype() == DType::kF32 && static_cast<size_t>(got.numel()) == count,
                     InvalidArgument,
                     callName(t) << ": rank " << peer << " sent " << got.numel()
                                 << " values where this rank has " << count);
    return got;
  }

  Backend& host_;
  std::vector<std::unique_ptr<ZmqLink>> links_;  // by peer rank; null for this one
};

}  // namespace

std::unique_ptr<Pairs> makeZmqPairs(Context& ctx, Backend& host, const ZmqGroupOptions& options,
                                    const Exchange& exchange) {
  return std::make_unique<ZmqPairs>(ctx, host, options, exchange);
}

std::unique_ptr<Group> makeZmqGroup(Context& ctx, Backend& host, const ZmqGroupOptions& options,
                                    const Exchange& exchange) {
  return makePairGroup(makeZmqPairs(ctx, host, options, exchange));
}

}  // namespace tandem::transport
