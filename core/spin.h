// Waiting for another thread that usually answers soon: keep trying, yielding the core,
// before sleeping on a condition variable, since a sleep and wake-up costs more than a
// short wait.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace tandem {

// How long one of `threads` threads that meet again and again (replicas, the ranks of
// an in-process group, a socket group's local ranks) keeps trying, yielding, before it
// sleeps: 2 ms when each can have a core, else 100 us (then yielding only takes cores
// from threads that could use them). A sleeping thread leaves its core idle and its
// wake-up costs more than a short wait; docs/collectives.md says what was measured.
inline std::chrono::microseconds waitBeforeSleeping(int threads) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return std::chrono::microseconds(threads <= cores ? 2000 : 100);
}

// Calls `done()` until it returns true or `limit` passes, giving the core away between
// calls (a thread it waits for may be next in line for it); returns the last answer.
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
