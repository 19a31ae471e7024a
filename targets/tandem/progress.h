// Training progress on stderr: a redrawn bar when stderr is a terminal, plain lines at
// most every few seconds when it is not (logs, CI).
#pragma once

#include <chrono>
#include <cstdint>

#include "core/train/trainer.h"

namespace tandem::cli {

class Progress {
 public:
  explicit Progress(int64_t epochs);
  void update(const StepReport& r);
  // Ends the bar line (if drawn) before the epoch summary is printed.
  void finishEpoch();

 private:
  int64_t epochs_;
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace tandem::cli
