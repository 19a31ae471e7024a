#include "core/train/job_thread.h"

#include <exception>
#include <utility>

#include "core/spin.h"

namespace tandem {

JobThread::JobThread(std::chrono::microseconds spin) : spin_(spin), thread_([this] { loop(); }) {}

JobThread::~JobThread() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void JobThread::run(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    job_ = std::move(job);
    busy_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void JobThread::wait() {
  yieldFor(spin_, [&] { return !busy_.load(std::memory_order_acquire); });
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return !busy_.load(std::memory_order_relaxed); });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void JobThread::loop() {
  for (;;) {
    yieldFor(spin_, [&] { return busy_.load(std::memory_order_acquire); });
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return busy_.load(std::memory_order_relaxed) || stop_; });
    if (stop_) return;
    std::function<void()> job = std::move(job_);
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    busy_.store(false, std::memory_order_release);
    cv_.notify_all();
  }
}

void runOnEvery(std::vector<std::unique_ptr<JobThread>>& others,
                const std::function<void(int)>& fn) {
  for (size_t r = 1; r <= others.size(); ++r)
    others[r - 1]->run([&fn, r] { fn(static_cast<int>(r)); });
  std::exception_ptr error;
  try {
    fn(0);
  } catch (...) {
    error = std::current_exception();
  }
  for (auto& t : others) {
    try {
      t->wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace tandem
