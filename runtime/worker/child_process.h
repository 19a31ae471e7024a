// What a process this one forks does before it execs (a stage worker, a local tandemd):
// it starts with only the descriptors it is handed, and dies with its parent.
#pragma once

#include <sys/types.h>

#include <initializer_list>
#include <utility>

namespace tandem::runtime {

// In the child, between fork and exec (async-signal-safe calls only): dies by SIGKILL
// when the thread that forked it ends, and at once if `parent` is already gone (the
// death signal is not sent for a parent that died before it was set); makes each
// (from, to) pair's `from` its descriptor `to` (0, 1, 2) and closes every other
// descriptor from 3 up — the daemon's listening socket, its clients' connections, other
// runs' files — whatever their close-on-exec flag. Returns false if the parent had
// gone or a dup2 failed: the child should _exit then.
bool prepareChild(pid_t parent, std::initializer_list<std::pair<int, int>> keep);

}  // namespace tandem::runtime
