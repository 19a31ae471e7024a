// SIGINT and SIGTERM while a run is on: noted for the coordinator, which stops every
// worker within 200 ms and raises Interrupted (a second signal ends the process at once,
// as usual).
#pragma once

#include <atomic>

namespace tandem::cli {

// The signal caught (0: none), for runtime::JobRun::run.
extern std::atomic<int> g_interrupt;

// Catches SIGINT and SIGTERM into g_interrupt while it lives.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
};

}  // namespace tandem::cli
