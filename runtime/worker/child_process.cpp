#include "runtime/worker/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

namespace tandem::runtime {

bool prepareChild(pid_t parent, std::initializer_list<std::pair<int, int>> keep) {
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) return false;
  // (dup2 clears close-on-exec on the copy; a descriptor already in place keeps its flags.)
  for (const auto& [from, to] : keep)
    if (from == to ? fcntl(to, F_SETFD, 0) != 0 : dup2(from, to) != to) return false;
  // Every descriptor above stderr: close_range where the kernel has it (5.9+), else one
  // by one up to the process's limit.
  if (close_range(3, ~0U, 0) != 0) {
    const long limit = sysconf(_SC_OPEN_MAX);
    for (long fd = 3; fd < (limit > 0 ? limit : 65536); ++fd) close(static_cast<int>(fd));
  }
  return true;
}

}  // namespace tandem::runtime
