// Waiting for another thread that usually answers soon: keep trying, yielding the core,
// before sleeping on a condition variable, since a sleep and wake-up costs more than a
// short wait.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace tandem {

// How long one of `threads` threads that meet again and again (replicas, the ranks of
// an in-process group) keeps trying, yielding, before it sleeps: 2 ms when each can
// have a core, else 100 us. On this project's 2-vCPU VM two data-parallel replicas took
// 15% less time per step at batch 1024 with 2 ms than with 100-200 us (medians of 4
// alternated runs: 2.30 -> 1.93 s for 205 steps, and 2.53 -> 2.17 s in another set;
// their waits fell from a median 10% to 7-8% of the step), likely because a thread that
// sleeps leaves its virtual CPU idle, and waking it costs more than the wait saved.
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
