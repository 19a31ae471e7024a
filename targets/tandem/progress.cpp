#include "targets/tandem/progress.h"

#include <unistd.h>

#include <cstdio>
#include <string>

namespace tandem::cli {

namespace {
std::string clock(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60),
                static_cast<long long>(s % 60));
  return buf;
}
}  // namespace

Progress::Progress(int64_t epochs)
    : epochs_(epochs), tty_(isatty(STDERR_FILENO) != 0), last_(std::chrono::steady_clock::now()) {}

void Progress::update(const StepReport& r) {
  const auto now = std::chrono::steady_clock::now();
  const double eta =
      r.step > 0 ? r.elapsed_s / static_cast<double>(r.step) * static_cast<double>(r.steps - r.step)
                 : 0.0;
  if (tty_) {
    if (r.step != r.steps && now - last_ < std::chrono::milliseconds(100)) return;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * r.step / std::max<int64_t>(r.steps, 1));
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r\033[Kepoch %lld/%lld [%s] %lld/%lld loss %.4f %.0f samples/s ETA %s",
                 static_cast<long long>(r.epoch + 1), static_cast<long long>(epochs_), bar.c_str(),
                 static_cast<long long>(r.step), static_cast<long long>(r.steps), r.loss,
                 r.samples_per_s, clock(eta).c_str());
    drawn_ = true;
  } else {
    if (r.step != r.steps && now - last_ < std::chrono::seconds(5)) return;
    std::fprintf(stderr, "epoch %lld/%lld step %lld/%lld loss %.4f %.0f samples/s ETA %s\n",
                 static_cast<long long>(r.epoch + 1), static_cast<long long>(epochs_),
                 static_cast<long long>(r.step), static_cast<long long>(r.steps), r.loss,
                 r.samples_per_s, clock(eta).c_str());
  }
  std::fflush(stderr);
  last_ = now;
}

void Progress::finishEpoch() {
  if (drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace tandem::cli
