// Job files (examples/jobs/*.yaml): what `tandem run` trains or serves and how it is
// cut into stages.
//
//   model: ../models/cnn.yaml      # relative to the job file; or an ONNX model (x.onnx):
//                                  # its layers, and its weights unless `weights:` names others
//   data: fashion-mnist            # or text:PATH (a language model; read on the first
//                                  # stage's node)
//   epochs: 2
//   batch: 32
//   microbatches: 4                # or auto (with `partition: auto`): the partitioner chooses
//   schedule: 1f1b                 # gpipe | 1f1b | zb-h1 | interleaved | auto (with
//                                  # `partition: auto`)
//   chunks: 2                      # interleaved: model chunks per stage (default 2); stage
//                                  # s holds ranges s, s + stages, ... of the partition
//   recompute: false
//   optimizer: {kind: sgd, lr: 0.01, momentum: 0.9}   # + warmup_steps, lr_schedule
//                                  # (constant | step | cosine), decay_steps, decay_factor,
//                                  # min_lr; lr_scale: linear with reference_batch
//   codec: {activations: fp32, gradients: fp32}   # or auto (with `partition: auto`): per link
//   transport: tcp                 # tcp | ipc (loopback)
//   partition: equal               # or a list of layer ranges: [[0, 4], [4, 9], [9, 11]],
//                                  # where a stage may have data-parallel replicas:
//                                  # [[0, 4], {layers: [4, 9], replicas: 2}, [9, 11]],
//                                  # unequal ones with their shares of the work:
//                                  # {layers: [4, 9], replicas: 2, shares: [3, 1]}
//                                  # or split over tensor ranks in its process:
//                                  # {layers: [4, 9], tensor: 2, tensor_shares: [3, 1]},
//                                  # on the node's backends: tensor: [cpu, opencl:0]
//                                  # or a plan file (`tandem partition --out`), or auto
//   stages: 3                      # with `equal`
//   cluster: ../clusters/local.yaml   # with `auto`: the devices to plan over
//   profile: ../../out/profile.json   # with `auto`: their measured profile (optional:
//                                     # else the nodes' daemons measure them)
//   max_replicas: 2                # with `auto`: a stage may get data-parallel replicas
//   max_tensor: 4                  # with `auto`: a stage may be split over up to this many
//                                  # tensor ranks, devices of one node (default 4; 1: never)
//   baseline: equal-layers         # with `auto`: run this baseline split over the same
//                                  # measured cluster instead (equal-layers, equal-params,
//                                  # memory-proportional), to compare with the search's
//   save: ../../out/cnn.tdm        # the trained model, merged from the stages
//   weights: ../../out/cnn.tdm     # start from these parameters (serving, resuming)
//
// Every error names the file, line and column of the offending key or value.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/model.h"
#include "core/optimizer.h"
#include "core/pipeline/schedule.h"
#include "runtime/control/job_settings.h"

