// The cross-process Group: ranks in different processes (or hosts), a ZmqLink between
// every pair over tcp or ipc, optionally carrying the exchanged chunks as fp16/bf16 (the
// link's codec; received chunks are decoded and accumulated in fp32), optionally
// encrypted and authenticated with CurveZMQ (what replicated stages use on a cluster).
//
// ZmqPairs carry the transfers (core/comm/pairs.h), and the collectives' algorithms are
// the free functions over them (core/comm/collectives.h): each buffer travels in 1 MiB
// messages on the link to its peer, four of them ahead of what has been received.
//
// Rendezvous: each rank binds one link per peer and exchanges its endpoints with the
// others through an Exchange — an all-gather of one string per rank, such as
// fileExchange() over a directory every rank can reach (Gloo's FileStore). A rank whose
// message does not come within the collective's timeout is named in the Timeout.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/backend.h"
#include "core/comm/group.h"
#include "core/comm/pairs.h"
#include "transport/codec.h"
#include "transport/context.h"
#include "transport/rendezvous.h"

namespace tandem::transport {

struct ZmqGroupOptions {
  int rank = 0, size = 1;
  std::string transport = "tcp";  // tcp (binds host) or ipc (sockets under ipc_dir)
  std::string host = "127.0.0.1";
  std::string ipc_dir = "/tmp";
  Codec codec = Codec::kRaw;                      // how chunks travel: raw fp32, fp16 or bf16
  std::chrono::milliseconds link_timeout{30000};  // sends (and recvs outside collectives)
  uint64_t group_id = 0;                          // as SocketGroupOptions::group_id
  std::string local_congestion = "cubic";         // its links' (LinkOptions::local_congestion)
  // CurveZMQ on every link (Z85 keys, both empty for none): every rank holds the same
  // pair, as the links of a run do with the keys derived from its key, so each link
  // admits exactly the group's other ranks (and whoever else holds the secret).
  std::string curve_secret_key, curve_public_key;
};

// `host` is a backend whose tensors are host memory (the CPU's): received chunks land
// there. The Context and the backend must outlive the pairs.
std::unique_ptr<Pairs> makeZmqPairs(Context& ctx, Backend& host, const ZmqGroupOptions& options,
                                    const Exchange& exchange);
// The same as a Group (makePairGroup).
std::unique_ptr<Group> makeZmqGroup(Context& ctx, Backend& host, const ZmqGroupOptions& options,
                                    const Exchange& exchange);

}  // namespace tandem::transport
