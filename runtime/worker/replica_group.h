// A replicated stage's group (core/comm/group.h): the stage's replicas sum their
// gradients over a group of their own, finding each other through the coordinator
// (`exchange`: this replica's address out, every replica's back). On encrypted runs the
// group's links are ZeroMQ's with the run's CurveZMQ keys; otherwise plain sockets
// (faster, docs/collectives.md). Both sum in the same order.
#pragma once

#include <memory>
#include <string>

#include "core/backend.h"
#include "core/comm/group.h"
#include "runtime/control/cluster_key.h"
#include "runtime/control/messages.h"
#include "transport/context.h"
#include "transport/rendezvous.h"

namespace tandem::runtime {

struct ReplicaGroupParts {
  transport::Context& ctx;  // for an encrypted group's links
  Backend& host;            // where an encrypted group receives
  const DataPlaneKeys& curve;
  std::string ipc_dir;  // the worker's socket folder, for ipc ("": none)
};

// Null for a stage of one replica.
std::unique_ptr<Group> replicaGroup(const Assign& a, const ReplicaGroupParts& parts,
                                    const transport::Exchange& exchange);

}  // namespace tandem::runtime
