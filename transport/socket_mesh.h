// The socket group's connections (socket_group.h): one stream socket between every pair
// of ranks, made at the rendezvous.
//
// Each rank listens (tcp on `host`, port chosen by the system; ipc under `ipc_dir`) and
// publishes its address through an Exchange (rendezvous.h); then it connects to every
// lower rank and accepts every higher one. Each connection opens with a hello (the group
// id, its size and both ranks) from the connecting rank, so a stray or foreign
// connection is turned away, and named if the real peer never comes.
#pragma once

#include <vector>

#include "transport/rendezvous.h"
#include "transport/socket_group.h"
#include "transport/tcp/socket.h"

namespace tandem::transport {

struct SocketMesh {
  std::vector<tcp::Socket> peers;  // by rank; none for this one
  int ranks_here = 1;              // this rank and the peers on this machine
};

// Connected, non-blocking, tuned (TCP_NODELAY, the local congestion control, the
// buffers) sockets to every other rank by `connect_timeout`: Timeout naming the ranks
// that did not come (and what was turned away), IoError for a failing system call.
SocketMesh connectMesh(const SocketGroupOptions& o, const Exchange& exchange);

}  // namespace tandem::transport