namespace tandem::runtime {

// The default checkpoint interval: on the main job (the CNN, 3 stages on the 2-core VM,
// about 35 steps/s) 200 steps is about 6 s of work lost per failure; what writing them
// costs: scripts/checkpoint-figures (docs/pipeline.md, Checkpoints).
inline constexpr int64_t kDefaultCheckpointSteps = 200;
// `max_tensor:` when a job with `partition: auto` gives none.
inline constexpr int kDefaultMaxTensor = 4;

struct JobSpec {
  std::string source;  // the job file, for messages
  std::string model;   // model spec (or .onnx) path, resolved against the job file's directory
  DataSettings data;
  TrainSettings train = jobTrainDefaults();
  // `microbatches: auto`, `schedule: auto` (with `partition: auto`): the planner prices the
  // candidates and the run takes the fastest that fits (planning.h, planJob); until then
  // `train.microbatches` and `train.schedule` hold the defaults.
  bool microbatches_auto = false, schedule_auto = false;
  // Interleaved 1F1B: each stage holds this many of the partition's ranges (stage s the
  // ranges s, s + stages, ...), which then number stages x chunks. 1 for other schedules.
  int chunks = 1;
  int threads = 1;  // CPU threads per stage
  // `codec: {activations, gradients}` and `timeout_s`. A codec of "auto" (the `_auto`
  // flags; `wire` then holds fp32) is each link's from the plan (`partition: auto`
  // chooses them; a plan file may state them). A direction the job fixes is that on
  // every link, whatever a plan file says; one it leaves out is a plan file's, else fp32.
  WireSettings wire;
  bool activations_auto = false, gradients_auto = false;
  bool activation_codec_given = false, gradient_codec_given = false;
  std::string codec_where;  // "job.yaml:9:22": where a codec is auto, for messages
  // "tcp" or "ipc"; "" lets the run choose: ipc (Unix sockets in folders only the user can
  // enter) when every node is this machine, tcp on a cluster with addresses. A run on
  // this machine over tcp encrypts its links with the run's key, as a cluster's are, so
  // they admit only the run's workers (docs/runtime.md, Security).
  std::string transport;
  std::string transport_where;  // "job.yaml:7:12" where the job sets it, for messages
  std::string zero_where;       // where the job sets `zero:` (train.zero), for messages
  // Either explicit layer ranges [begin, end) or, when empty, `stages` equal parts. Each
  // with the replicas of its stage (1: none) and where the file gives it, for messages.
  struct Range {
    LayerRange layers;
    int replicas = 1;
    // Unequal replicas: each one's share of the work (`shares: [3, 1]`, one per replica);
    // empty: equal. Every batch is then cut into microbatches in proportion to them
    // (TrainSettings::microbatch_shares), so one stage of the job may have them.
    std::vector<double> shares;
    std::string where;  // "job.yaml:12:5"
    // Tensor parallelism: `tensor: N` splits the stage's layers over N ranks in its
    // worker's process (StageSlice::tensor), by `tensor_shares` (empty: equal);
    // `tensor: [cpu, opencl:0]` names each rank's backend (rank 0's the stage's device).
    int tensor = 1;
    std::vector<double> tensor_shares = {};
    std::vector<std::string> tensor_devices = {};
    bool operator==(const Range&) const = default;
  };
  std::vector<Range> ranges;
  int stages = 0;
  // `partition: PLAN.yaml` (its path) or `partition: auto` (plan with the partitioner from
  // `cluster` and `profile` when the run starts); the stages' devices come from the plan.
  // Resolved outside core, which does not know the partitioner (runtime/job/planning.h).
  std::string plan;
  bool auto_partition = false;
  std::string cluster, profile;
  int max_replicas = 1;  // `partition: auto`: the most replicas the partitioner may give a stage
  // `partition: auto`: the most tensor ranks it may split a stage over (1: layer-wise only).
  int max_tensor = kDefaultMaxTensor;
  std::string baseline;  // `partition: auto`: place this baseline split instead (empty: search)
  std::string partition_where;  // "job.yaml:12:12", for messages
  std::string save;             // a model file to write at the end (resolved like `model`)
  std::string weights;          // a model file to start from (its parameters), e.g. to serve
  // `checkpoint: {every_steps: K, keep: N, dir: D}`: every K training steps the run
  // writes a checkpoint (the whole model with its optimizer state, and where training
  // stands) into D, keeping the newest N (docs/pipeline.md, Checkpoints). every_steps 0:
  // no `checkpoint:`; `checkpoint: {}` checkpoints every kDefaultCheckpointSteps.
  struct Checkpoint {
    int64_t every_steps = 0;
    int keep = 2;
    std::string dir;    // default: checkpoints/<job file's stem> beside the job file
    std::string where;  // "job.yaml:14:13", for messages
  } checkpoint;
  // With checkpoints, or serving (`tandem infer`): how many times a run that loses a
  // worker's node (killed, cut off) leaves that node out, re-plans on the others and
  // resumes — from its newest checkpoint, or a stream from its first unanswered batch —
  // before it gives up (0: never).
  int max_restarts = 3;
  // A node left out after a loss is tried again at a checkpoint once this long has
  // passed (doubled for each further loss of the same node: a back-off), and rejoins
  // at that checkpoint if its daemon answers; 0: never. Nodes with addresses only.
  double rejoin_after_s = 30;
};

JobSpec parseJobSpec(const std::string& yaml_text, const std::string& source = "<string>");
JobSpec loadJobSpec(const std::string& path);

// The stages' layer ranges for `model`: the explicit ranges, checked to cover every
// layer once, in order (InvalidArgument names the job file and the range at fault), or
// `stages` parts of nearly equal layer counts (stages x chunks when interleaved: stage s
// then holds ranges s, s + stages, ...). Not for plans (job.plan, auto_partition).
std::vector<LayerRange> stageRanges(const JobSpec& job, const Model& model);
// `layers` split into `stages` contiguous ranges whose sizes differ by at most one.
std::vector<LayerRange> equalStageRanges(size_t layers, int stages);

}  // namespace tandem::runtime
