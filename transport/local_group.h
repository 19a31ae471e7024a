// The in-process Group: the ranks are threads of one process (replicas driving
// different devices) and share memory. A collective publishes each rank's buffer
// pointers, meets the others at a barrier, and then reads the others' buffers directly:
// no serialisation, no sockets, no copies beyond the data movement itself.
//
//   allreduce, large ("ring"): one pass over blocks of the buffer; a block is reduced
//     from every rank's buffer (in rank order) and written back to every rank's buffer,
//     so each byte is read once and written once. Each rank claims the blocks of its own
//     range first (the same blocks every call, so they stay in its core's cache), then
//     what is left of the others': with more ranks than cores, the ranks on a core do
//     the work of those off it. A rank returns when every block is done, without waiting
//     for the others to leave.
//   allreduce, direct (small): each rank copies its buffer to a scratch slot, then
//     reduces every slot into its own buffer; one barrier (slots alternate per call).
//
// A rank waiting at a barrier keeps trying, giving its core away between tries
// (sched_yield: a rank it waits for may be next in line for it), for 2 ms when every
// rank can have a core and 100 µs when not (waitBeforeSleeping, core/spin.h), then
// blocks on a condition variable with the collective's deadline.
// At the end of a shared allreduce it waits only for ranks that are working, and keeps
// yielding. A rank that does not arrive in time makes the waiting ranks raise Timeout naming it,
// and the group is then broken: every later call on any rank raises Timeout with the same message.
#pragma once

#include <memory>
#include <vector>

#include "core/comm/group.h"

namespace tandem::transport {

// `size` ranks of one group: hand groups[r] to the thread that is rank r. The groups
// share state; they may be destroyed in any order.
std::vector<std::unique_ptr<Group>> makeLocalGroup(int size);

}  // namespace tandem::transport
