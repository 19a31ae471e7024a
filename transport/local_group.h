// The in-process Group: the ranks are threads of one process (replicas driving
// different devices) and share memory. A collective publishes each rank's buffer
// pointers, meets the others at a barrier, and then reads the others' buffers directly:
// no serialisation, no sockets, no copies beyond the data movement itself.
//
//   allreduce, ring (large): each rank reduces its own slice from every rank's buffer
//     (in rank order), then copies the other slices from their owners; three barriers.
//   allreduce, direct (small): each rank copies its buffer to a scratch slot, then
//     reduces every slot into its own buffer; one barrier (slots alternate per call).
//
// Barriers spin for up to 100 µs when the ranks fit on the machine's cores, then block
// on a condition variable with the collective's deadline. A rank that
// does not arrive in time makes the waiting ranks raise Timeout naming it, and the group
// is then broken: every later call on any rank raises Timeout with the same message.
#pragma once

#include <memory>
#include <vector>

#include "core/pipeline/group.h"

namespace tandem::transport {

// `size` ranks of one group: hand groups[r] to the thread that is rank r. The groups
// share state; they may be destroyed in any order.
std::vector<std::unique_ptr<Group>> makeLocalGroup(int size);

}  // namespace tandem::transport
