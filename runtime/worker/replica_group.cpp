#include "runtime/worker/replica_group.h"

#include "transport/socket_group.h"
#include "transport/zmq_group.h"

namespace tandem::runtime {

std::unique_ptr<Group> replicaGroup(const Assign& a, const ReplicaGroupParts& parts,
                                    const transport::Exchange& exchange) {
  if (a.replicas == 1) return nullptr;
  auto common = [&](auto& go) {  // what the two kinds of group options share
    go.rank = a.replica;
    go.size = a.replicas;
    go.transport = a.transport;
    go.host = a.bind_host;
    if (!parts.ipc_dir.empty()) go.ipc_dir = parts.ipc_dir;
    go.group_id = static_cast<uint64_t>(a.stage);  // a stage's replicas are one group
  };
  if (a.encrypt) {
    transport::ZmqGroupOptions go;
    common(go);
    go.link_timeout = std::chrono::seconds(a.wire.timeout_s);
    go.curve_secret_key = parts.curve.secret_key;
    go.curve_public_key = parts.curve.public_key;
    return transport::makeZmqGroup(parts.ctx, parts.host, go, exchange);
  }
  transport::SocketGroupOptions go;
  common(go);
  go.connect_timeout = std::chrono::seconds(a.wire.timeout_s);
  return transport::makeSocketGroup(go, exchange);
}

}  // namespace tandem::runtime
