// A thread that runs one job at a time, handed over by run() and awaited by wait(); each
// side keeps trying for `spin` (yielding) before it sleeps (core/spin.h). A data-parallel
// replica's compute thread, a gradient bucket's communication thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

class JobThread {
 public:
  explicit JobThread(std::chrono::microseconds spin);
  ~JobThread();
  JobThread(const JobThread&) = delete;
  JobThread& operator=(const JobThread&) = delete;

  // Starts `job`; the previous one must have been awaited.
  void run(std::function<void()> job);
  // Returns once the job is done; rethrows what it threw.
  void wait();

 private:
  void loop();

  const std::chrono::microseconds spin_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> job_;
  std::atomic<bool> busy_ = false;  // written under mutex_; read spinning without
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the rest is ready
};

// Runs fn(0) on the caller's thread and fn(r) on others[r - 1], all at once; every one
// finishes (a rank whose collective failed times the others' out), then the first error
// is raised. Tensor ranks' steps and generations.
void runOnEvery(std::vector<std::unique_ptr<JobThread>>& others,
                const std::function<void(int)>& fn);

}  // namespace tandem
