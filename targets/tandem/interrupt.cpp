#include "targets/tandem/interrupt.h"

#include <csignal>

namespace tandem::cli {

std::atomic<int> g_interrupt{0};

namespace {

void onInterrupt(int signal) {
  g_interrupt.store(signal);
  std::signal(signal, SIG_DFL);
}

}  // namespace

InterruptGuard::InterruptGuard() {
  g_interrupt.store(0);
  std::signal(SIGINT, onInterrupt);
  std::signal(SIGTERM, onInterrupt);
}

InterruptGuard::~InterruptGuard() {
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

}  // namespace tandem::cli
