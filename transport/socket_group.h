// The cross-process Group over plain stream sockets: one TCP (or Unix-domain) connection
// between every pair of ranks (made at the rendezvous: socket_mesh.h), driven by the
// calling thread (socket_pairs.h: the transfers and their wire), with the collectives'
// algorithms over them (core/comm/collectives.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/comm/group.h"
#include "core/comm/pairs.h"
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
  // buffers let a whole ring piece sit in flight (docs/collectives.md).
  int socket_buffer_bytes = 4 << 20;
  // How long a transfer that can move nothing keeps trying (yielding the core between
  // tries) before it sleeps in poll until a socket is ready; 0 sleeps at once. Unset, the
  // group chooses waitBeforeSleeping (core/spin.h) of the ranks on this machine (this one
  // and every peer reached over ipc or a local tcp connection): 2 ms when each can have a
  // core, else 100 us. Ranks that sleep on loopback are woken by their peer's send, and
  // the kernel then tends to run both on one CPU, each at half speed (docs/collectives.md);
  // spinning longer leaves them apart more often.
  std::optional<std::chrono::microseconds> spin;
  // TCP congestion control of the connections whose peer is on this machine (loopback or
  // this host's own address): this one where the kernel lets the process choose it, else
  // reno (which any process may), else the system's; "" keeps the system's. Connections
  // to other machines always keep the system's. Where the system's was BBR, its pacing
  // made loopback allreduces slower and uneven (docs/collectives.md).
  std::string local_congestion = "cubic";
};

// This rank's pairs, connected to every other rank through `exchange`; InvalidArgument
// for bad options, Timeout/IoError from the rendezvous.
std::unique_ptr<Pairs> makeSocketPairs(const SocketGroupOptions& options, const Exchange& exchange);
// The same as a Group (makePairGroup).
std::unique_ptr<Group> makeSocketGroup(const SocketGroupOptions& options, const Exchange& exchange);

// What socket pairs (or a group made by makeSocketGroup) chose for themselves: how many of
// their ranks are on this machine (this one included) and the spin their transfers use.
// InvalidArgument for pairs or a group of another kind.
struct SocketGroupChoices {
  int ranks_here = 1;
  std::chrono::microseconds spin{0};
};
SocketGroupChoices socketGroupChoices(const Pairs& pairs);
SocketGroupChoices socketGroupChoices(const Group& group);

}  // namespace tandem::transport
