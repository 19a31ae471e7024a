// What a node says about itself after the handshake (NodeInfo), and the clock and
// round-trip estimate a client takes of a node over its channel.
#pragma once

#include <string>

#include "runtime/control/channel.h"
#include "runtime/control/messages.h"

namespace tandem::runtime {

// "tandem 0.1.0": this build, as hellos and node infos say it.
std::string buildName();

// This machine as node `name`: its architecture, CPUs, memory, load and every device this
// build can drive.
// `opencl`: list the OpenCL devices too (probing them takes 50-400 ms); else the CPU only.
NodeInfo localNodeInfo(const std::string& name, bool opencl = true);

// Nanoseconds on this machine's realtime clock: what Ping and Pong carry.
int64_t realtimeNs();

struct ClockEstimate {
  double rtt_s = 0;     // median round trip
  double offset_s = 0;  // the peer's clock minus ours, from the fastest round trip
  int rounds = 0;
};
// NTP-style: `rounds` pings, each answered by a pong with the peer's receive and send
// times; the offset comes from the round with the shortest round trip (the least queueing
// to blur it). Error naming the peer if it answers with anything else or not within
// `timeout` per round.
ClockEstimate estimateClock(Channel& channel, int rounds,
                            std::chrono::milliseconds timeout = std::chrono::seconds(5));

}  // namespace tandem::runtime
