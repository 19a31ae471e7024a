#include "backends/cpu/thread_pool.h"

#include <algorithm>

#include "core/error.h"
#include "core/spin.h"

namespace tandem::cpu {

namespace {
thread_local bool t_inside_task = false;
}

ThreadPool::ThreadPool(int threads) : threads_(threads), spin_(waitBeforeSleeping(threads)) {
  TANDEM_CHECK_MSG(threads >= 1 && threads <= 1024, InvalidArgument,
                   "thread count " << threads << " is not in [1, 1024]");
  for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { workerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::parallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_ranges = std::min<int64_t>(threads_, (n + grain - 1) / grain);
  if (max_ranges <= 1 || t_inside_task) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  const int64_t chunk = (n + max_ranges - 1) / max_ranges;
  const int ranges = static_cast<int>((n + chunk - 1) / chunk);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    n_ = n;
    chunk_ = chunk;
    fn_ = &fn;
    error_ = nullptr;
    active_ranges_ = ranges;
    pending_ = ranges - 1;
    ++generation_;
  }
  wake_.notify_all();
  t_inside_task = true;
  try {
    fn(0, std::min(chunk, n));
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::current_exception();
  }
  t_inside_task = false;
  yieldFor(spin_, [this] { return pending_.load() == 0; });
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return pending_ == 0; });
  fn_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::workerLoop(int index) {
  uint64_t seen = 0;
  t_inside_task = true;
  for (;;) {
    int64_t begin = 0, end = 0;
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    yieldFor(spin_, [&] { return stop_.load() || generation_.load() != seen; });
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= active_ranges_) continue;
      begin = index * chunk_;
      end = std::min(n_, begin + chunk_);
      fn = fn_;
    }
    std::exception_ptr err;
    try {
      (*fn)(begin, end);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

}  // namespace tandem::cpu
