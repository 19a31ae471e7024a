// Job files: every setting read, and every malformed file named by key and line.
#include "runtime/job/job.h"

#include <gtest/gtest.h>

#include "runtime/job/planning.h"

#include "core/error.h"
#include "core/model_spec.h"
#include "tests/test_util.h"

namespace tandem::runtime {
namespace {

using testing::expectThrowWith;

const char* kJob = R"(model: ../models/cnn.yaml
epochs: 2
batch: 32
microbatches: 8
schedule: gpipe
recompute: true
seed: 7
threads: 2
optimizer: {kind: adamw, lr: 0.001, weight_decay: 0.01, lr_schedule: cosine, warmup_steps: 10,
            decay_steps: 100, min_lr: 0.0001, lr_scale: linear, reference_batch: 16}
codec: {activations: fp16, gradients: int8}
transport: ipc
timeout_s: 5
partition: [[0, 4], [4, 9], [9, 11]]
save: ../../out/cnn.tdm
weights: /models/start.tdm
)";

TEST(JobTest, ReadsEverySetting) {
  const JobSpec j = parseJobSpec(kJob, "examples/jobs/x.yaml");
  EXPECT_EQ(j.model, "examples/models/cnn.yaml");
  EXPECT_EQ(j.save, "out/cnn.tdm");
  EXPECT_EQ(j.weights, "/models/start.tdm");
  EXPECT_EQ(j.train.epochs, 2);
  EXPECT_EQ(j.train.batch, 32);
  EXPECT_EQ(j.train.microbatches, 8);
  EXPECT_EQ(j.train.schedule, ScheduleKind::kGPipe);
  EXPECT_TRUE(j.train.recompute);
  EXPECT_EQ(j.train.seed, 7u);
  EXPECT_EQ(j.threads, 2);
  EXPECT_EQ(j.train.optimizer.kind, "adamw");
  EXPECT_FLOAT_EQ(j.train.optimizer.lr, 0.002f);  // linear scaling: batch 32 over 16
  EXPECT_FLOAT_EQ(j.train.optimizer.min_lr, 0.0002f);
  EXPECT_EQ(j.train.optimizer.lr_schedule, "cosine");
  EXPECT_EQ(j.train.optimizer.warmup_steps, 10);
  EXPECT_EQ(j.train.optimizer.decay_steps, 100);
  EXPECT_EQ(j.wire.activations, WireCodec::kF16);
  EXPECT_EQ(j.wire.gradients, WireCodec::kI8);
  EXPECT_EQ(j.transport, "ipc");
  EXPECT_EQ(j.wire.timeout_s, 5);
  EXPECT_EQ(j.stages, 3);
  ASSERT_EQ(j.ranges.size(), 3u);
  EXPECT_EQ(j.ranges[0].layers, (LayerRange{0, 4}));
  EXPECT_EQ(j.ranges[1].layers, (LayerRange{4, 9}));
  EXPECT_EQ(j.ranges[2].layers, (LayerRange{9, 11}));
  EXPECT_EQ(j.checkpoint.every_steps, 0);  // none unless asked
  const JobSpec c = parseJobSpec(
      "model: m.yaml\npartition: equal\nstages: 2\ncheckpoint: {every_steps: 50, keep: 4}\n",
      "jobs/run.yaml");
  EXPECT_EQ(c.checkpoint.every_steps, 50);
  EXPECT_EQ(c.checkpoint.keep, 4);
  EXPECT_EQ(c.checkpoint.dir, "jobs/checkpoints/run");  // beside the job file
  EXPECT_EQ(c.checkpoint.where, "jobs/run.yaml:4:13");
  EXPECT_EQ(c.rejoin_after_s, 30);
  EXPECT_EQ(parseJobSpec("model: m.yaml\npartition: equal\nstages: 2\nrejoin_after_s: 0.5\n")
                .rejoin_after_s,
            0.5);
  EXPECT_EQ(parseJobSpec("model: m.yaml\npartition: equal\nstages: 2\ncheckpoint: {}\n")
                .checkpoint.every_steps,
            kDefaultCheckpointSteps);
  EXPECT_EQ(parseJobSpec("model: m.yaml\npartition: equal\nstages: 2\n"
                         "checkpoint: {every_steps: 5, dir: /tmp/ck}\n",
                         "jobs/run.yaml")
                .checkpoint.dir,
            "/tmp/ck");
}

TEST(JobTest, MalformedFilesNameTheKeyAndLine) {
  struct Case {
    std::string yaml;
    std::vector<std::string> expect;
  } cases[] = {
      {"model: m.yaml\npartition: equal\nstages: 2\nepoch: 3\n",
       {"j.yaml:4:1", "unknown key 'epoch'"}},
      {"model: m.yaml\npartition: equal\nstages: 2\ncheckpoint: 5\n",
       {"j.yaml:4:13", "'checkpoint' must be a map"}},
      {"model: m.yaml\npartition: equal\nstages: 2\nrejoin_after_s: -1\n",
       {"j.yaml:4:17", "'rejoin_after_s' must be from 0 to 86400 seconds"}},
      {"model: m.yaml\npartition: equal\nstages: 2\nrejoin_after_s: soon\n",
       {"j.yaml:4:17", "a number of seconds"}},
      {"model: m.yaml\npartition: equal\nstages: 2\ncheckpoint: {every_steps: 0}\n",
       {"j.yaml:4:27", "positive"}},
      {"model: m.yaml\npartition: equal\nstages: 2\ncheckpoint: {every_steps: 5, often: 1}\n",
       {"j.yaml:4:30", "unknown checkpoint key 'often'"}},
      {"model: m.yaml\npartition: equal\nstages: 2\nschedule: zb-v\n",
       {"j.yaml:4:11", "unknown schedule 'zb-v'", "gpipe, 1f1b, zb-h1, interleaved or forward"}},
      {"model: m.yaml\npartition: equal\nstages: 2\nschedule: forward\n",
       {"j.yaml:4:11", "cannot train"}},
      {"model: m.yaml\npartition: equal\nstages: 2\nchunks: 2\n",
       {"j.yaml:4:9", "'chunks' is for 'schedule: interleaved'"}},
      {"model: m.yaml\npartition: equal\nstages: 2\nschedule: interleaved\nchunks: 1\n",
       {"j.yaml:5:9", "'chunks' must be from 2 to 64"}},
      {"model: m.yaml\npartition: equal\nstages: 1\nschedule: interleaved\n",
       {"j.yaml:3:9", "interleaved stages need 2 stages or more"}},
      {"model: m.yaml\npartition: [[0, 1], [1, 2], [2, 3]]\nschedule: interleaved\n",
       {"j.yaml:2:12", "lists 3 ranges, not a multiple of the 2 chunks per stage"}},
      {"model: m.yaml\npartition: [[0, 1], [1, 2], [2, 3], [3, 4]]\nstages: 4\n"
       "schedule: interleaved\n",
       {"j.yaml:3:9", "'stages' is 4 but the partition lists 4 ranges (2 chunks per stage)"}},
      {"model: m.yaml\npartition: [[0, 1], [1, 2]]\nschedule: interleaved\nchunks: 2\n",
       {"j.yaml:2:12", "interleaved stages need 2 stages or more"}},
      {"model: m.yaml\npartition: [[0, 1], {layers: [1, 2], replicas: 2}, [2, 3], [3, 4]]\n"
       "schedule: interleaved\n",
       {"j.yaml:2:30", "interleaved stages cannot have replicas"}},
      {"model: m.yaml\npartition: equal\n", {"j.yaml:2:12", "needs 'stages: N'"}},
      {"model: m.yaml\npartition: [[0, 2], [2, 2]]\n", {"j.yaml:2:21", "[2, 2) is empty"}},
      {"model: m.yaml\npartition: [[0, 2], 5]\n", {"j.yaml:2:21", "range [begin, end]"}},
      {"model: m.yaml\npartition: equal\nstages: 2\nbatch: 0\n", {"j.yaml:4:8", "positive"}},
      {"model: m.yaml\npartition: equal\nstages: 2\nbatch: many\n",
       {"j.yaml:4:8", "'batch' must be an integer"}},
      {"model: m.yaml\npartition: equal\nstages: 2\ncodec: {activations: fp8}\n",
       {"j.yaml:4:22", "unknown codec 'fp8'"}},
      {"model: m.yaml\npartition: equal\nstages: 2\noptimizer: {kind: sgd, lr: -1}\n",
       {"j.yaml:4:12", "learning rate -1"}},
      {"model: m.yaml\npartition: equal\nstages: 2\noptimizer: {lr_schedule: cosine}\n",
       {"j.yaml:4:12", "cosine needs decay_steps > 0"}},
      {"model: m.yaml\npartition: equal\nstages: 2\noptimizer: {lr_scale: linear}\n",
       {"j.yaml:4:23", "needs reference_batch"}},
      {"model: m.yaml\npartition: equal\nstages: 2\noptimizer: {lr_scale: square}\n",
       {"j.yaml:4:23", "lr_scale must be linear or none"}},
      {"model: m.yaml\npartition: equal\nstages: 2\ntransport: udp\n",
       {"j.yaml:4:12", "unknown transport 'udp'"}},
      {"partition: equal\nstages: 2\n", {"'model' is required"}},
      {"model: m.yaml\n", {"'partition' is required"}},
      {"model: m.yaml\npartition: [[0, 2]]\nstages: 3\n", {"j.yaml:3:9", "lists 1 ranges"}},
      {"model: m.yaml\npartition: p.yaml\nstages: 2\n", {"j.yaml:3:9", "comes from the plan"}},
      {"model: m.yaml\npartition: best\n", {"j.yaml:2:12", "'auto', a plan file"}},
      {"model: m.yaml\npartition: equal\nstages: 2\nmax_replicas: 2\n",
       {"j.yaml:4:15", "'max_replicas' is for 'partition: auto'"}},
      {"model: m.yaml\npartition: auto\ncluster: c.yaml\nmax_replicas: 0\n",
       {"j.yaml:4:15", "positive"}},
      {"model: m.yaml\npartition: equal\nstages: 2\nmax_tensor: 2\n",
       {"j.yaml:4:13", "'max_tensor' is for 'partition: auto'", "{layers: [b, e], tensor: N}"}},
      {"model: m.yaml\npartition: auto\ncluster: c.yaml\nmax_tensor: 65\n",
       {"j.yaml:4:13", "'max_tensor' must be at most 64"}},
      {"model: m.yaml\npartition: equal\nstages: 2\nbaseline: equal-layers\n",
       {"j.yaml:4:11", "'baseline' is for 'partition: auto'"}},
      {"model: m.yaml\npartition: auto\ncluster: c.yaml\nbaseline: equal\n",
       {"j.yaml:4:11", "unknown baseline 'equal'", "equal-layers, equal-params"}},
      {"model: m.yaml\npartition: [[0, 2], {layers: [2, 4], replicas: 0}]\n",
       {"j.yaml:2:48", "'replicas' must be positive, got 0"}},
      {"model: m.yaml\npartition: [[0, 2], {layers: [2, 4], replicas: 65}]\n",
       {"j.yaml:2:48", "at most 64"}},
      {"model: m.yaml\npartition: [[0, 2], {layers: [2, 4], copies: 2}]\n",
       {"j.yaml:2:38", "unknown stage key 'copies'"}},
      {"model: m.yaml\npartition: [[0, 2], {layers: [2, 4], replicas: 2, shares: [3]}]\n",
       {"j.yaml:2:59", "1 shares for the stage's 2 replicas"}},
      {"model: m.yaml\npartition: [[0, 2], {layers: [2, 4], replicas: 2, shares: [3, 0]}]\n",
       {"j.yaml:2:63", "a replica's share must be in (0, 1e9]"}},
      {"model: m.yaml\npartition: [[0, 2], {layers: [2, 4], replicas: 2, shares: 3}]\n",
       {"j.yaml:2:59", "'shares' is a list of numbers, one per replica"}},
      {"model: m.yaml\npartition: [[0, 2], {layers: [2, 4], tensor: 2, tensor_shares: [1]}]\n",
       {"j.yaml:2:64", "1 tensor shares for the stage's 2 tensor ranks"}},
      {"model: m.yaml\npartition: [[0, 2], {layers: [2, 4], tensor: 65}]\n",
       {"j.yaml:2:46", "'tensor' must be at most 64"}},
      {"model: m.yaml\npartition: [[0, 2], {layers: [2, 4], tensor: [n0/cpu, n1/cpu]}]\n",
       {"j.yaml:2:47", "tensor rank 'n0/cpu' is not a backend of the stage's node",
        "not supported yet"}},
      {"model: m.yaml\npartition: [[0, 2], {layers: [2, 4], tensor: []}]\n",
       {"j.yaml:2:46", "'tensor' lists no backend"}},
      {"model: m.yaml\npartition: [[0, 2], {layers: [2, 4], tensor: 2, replicas: 2}]\n",
       {"j.yaml:2:46", "a tensor-split stage cannot have replicas"}},
      {"model: m.yaml\nschedule: interleaved\npartition: [[0, 1], {layers: [1, 2], tensor: 2}, "
       "[2, 3], [3, 4]]\n",
       {"j.yaml:3:30", "interleaved stages cannot have replicas or be tensor-split"}},
      {"model: m.yaml\nrebalance_steps: -2\n",
       {"j.yaml:2:18", "'rebalance_steps' must be from 0 to 1000"}},
      {"model: m.yaml\nrebalance_steps: often\n", {"j.yaml:2:18", "a whole number of steps"}},
      {"model: m.yaml\npartition: [[0, 2], {replicas: 2}]\n",
       {"j.yaml:2:21", "the stage has no 'layers"}},
      {"model: m.yaml\npartition: [[0, 2], {layers: 2}]\n", {"j.yaml:2:30", "range [begin, end]"}},
      {"model: m.yaml\npartition: equal\nstages: 2\nbatch: 32\nmicrobatches: 64\n",
       {"j.yaml:5:15", "'microbatches' is 64 but a batch of 32 samples makes at most 32"}},
      {"model: m.yaml\npartition: equal\nstages: 2\nmicrobatches: 65\n",
       {"j.yaml:4:15", "a batch of 64 samples"}},  // the default batch
      {"model: m.yaml\npartition: equal\nstages: 2\nmicrobatches: auto\n",
       {"j.yaml:4:15", "'microbatches: auto' is for 'partition: auto'"}},
      {"model: m.yaml\npartition: equal\nstages: 2\nschedule: auto\n",
       {"j.yaml:4:11", "'schedule: auto' is for 'partition: auto'"}},
      {"model: m.yaml\npartition: auto\ncluster: c.yaml\nmicrobatches: many\n", {"j.yaml:4:15"}},
      {"model: m.yaml\npartition: auto\ncluster: c.yaml\nschedule: fast\n",
       {"j.yaml:4:11", "unknown schedule 'fast'"}},
      {"model: m.yaml\npartition: equal\nstages: 2\ncodec: {gradients: auto}\n",
       {"j.yaml:4:20", "a codec of 'auto' is each link's in a plan", "'partition: auto'"}},
      {"model: m.yaml\npartition: [[0, 2], [2, 4]]\ncodec: {activations: auto}\n",
       {"j.yaml:3:22", "a codec of 'auto'"}},
      {"model: m.yaml\npartition: auto\ncluster: c.yaml\ncodec: {activations: best}\n",
       {"j.yaml:4:22", "unknown codec 'best'", "int8 or auto"}},
  };
  for (const Case& c : cases)
    expectThrowWith<InvalidArgument>([&] { parseJobSpec(c.yaml, "j.yaml"); }, c.expect);
  expectThrowWith<FormatError>([&] { parseJobSpec("model: [unclosed\n", "j.yaml"); },
                               {"j.yaml:", "YAML syntax error"});
}

TEST(JobTest, PartitionMayBeAPlanFileOrAuto) {
  const JobSpec plan = parseJobSpec("model: m.yaml\npartition: plans/p.yaml\n", "jobs/j.yaml");
  EXPECT_EQ(plan.plan, "jobs/plans/p.yaml");
  EXPECT_FALSE(plan.auto_partition);
  const JobSpec a = parseJobSpec(
      "model: m.yaml\npartition: auto\ncluster: c.yaml\nprofile: p.json\nmax_replicas: 3\n"
      "baseline: memory-proportional\n",
      "jobs/j.yaml");
  EXPECT_TRUE(a.auto_partition);
  EXPECT_EQ(a.max_replicas, 3);
  EXPECT_EQ(a.max_tensor, kDefaultMaxTensor);  // the planner may split a stage unless told
  EXPECT_EQ(
      parseJobSpec("model: m.yaml\npartition: auto\ncluster: c.yaml\nmax_tensor: 1\n").max_tensor,
      1);
  EXPECT_EQ(a.baseline, "memory-proportional");
  EXPECT_EQ(a.cluster, "jobs/c.yaml");
  EXPECT_EQ(a.profile, "jobs/p.json");
  EXPECT_TRUE(a.ranges.empty());
  EXPECT_FALSE(a.microbatches_auto);
  EXPECT_FALSE(a.schedule_auto);
  // The planner may choose the microbatch count and the schedule.
  const JobSpec chooses = parseJobSpec(
      "model: m.yaml\npartition: auto\ncluster: c.yaml\nbatch: 8\nmicrobatches: auto\n"
      "schedule: auto\n",
      "j.yaml");
  EXPECT_TRUE(chooses.microbatches_auto);
  EXPECT_TRUE(chooses.schedule_auto);
  EXPECT_EQ(parseJobSpec("model: m.yaml\npartition: equal\nstages: 2\nschedule: zb-h1\n", "j.yaml")
                .train.schedule,
            ScheduleKind::kZeroBubbleH1);
  EXPECT_LE(chooses.train.microbatches, 8);  // a placeholder until planned, within the batch
}

// `codec: auto` takes each link's from the plan (chosen by `partition: auto`, or stated by a
// plan file); a direction the job states is its on every link.
TEST(JobTest, CodecsMayBeEachLinksInThePlan) {
  const JobSpec a = parseJobSpec(
      "model: m.yaml\npartition: auto\ncluster: c.yaml\ncodec: {activations: auto}\n", "j.yaml");
  EXPECT_TRUE(a.activations_auto);
  EXPECT_TRUE(a.activation_codec_given);
  EXPECT_FALSE(a.gradients_auto);
  EXPECT_EQ(a.wire.gradients, WireCodec::kRaw);
  EXPECT_FALSE(a.gradient_codec_given);
  const JobSpec p = parseJobSpec(
      "model: m.yaml\npartition: p.yaml\ncodec: {activations: auto, gradients: int8}\n", "j.yaml");
  EXPECT_TRUE(p.activations_auto);
  EXPECT_FALSE(p.gradients_auto);
  EXPECT_EQ(p.wire.gradients, WireCodec::kI8);
  EXPECT_TRUE(p.gradient_codec_given);
}

TEST(JobTest, AStageMayHaveReplicas) {
  const JobSpec j = parseJobSpec(
      "model: m.yaml\npartition: [[0, 2], {layers: [2, 4], replicas: 3}, [4, 6]]\n", "j.yaml");
  ASSERT_EQ(j.ranges.size(), 3u);
  EXPECT_EQ(j.ranges[0].layers, (LayerRange{0, 2}));
  EXPECT_EQ(j.ranges[1].layers, (LayerRange{2, 4}));
  EXPECT_EQ(j.ranges[2].layers, (LayerRange{4, 6}));
  EXPECT_EQ(j.ranges[0].replicas, 1);
  EXPECT_EQ(j.ranges[1].replicas, 3);
  EXPECT_EQ(j.ranges[2].replicas, 1);
  EXPECT_EQ(j.ranges[1].where, "j.yaml:2:30");  // its layers
}

TEST(JobTest, AStageMaySplitOverTensorRanks) {
  const JobSpec j = parseJobSpec(
      "model: m.yaml\npartition: [[0, 2], {layers: [2, 4], tensor: 3, tensor_shares: [1, 2, 1]}]\n",
      "j.yaml");
  ASSERT_EQ(j.ranges.size(), 2u);
  EXPECT_EQ(j.ranges[0].tensor, 1);
  EXPECT_TRUE(j.ranges[0].tensor_shares.empty());
  EXPECT_EQ(j.ranges[1].tensor, 3);
  EXPECT_EQ(j.ranges[1].tensor_shares, (std::vector<double>{1, 2, 1}));
  EXPECT_EQ(j.ranges[1].replicas, 1);
  EXPECT_TRUE(j.ranges[1].tensor_devices.empty());
  const JobSpec on = parseJobSpec(
      "model: m.yaml\npartition: [{layers: [0, 4], tensor: [cpu, opencl:0]}]\n", "j.yaml");
  EXPECT_EQ(on.ranges[0].tensor, 2);
  EXPECT_EQ(on.ranges[0].tensor_devices, (std::vector<std::string>{"cpu", "opencl:0"}));
}

TEST(JobTest, RangesMustCoverTheModelOnceInOrder) {
  const Model m(parseModelSpec(
      "input: [4]\nlayers:\n  - linear: {out: 4}\n  - relu\n  - linear: {out: 4}\n  - relu\n"));
  auto ranges = [&](const std::string& partition) {
    return stageRanges(parseJobSpec("model: m.yaml\npartition: " + partition + "\n", "j.yaml"), m);
  };
  EXPECT_EQ(ranges("[[0, 1], [1, 4]]"), (std::vector<LayerRange>{{0, 1}, {1, 4}}));
  expectThrowWith<InvalidArgument>([&] { ranges("[[0, 2], [1, 4]]"); },
                                   {"j.yaml:2:21", "stage 1's layers [1, 4) overlap", "end at 2"});
  expectThrowWith<InvalidArgument>([&] { ranges("[[0, 1], [2, 4]]"); },
                                   {"j.yaml:2:21", "leave layers [1, 2) on no stage"});
  expectThrowWith<InvalidArgument>([&] { ranges("[[0, 2], [2, 5]]"); },
                                   {"j.yaml:2:21", "go past the model's 4 layers"});
  expectThrowWith<InvalidArgument>([&] { ranges("[[0, 2], [2, 3]]"); },
                                   {"end at layer 3", "the rest are on no stage"});
  const JobSpec equal = parseJobSpec("model: m.yaml\npartition: equal\nstages: 3\n", "j.yaml");
  EXPECT_EQ(stageRanges(equal, m), (std::vector<LayerRange>{{0, 2}, {2, 3}, {3, 4}}));
  const JobSpec too_many = parseJobSpec("model: m.yaml\npartition: equal\nstages: 5\n", "j.yaml");
  expectThrowWith<InvalidArgument>([&] { stageRanges(too_many, m); },
                                   {"5 stages for a model of 4 layers"});
}

// Interleaved: the partition's ranges (equal ones cut stages x chunks) go to the stages in
// turn, stage s holding ranges s, s + stages, ...; the first and the last stage are
// linked both ways (the ring the chunks go round), and each worker is told its chunks.
// `zero:` reaches every worker's train settings; its stage is 0 to 2 (3 is refused,
// naming why), and a job whose stages have no replicas to shard over is refused naming
// the key. Stage 1 prices each replica's share of the optimizer state.
TEST(JobTest, ZeroShardsTheReplicatedStagesState) {
  const Model m(
      parseModelSpec("input: [4]\nlayers:\n  - linear: {out: 64}\n  - relu\n  - linear: {out: 64}\n"
                     "  - relu\n  - linear: {out: 2}\n"));
  const char* replicated =
      "model: m.yaml\npartition: [[0, 2], {layers: [2, 5], replicas: 2}]\n"
      "optimizer: {kind: adamw}\nzero: ";
  const JobSpec plain = parseJobSpec(std::string(replicated) + "0\n", "j.yaml");
  const JobSpec two = parseJobSpec(std::string(replicated) + "2\n", "j.yaml");
  EXPECT_EQ(two.train.zero, 2);
  const std::vector<StagePlacement> stages = jobStages(two, m);
  const std::vector<Assign> as = jobAssignments(two, stages, RunMode::kTrain, false, "spec", "", 0);
  ASSERT_EQ(as.size(), 3u);
  for (const Assign& a : as) EXPECT_EQ(a.train.zero, 2) << "stage " << a.stage;
  const JobSpec one = parseJobSpec(std::string(replicated) + "1\n", "j.yaml");
  const int64_t whole = stageMemory(plain, m, jobStages(plain, m), RunMode::kTrain)[1];
  const int64_t sharded = stageMemory(one, m, jobStages(one, m), RunMode::kTrain)[1];
  // Stage 1's layers hold 64 * 64 + 64 + 64 * 2 + 2 parameters; AdamW's two slots each.
  EXPECT_EQ(whole - sharded, (64 * 64 + 64 + 64 * 2 + 2) * 4 * 2 / 2);
  expectThrowWith<InvalidArgument>(
      [&] { parseJobSpec(std::string(replicated) + "3\n", "j.yaml"); },
      {"j.yaml:4:7", "'zero: 3' would gather a stage's parameters for every microbatch",
       "tandem train --replicas N --zero 3"});
  expectThrowWith<InvalidArgument>([&] { parseJobSpec(std::string(replicated) + "5\n", "j.yaml"); },
                                   {"j.yaml:4:7", "'zero' must be 0, 1 or 2, not 5"});
  expectThrowWith<InvalidArgument>(
      [&] { parseJobSpec(std::string(replicated) + "one\n", "j.yaml"); }, {"j.yaml:4:7", "zero"});
  const JobSpec alone =
      parseJobSpec("model: m.yaml\npartition: equal\nstages: 2\nzero: 1\n", "j.yaml");
  expectThrowWith<InvalidArgument>(
      [&] { jobStages(alone, m); },
      {"j.yaml:4:7", "'zero: 1' shards the training state over a stage's replicas",
       "no stage has replicas"});
}

TEST(JobTest, InterleavedStagesHoldEveryStagesthRange) {
  const Model m(parseModelSpec(
      "input: [4]\nlayers:\n  - linear: {out: 4}\n  - relu\n  - linear: {out: 4}\n  - relu\n"
      "  - linear: {out: 4}\n  - relu\n  - linear: {out: 2}\n"));
  const JobSpec equal = parseJobSpec(
      "model: m.yaml\npartition: equal\nstages: 2\nschedule: interleaved\nmicrobatches: 2\n",
      "j.yaml");
  EXPECT_EQ(equal.chunks, 2);
  EXPECT_EQ(equal.stages, 2);
  const std::vector<StagePlacement> stages = jobStages(equal, m);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].slice.chunks, (std::vector<LayerRange>{{0, 2}, {4, 6}}));
  EXPECT_EQ(stages[1].slice.chunks, (std::vector<LayerRange>{{2, 4}, {6, 7}}));
  EXPECT_EQ(stages[1].slice.layers.begin, 2u);
  EXPECT_EQ(stages[1].slice.layers.end, 7u);
  const std::vector<Assign> as =
      jobAssignments(equal, stages, RunMode::kTrain, false, "spec", "", 0);
  ASSERT_EQ(as.size(), 2u);
  EXPECT_EQ(as[0].prev_replicas, 1);
  EXPECT_EQ(as[0].next_replicas, 1);
  EXPECT_EQ(as[1].prev_replicas, 1);
  EXPECT_EQ(as[1].next_replicas, 1);
  EXPECT_EQ(as[1].slice.chunks, stages[1].slice.chunks);
  EXPECT_EQ(as[0].train.schedule, ScheduleKind::kInterleaved1F1B);
  // Each stage's memory counts every chunk's weights.
  const std::vector<int64_t> bytes = stageMemory(equal, m, stages, RunMode::kTrain);
  EXPECT_GT(bytes[0], 4 * 4 * (m.paramCount(0, 2) + m.paramCount(4, 6)) - 1);
  const JobSpec ranges = parseJobSpec(
      "model: m.yaml\npartition: [[0, 1], [1, 2], [2, 3], [3, 5], [5, 6], [6, 7]]\n"
      "schedule: interleaved\nchunks: 3\n",
      "j.yaml");
  EXPECT_EQ(ranges.stages, 2);
  const std::vector<StagePlacement> three = jobStages(ranges, m);
  EXPECT_EQ(three[0].slice.chunks, (std::vector<LayerRange>{{0, 1}, {2, 3}, {5, 6}}));
  EXPECT_EQ(three[1].slice.chunks, (std::vector<LayerRange>{{1, 2}, {3, 5}, {6, 7}}));
  const JobSpec too_many =
      parseJobSpec("model: m.yaml\npartition: equal\nstages: 4\nschedule: interleaved\n", "j.yaml");
  expectThrowWith<InvalidArgument>([&] { stageRanges(too_many, m); },
                                   {"4 stages of 2 chunks for a model of 7 layers"});
}

