// Link measurement over core's Link interface: round-trip latency of a one-float
// message and one-way bandwidth of large tensors, between a measuring side and an echoing
// side. `tandem profile --links` runs it over the real transport (ZmqLink) between the
// nodes of a cluster; the result goes into the profile's `links` (docs/profile.md).
//
// On the link, the measuring side sends tensors tagged (activation, n) for n = 0, 1, ...;
// the echo side answers a one-element tensor (a ping) with the same tensor tagged
// (gradient, n), takes larger ones (data) without an answer, and returns after a ping
// holding 1 (stop). Bandwidth: `window` data messages then a ping, timed to the answer,
// less one small round trip, so that a single message's latency is not counted as
// transfer time. Each side also reads what its host's CPUs spent busy while the data
// went (hostBusyCpuSeconds: the transport's threads, and the kernel's packet handling,
// which on a slow or shaped link costs more per byte than on loopback), and what its own
// process spent (processCpuSeconds: every thread, and the packet handling that ran on
// them) — what a CPU quota on that end is charged, read to the nanosecond where the
// host's figure comes in 10 ms ticks.
//
// A pipeline's messages arrive while the stages compute, and there they cost more than
// on an idle node: the packets' handling lands on the computing thread, the transport's
// threads wake into caches the computation filled, and under a CPU quota both take turns
// at it. With a load (LinkProbeOptions::load, echoLink's `load`), after the bandwidth
// runs each end computes beside the link — a GEMM loop on a backend of its own, on its
// own thread — while `window` x `repeats` data messages (fewer on a slow link:
// loadedMessages) go one at a time, each answered by a ping as a pipeline's are spaced. What the
// messages cost that end is its process's CPU over them less what the load's GEMMs would have cost
// alone (their CPU each, timed just before with nothing on the link): what the transport's threads
// took and what the computation lost to them. A ping holding 2 tells the echo side to start its
// load and its timing alone (answered when that is done), one holding 3 that the data are over.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "core/comm/link.h"
#include "core/profile/measure.h"

namespace tandem {

struct LinkProbeOptions {
  int64_t message_bytes = int64_t{4} << 20;  // each data message (a multiple of 4)
  int window = 4;                            // data messages per timed run
  int warmup = 2, repeats = 10;              // untimed, then timed runs of each kind
  // Makes the loaded runs' backend (above); empty: no loaded runs.
  std::function<std::unique_ptr<Backend>()> load;
};

struct LinkMeasurement {
  Spread round_trip;          // seconds, ping and answer
  Spread transfer;            // seconds, `window` data messages and a ping answered
  double latency_s = 0;       // half the median round trip
  double bandwidth = 0;       // bytes per second, one way
  int64_t message_bytes = 0;  // as measured
  // The host's busy CPU seconds over the bandwidth runs (warm-up included), and the
  // bytes those runs sent.
  double host_cpu_s = 0;
  int64_t data_bytes = 0;
  double process_cpu_s = 0;  // this process's CPU seconds over the same runs
  // What the loaded runs' messages cost this end (CPU seconds), and the bytes they sent;
  // 0, 0 without a load.
  double loaded_cpu_s = 0;
  int64_t loaded_bytes = 0;
};

// What the echo side spent from the first data message to the stop (0, 0 without data).
struct EchoCpu {
  double host_cpu_s = 0;     // its host's busy CPU (hostBusyCpuSeconds)
  double process_cpu_s = 0;  // its own process's (processCpuSeconds)
  double loaded_cpu_s = 0;   // what the loaded runs' messages cost it (0: none were run)
};

// The measuring side; ends by stopping the echo side. InvalidArgument for bad options;
// Timeout (from the link) if the echo side does not answer.
LinkMeasurement measureLink(Link& link, Backend& backend, const LinkProbeOptions& options);

// How many messages the loaded runs send over a link of `bandwidth` (bytes per second,
// as the bandwidth runs measured it): window x repeats, or fewer on a slow link — as
// many as take kLoadedSeconds, at least kLeastLoadedMessages (a survey's task must end
// within its timeout: 20 messages of 1 MiB take 17 s at 10 Mbit/s).
inline constexpr double kLoadedSeconds = 0.5;
inline constexpr int64_t kLeastLoadedMessages = 2;
int64_t loadedMessages(const LinkProbeOptions& options, double bandwidth);

// The echo side: answers until stopped; returns the CPU it and its host spent from the
// first data message to the end of the bandwidth runs (the loaded runs' start, else the
// stop), and what the loaded runs cost it when the measuring side ran them and `load`
// makes their backend (else it answers their pings at once and computes nothing).
// FormatError if a message is not a probe's.
EchoCpu echoLink(Link& link, Backend& backend,
                 const std::function<std::unique_ptr<Backend>()>& load = {});

}  // namespace tandem
