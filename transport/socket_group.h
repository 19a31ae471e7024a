// The cross-process Group over plain stream sockets: one TCP (or Unix-domain) connection
// between every pair of ranks, written and read by the calling thread itself — no I/O
// thread, no message objects, no copy besides the kernel's. A transfer (peer_group.h)
// tries its connections and moves whatever each will take or give, so a ring step's
// send and receive run at once and each received piece is reduced while the rest is on
// its way; all-gathered slices are received straight into the caller's buffer. When
// nothing can move it keeps trying for `spin` (yielding the core) before it sleeps in
// poll.
//
// Wire: per transfer and peer, a 32-byte header (magic, codec, collective, step, call
// number, tag, element count; little-endian, as on every host tandem runs on) and then
// the values, fp32 or fp16/bf16 (`codec`: encoded 128 Ki values at a time as they go out;
// received values are decoded and accumulated in fp32). A receiver checks the header against what
// it expects: ranks out of step (another collective, tag or call) or with another count are told so
// — InvalidArgument naming the peer — after the rest of the message has been read and dropped, so
// the connection stays usable. A peer that sends nothing in time is named in a Timeout, and one
// that closes its connection in an IoError; after those the group is broken and every later call
// raises at once.
//
// Rendezvous: each rank listens (tcp on `host`, port chosen by the system; ipc under
// `ipc_dir`) and publishes its address through an Exchange (rendezvous.h); then it
// connects to every lower rank and accepts every higher one, each connection opening
// with the group id and both ranks, so a stray or foreign connection is turned away.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/comm/group.h"
#include "transport/codec.h"
#include "transport/rendezvous.h"

namespace tandem::transport {

struct SocketGroupOptions {
  int rank = 0, size = 1;
  std::string transport = "tcp";   // tcp (listens on host) or ipc (Unix sockets in ipc_dir)
  std::string host = "127.0.0.1";  // the address the other ranks reach this one at
  std::string ipc_dir = "/tmp";    // "@name": sockets in Linux's abstract namespace (no files)
  Codec codec = Codec::kRaw;       // how values travel: raw fp32, fp16 or bf16
  std::chrono::milliseconds connect_timeout{30000};
  // Which group this is among the job's groups (a pipeline stage's replicas form one):
  // ranks of different groups refuse each other at the rendezvous, and ipc socket names
  // carry it.
  uint64_t group_id = 0;
  // SO_SNDBUF and SO_RCVBUF of every connection (the kernel caps them at
  // net.core.wmem_max / rmem_max); 0 leaves them to the kernel's autotuning. Large
  // buffers let a whole ring piece sit in flight: worth about 20% at 16 MiB on loopback.
  int socket_buffer_bytes = 4 << 20;
  // How long a transfer that can move nothing keeps trying (yielding the core between
  // tries) before it sleeps in poll until a socket is ready; 0 sleeps at once. Unset, the
  // group chooses waitBeforeSleeping (core/spin.h) of the ranks on this machine (this one
  // and every peer reached over ipc or a local tcp connection): 2 ms when each can have a
  // core, else 100 us. Ranks that sleep on loopback are woken by their peer's send, and
  // the kernel then tends to run both on one CPU, where an allreduce takes twice as long
  // (docs/collectives.md); spinning longer leaves them apart more often.
  std::optional<std::chrono::microseconds> spin;
  // TCP congestion control of the connections whose peer is on this machine (loopback or
  // this host's own address): this one where the kernel lets the process choose it, else
  // reno (which any process may), else the system's; "" keeps the system's. Connections
  // to other machines always keep the system's. Where the system's was BBR, its pacing
  // made loopback allreduces slower and uneven (docs/collectives.md).
  std::string local_congestion = "cubic";
};

std::unique_ptr<Group> makeSocketGroup(const SocketGroupOptions& options, const Exchange& exchange);

// What a socket group made by makeSocketGroup chose for itself: how many of its ranks are
// on this machine (this one included) and the spin its transfers use. InvalidArgument
// for a group of another kind.
struct SocketGroupChoices {
  int ranks_here = 1;
  std::chrono::microseconds spin{0};
};
SocketGroupChoices socketGroupChoices(const Group& group);

}  // namespace tandem::transport
