// A training step of a plan, predicted by running its schedule: every stage's action list
// (core/pipeline/schedule.h) against the others, each action taking the time the cost
// model gives it, as validateSchedule runs them in unit ticks. The slowest stage sets the
// pace in steady state, but a step also fills and drains the pipeline, and its stages
// differ: the prediction is the time from the first forward to the last optimizer step.
//
//   forward k         the stage's layers' forward (the last stage's includes the loss)
//   backward k        the first stage: its whole backward; later stages: less the
//                     weight-gradient share (CostModel::weightGradient)
//   weight gradient k that share, after the input's gradient went upstream
//   send ...          never blocks the stage; each direction of a link carries one
//                     message at a time: bytes (after the codec) over the bandwidth, then
//                     the latency until it arrives
//   receive ...       waits for the message to arrive
//   step              the replicas' gradient allreduce (a replicated stage), then the
//                     optimizer's update of the stage's parameters (CostModel::update)
// A replicated stage runs each microbatch split over its replicas (compute / k). An
// interleaved plan (Plan::chunks > 1) runs interleaved 1F1B over its stages' chunks, each
// action on its chunk's times, the messages between chunks on the wires between their
// stages (the last stage's to the first carrying chunks on to the next). A device
// under a CPU quota computes at full speed while its burst budget lasts (DeviceCosts::
// burst_ratio, burst_budget_s: a token bucket), at the sustained rate after. Five steps
// run back to back, as a run's do (no barrier between steps: a stage starts the next
// step's work when its messages allow); the last one's length is the step.
//
// Stages on one node's host devices (DeviceCosts::host_threads) share its cores
// (Problem::node_cores): when the threads they keep busy, on average over a step,
// outnumber the cores, each computes that much slower (a damped fixed point of runs).
// A stage computing keeps at most the node's cores busy (a quarter-core quota: a quarter,
// whatever its threads), since its times are what it sustains there. The messages a step
// sends and receives keep the cores busy too (Problem::node_message_cpu, measured by the
// node's daemon, or the link's own cost per byte where it measured higher): half of each
// message's CPU on the sender's node, half on the receiver's. The messages' CPU comes off
// a node's cores before its stages share them (under a quota: what the messages leave of
// it refills the burst budget). On a node with cores to spare it costs nothing; on a
// quarter-core node whose stage is busy all the time it lengthens the step by that CPU
// over the quota. A send also holds the sending stage's own thread for its encoding and
// hand-over to the transport (MessageCpuCost::send, measured by the node's daemon): the
// message leaves, and the stage goes on, after it.
//
// What it leaves out: data loading, memory bandwidth and caches that co-located stages
// share, and nodes that share a machine without knowing it (docs/partitioner.md says how
// far the predictions hold, and scripts/plan-fidelity measures it).
#pragma once

#include <vector>

#include "core/pipeline/schedule.h"
#include "partitioner/plan.h"

namespace tandem::partitioner {

struct StepPrediction {
  double step_s = 0;           // the steady step: one step's end to the next's
  double samples_per_s = 0;    // the step's samples (microbatches x microbatch size) / step_s
  std::vector<double> busy_s;  // per stage: computing, per step
  double bubble = 0;           // idle share of stage time: 1 - sum(busy) / (stages x step)
};

// The step of `plan` under `cost`'s options (schedule, microbatches, codecs). A training
// objective only (InvalidArgument otherwise); `schedule` overrides the options' kind.
StepPrediction predictStep(const CostModel& cost, const Plan& plan);
StepPrediction predictStep(const CostModel& cost, const Plan& plan, ScheduleKind schedule);

}  // namespace tandem::partitioner
