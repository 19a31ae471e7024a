// The socket group's pairs (socket_group.h): transfers over one stream socket per peer
// (socket_mesh.h), written and read by the calling thread itself — no I/O thread, no
// message objects, no copy besides the kernel's. A transfer tries its connections and
// moves whatever each will take or give, so a ring step's send and receive run at once
// and each received piece is reduced while the rest is on its way; all-gathered slices
// are received straight into the caller's buffer. When nothing can move it keeps trying
// for `spin` (yielding the core) before it sleeps in poll.
//
// Wire: per transfer and peer, a 32-byte header (magic, codec, collective, step, call
// number, tag, element count; little-endian, as on every host tandem runs on) and then
// the values, fp32 or fp16/bf16 (encoded 128 Ki values at a time as they go out;
// received values are decoded and accumulated in fp32). A receiver checks the header
// against what it expects: ranks out of step (another collective, tag or call) or with
// another count are told so — InvalidArgument naming the peer — after the rest of the
// message has been read and dropped, so the connection stays usable. A peer that sends
// nothing in time is named in a Timeout, and one that closes its connection in an
// IoError; after those the pairs are broken and every later transfer raises at once.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "transport/codec_pairs.h"
#include "transport/socket_mesh.h"

namespace tandem::transport {

class SocketPairs final : public CodecPairs {
 public:
  SocketPairs(const SocketGroupOptions& o, SocketMesh mesh);

  void transfer(const Transfer& t, std::span<const PairSend> sends,
                std::span<const PairRecv> recvs) override;

  SocketGroupChoices choices() const { return {ranks_here_, spin_}; }

 private:
  struct Header;
  struct Out;
  struct In;

  bool sendSome(const Transfer& t, Out& o);
  bool receiveSome(const Transfer& t, uint8_t collective, In& in);
  bool received(const Transfer& t, int peer, ssize_t k);
  void checkHeader(const Transfer& t, uint8_t collective, In& in);
  void wait(const Transfer& t, const std::vector<Out>& outs, const std::vector<In>& ins);
  [[noreturn]] void fail(const Transfer& t, const std::string& what);
  int fd(int peer) const { return peers_[static_cast<size_t>(peer)].get(); }

  const int ranks_here_;  // this one and the peers on this machine
  const std::chrono::microseconds spin_;
  std::vector<tcp::Socket> peers_;                    // by peer rank; none for this one
  std::vector<std::vector<float>> stages_, decoded_;  // by peer: received pieces
  std::vector<Encoded> encoded_;                      // by peer: the piece being sent, encoded
  std::vector<uint8_t> drop_;
  std::string broken_;  // why the connections are out of step, once they are
  bool broken_by_timeout_ = false;
};

}  // namespace tandem::transport
