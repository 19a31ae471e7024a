// A plan: the stages (layer range, device or replicas) with their predicted costs, the
// predicted bottleneck and samples/s. Every plan, from any algorithm or file, is priced
// by evaluate(), which refuses one that does not cover the model exactly once, uses a
// device twice or mixes device types in a replicated stage; a plan that does not fit in
// memory is returned with `infeasible` saying which device is short and by how much.
//
// On disk (`tandem partition --out`, `partition: PLAN.yaml` in a job):
//   objective: train
//   algorithm: exact
//   microbatch_size: 8
//   microbatches: 4
//   predicted: {bottleneck: stage 1 compute, seconds: 0.0123, step_s: 0.0651,
//               samples_per_s: 491.5}
//   left_out:                  # devices the plan does not use, and why
//     - {device: edge/cpu, reason: "..."}
//   stages:
//     - {layers: [0, 3], devices: [local/cpu0], backend: cpu, threads: 1,
//        compute_s: 0.0034, allreduce_s: 0, update_s: 0.0002, link_s: 0.0001,
//        memory_bytes: 1234567}
//     - {layers: [3, 9], devices: [local/gpu0, local/gpu1], backend: opencl:0,
//        backends: [opencl:0, opencl:1], ...}     # replicas: each on its own device
//        codec: {activations: fp16, gradients: fp32}  # its link to the next stage
//     - {layers: [9, 12], devices: [local/cpu0, local/cpu1], tensor: true,
//        tensor_allreduce_s: 0.0004, ...}   # one stage split over 2 tensor ranks
// Reading takes the layer ranges, device names, backends and threads; the predicted
// figures are informational.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "partitioner/cost_model.h"

