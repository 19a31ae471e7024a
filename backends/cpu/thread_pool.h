// A fixed pool of worker threads for the CPU kernels.
//
// parallelFor splits [0, n) into at most threads() contiguous ranges, the same ranges
// for the same (n, grain), so kernels that reduce within a range stay deterministic.
// The calling thread runs the first range itself. One parallelFor at a time per pool:
// calls are serialised by a mutex; a nested call from inside a task runs serially.
// Workers waiting for the next call, and the caller waiting for the workers, keep
// checking, yielding the core, for waitBeforeSleeping (core/spin.h) before they sleep:
// kernels come back to back, and a sleeping thread's wake-up (a futex, on a VM an
// interrupt to an idle virtual CPU) took up to a millisecond, longer than many kernels.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }

  // Runs fn(begin, end) over a partition of [0, n) into ranges of at least `grain`
  // items. Exceptions from any range are rethrown here (the first one wins).
  void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void workerLoop(int index);

  int threads_;
  std::chrono::microseconds spin_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // serialises parallelFor calls

  std::mutex mutex_;  // guards everything below (the atomics are written under it too)
  std::condition_variable wake_;
  std::condition_variable done_;
  std::atomic<uint64_t> generation_ = 0;
  std::atomic<int> pending_ = 0;
  int active_ranges_ = 0;
  int64_t n_ = 0, chunk_ = 0;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  std::exception_ptr error_;
  std::atomic<bool> stop_ = false;
};

}  // namespace tandem::cpu
