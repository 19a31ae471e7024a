// Waiting for another thread that usually answers within microseconds: spin briefly
// before sleeping on a condition variable, since a sleep and wake-up costs tens of
// microseconds. Only worth it when the threads can have a core each.
#pragma once

#include <chrono>
#include <thread>

namespace tandem {

// Calls `done()` until it returns true or `limit` passes; returns the last answer.
template <typename Done>
bool spinFor(std::chrono::nanoseconds limit, Done&& done) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (unsigned i = 1;; ++i) {
    if (done()) return true;
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) return false;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

// The same for more threads than cores: gives the core away between calls, so that a
// thread it waits for can run.
template <typename Done>
bool yieldFor(std::chrono::nanoseconds limit, Done&& done) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::yield();
  }
}

}  // namespace tandem