namespace tandem::partitioner {

// One stage as the algorithms choose it: layers [begin, end) on `devices` (one, or the
// replicas of the stage).
struct Assignment {
  size_t begin = 0, end = 0;
  std::vector<int> devices;  // indices into Problem::devices
  // Unequal replicas (devices of different types, e.g. a fast and a slow node): each
  // one's share of the work, one per device; empty: equal replicas of one type. A run
  // cuts each batch so that replica r's microbatches are in proportion to its share
  // (TrainSettings::microbatch_shares).
  std::vector<double> shares = {};
  // Tensor parallelism: `devices` are the ranks of one tensor group (2 or more devices of
  // one type on one node, in one process), each holding an equal share of every split
  // layer's features (cost_model.h); no `shares`. A run splits the stage's layers over
  // them (StageSlice::tensor).
  bool tensor = false;
};

// The codecs of one link's two directions: activations on to the next stage, gradients
// back.
struct LinkCodec {
  std::string activations = "fp32", gradients = "fp32";
  double activation_ratio = 1, gradient_ratio = 1;
  bool operator==(const LinkCodec&) const = default;
};

struct PlanStage {
  Assignment at;
  LinkCodec next;          // the link to the next stage (the last stage's is unused)
  double compute_s = 0;    // per microbatch, with the replicas' allreduce and update share
  double allreduce_s = 0;  // per step
  double update_s = 0;     // per step: the optimizer's update of the stage's parameters
  double link_s = 0;       // to the next stage, per microbatch (0 for the last)
  // A tensor-split stage: its ranks' all-reduces per microbatch (part of compute_s).
  double tensor_allreduce_s = 0;
  int64_t memory_bytes = 0;  // per device
};

// A device the chosen plan does not use, and why (choosePlan, search.h).
struct LeftOut {
  int device = 0;  // index into Problem::devices
  std::string reason;
};

struct Plan {
  std::string algorithm;
  Objective objective = Objective::kTrainThroughput;
  // Interleaved 1F1B (chunks > 1): `stages` lists the stages x chunks model chunks in
  // layer order, each a virtual stage; chunk k runs where stage k % (stages.size() /
  // chunks) does, so a stage's chunks are k, k + p, k + 2p, ... (as a job's ranges are).
  int chunks = 1;
  std::vector<PlanStage> stages;
  double seconds = 0;      // the slowest stage or link per microbatch; for latency, the sum
  std::string bottleneck;  // "stage 1 compute", "link 0 -> 1", or "sum" for latency
  // Training: one step, its schedule run with each action's time (predictStep,
  // simulate.h), fill and drain included; 0 for the serving objectives.
  double step_s = 0;
  // Training: a step's samples over step_s; serving: microbatch size / seconds (steady state).
  double samples_per_s = 0;
  std::string infeasible;         // empty when every device's memory suffices
  std::vector<LeftOut> left_out;  // set by choosePlan
};

// Whether a stage of the plan is tensor-split (Assignment::tensor).
inline bool splitsTensors(const Plan& p) {
  for (const PlanStage& s : p.stages)
    if (s.at.tensor) return true;
  return false;
}

// A plan with stages whose devices all have the memory it needs.
inline bool fits(const Plan& p) { return !p.stages.empty() && p.infeasible.empty(); }
// `a` fits and its training step is shorter than `b`'s (or `b` does not fit), by more than
// a relative 1e-6, below which two predictions are a tie.
inline bool shorterStep(const Plan& a, const Plan& b) {
  return fits(a) && (!fits(b) || a.step_s < b.step_s * (1 - 1e-6));
}

// Prices `stages`; InvalidArgument if they do not cover the layers exactly once in order,
// repeat a device, or replicate over devices of different types. Links carry the
// options' codecs, or `links` (one per link, stages - 1) when given.
//
// `chunks` > 1: `stages` are an interleaved plan's model chunks (Plan::chunks), each on
// one device, chunk k on chunk k % p's device (p = stages / chunks, at least 2); a
// stage's memory is its chunks' weights and state with the stash interleaved 1F1B keeps
// (its warm-up forwards + 1, at most chunks x microbatches), its compute per microbatch
// (the `seconds` a stage paces) the sum of its chunks', and its step predicted under
// interleaved 1F1B.
Plan evaluate(const CostModel& cost, const std::vector<Assignment>& stages,
              const std::string& algorithm, const std::vector<LinkCodec>& links = {},
              int chunks = 1);

std::string planToYaml(const CostModel& cost, const Plan& plan);

// A plan file as `tandem run` needs it.
struct PlanStageSpec {
  size_t begin = 0, end = 0;
  // `codec: {activations, gradients}` of the link to the next stage (empty: the job's).
  std::string activation_codec, gradient_codec;
  std::vector<std::string> devices;
  std::string backend;
  std::vector<std::string> backends;  // per replica, in devices' order (empty: `backend`)
  std::vector<double> shares;  // unequal replicas: each one's share of the work (empty: equal)
  // `tensor: true`: `devices` are one worker's tensor ranks (Assignment::tensor), on one
  // node; `backends` each rank's.
  bool tensor = false;
  int threads = 1;
  double compute_s = -1;   // the predicted compute per microbatch, if the plan has it
  double allreduce_s = 0;  // a replicated stage's predicted allreduce per step
  double update_s = 0;     // its predicted optimizer update per step (0: not stated)
  std::string where;       // "plan.yaml:7:5", for messages
};
// `chunks`, when given, receives the plan's model chunks per stage (`chunks:`, 1 when it
// states none): an interleaved plan lists stages x chunks ranges, chunk k on stage k %
// stages (Plan::chunks).
std::vector<PlanStageSpec> parsePlan(const std::string& yaml_text, const std::string& source,
                                     int* chunks = nullptr);
// A plan's stages as its file states them (what parsePlan reads back from planToYaml, but
// with the predicted times unrounded), each named by `where` in messages: how `tandem
// run` takes the plan it made for `partition: auto` without a trip through YAML text.
std::vector<PlanStageSpec> planStageSpecs(const CostModel& cost, const Plan& plan,
                                          const std::string& where);

}  // namespace tandem::partitioner