// An interleaved plan (partition: auto) lists its stages' chunks in layer order, chunk k
// on stage k % p's devices: each stage gets its chunks, and its predicted compute is
// theirs summed; a chunk on another device, or chunks that make fewer than 2 stages, are
// refused naming the plan.
TEST(JobTest, AnInterleavedPlansChunksGoToTheirStages) {
  const Model m(parseModelSpec(
      "input: [4]\nlayers:\n  - linear: {out: 4}\n  - relu\n  - linear: {out: 4}\n  - relu\n"
      "  - linear: {out: 4}\n  - relu\n  - linear: {out: 2}\n"));
  JobSpec job = parseJobSpec(
      "model: m.yaml\npartition: auto\ncluster: c.yaml\nschedule: interleaved\nmicrobatches: 2\n",
      "j.yaml");
  EXPECT_EQ(job.chunks, 2);
  auto spec = [](size_t b, size_t e, const char* device, double compute) {
    partitioner::PlanStageSpec s;
    s.begin = b;
    s.end = e;
    s.devices = {device};
    s.backend = "cpu";
    s.compute_s = compute;
    s.where = "the auto plan";
    return s;
  };
  std::vector<partitioner::PlanStageSpec> plan = {spec(0, 3, "a/cpu", 1), spec(3, 4, "b/cpu", 2),
                                                  spec(4, 6, "a/cpu", 3), spec(6, 7, "b/cpu", 4)};
  const std::vector<StagePlacement> stages = jobStages(job, m, &plan);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].slice.chunks, (std::vector<LayerRange>{{0, 3}, {4, 6}}));
  EXPECT_EQ(stages[1].slice.chunks, (std::vector<LayerRange>{{3, 4}, {6, 7}}));
  EXPECT_EQ(stages[1].slice.layers.begin, 3u);
  EXPECT_EQ(stages[1].slice.layers.end, 7u);
  EXPECT_EQ(stages[0].replica_devices, std::vector<std::string>{"a/cpu"});
  EXPECT_DOUBLE_EQ(stages[0].predicted_compute_s, 4);
  EXPECT_DOUBLE_EQ(stages[1].predicted_compute_s, 6);
  // Each link's codecs (codec: auto): stage 0's to stage 1 from chunk 0's, and the ring's
  // from the last stage to the first from chunk 1's; every chunk crossing a link uses them.
  JobSpec coded = job;
  coded.activations_auto = coded.gradients_auto = true;
  std::vector<partitioner::PlanStageSpec> ring = plan;
  ring[0].activation_codec = "int8";
  ring[0].gradient_codec = "fp32";
  ring[1].activation_codec = "bf16";
  ring[1].gradient_codec = "fp16";
  const std::vector<Assign> as =
      jobAssignments(coded, jobStages(coded, m, &ring), RunMode::kTrain, false, "spec", "", 0);
  ASSERT_EQ(as.size(), 2u);
  EXPECT_EQ(as[0].wire.activations, WireCodec::kI8);    // 0 -> 1
  EXPECT_EQ(as[1].wire.gradients, WireCodec::kRaw);     // 1 -> 0, back
  EXPECT_EQ(as[1].wire.activations, WireCodec::kBF16);  // 1 -> 0, the ring
  EXPECT_EQ(as[0].wire.gradients, WireCodec::kF16);     // 0 -> 1, the ring's back
  plan[3].devices = {"c/cpu"};
  expectThrowWith<InvalidArgument>([&] { jobStages(job, m, &plan); },
                                   {"the auto plan: chunk 3 is not on stage 1's devices"});
  plan = {spec(0, 3, "a/cpu", 1), spec(3, 7, "b/cpu", 2)};
  expectThrowWith<InvalidArgument>([&] { jobStages(job, m, &plan); },
                                   {"2 ranges are not 2 chunks for each of 2 stages or more"});
}

}  // namespace
}  // namespace tandem::runtime
