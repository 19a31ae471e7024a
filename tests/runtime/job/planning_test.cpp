// A plan's per-link codecs reach the workers: stage s sends its activations in link s's
// activation codec, and its gradients back in link s-1's gradient codec; a direction the
// job fixes is the job's on every link.
#include "runtime/job/planning.h"

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "partitioner/search.h"
#include "runtime/control/files.h"
#include "runtime/job/job.h"
#include "runtime/node/node_profile.h"
#include "tests/test_util.h"

namespace tandem::runtime {
namespace {

const char* kSpec = "input: [4]\nlayers:\n  - linear: {out: 4}\n  - relu\n  - linear: {out: 4}\n";

// Three stages on three nodes: int8 activations and fp16 gradients on the first link, the
// second link as the job says.
const char* kPlan =
    "stages:\n"
    "  - {layers: [0, 1], devices: [a/cpu], backend: cpu,\n"
    "     codec: {activations: int8, gradients: fp16}}\n"
    "  - {layers: [1, 2], devices: [b/cpu, c/cpu], backend: cpu}\n"
    "  - {layers: [2, 3], devices: [d/cpu], backend: cpu}\n";

// Each worker's (stage, activation codec, gradient codec).
std::vector<std::tuple<int, std::string, std::string>> codecs(const std::string& codec_line) {
  const JobSpec job = parseJobSpec("model: m.yaml\npartition: p.yaml\n" + codec_line, "j.yaml");
  const Model model(parseModelSpec(kSpec));
  const std::vector<partitioner::PlanStageSpec> planned = partitioner::parsePlan(kPlan, "p.yaml");
  const auto stages = jobStages(job, model, &planned);
  EXPECT_EQ(stages[0].next_activation_codec, WireCodec::kI8);
  EXPECT_EQ(stages[0].next_gradient_codec, WireCodec::kF16);
  EXPECT_FALSE(stages[1].next_activation_codec.has_value());
  std::vector<std::tuple<int, std::string, std::string>> out;
  for (const Assign& a : jobAssignments(job, stages, RunMode::kTrain, false, kSpec, "", 0))
    out.emplace_back(a.stage, wireCodecName(a.wire.activations), wireCodecName(a.wire.gradients));
  return out;
}

using Codecs = std::vector<std::tuple<int, std::string, std::string>>;

// A node's devices are profiled each alone (load 0), once per backend and thread count:
// what co-located stages cost each other is the step simulation's to price from their
// busy share (a profile taken with the other CPU stages training beside it all the time
// had predicted the main job's step at 1.8x what it ran).
TEST(PlanningTest, ANodesDevicesAreProfiledAloneOncePerBackendAndThreads) {
  partitioner::ClusterNode node;
  node.name = "local";
  for (const auto& [name, backend, threads] :
       std::vector<std::tuple<std::string, std::string, int>>{
           {"cpu0", "cpu", 1}, {"cpu1", "cpu", 1}, {"cpu2", "cpu", 2}, {"gpu", "opencl:0", 1}}) {
    partitioner::ClusterDevice d;
    d.name = name;
    d.backend = backend;
    d.threads = threads;
    node.devices.push_back(d);
  }
  const ProfileTask all = nodeProfileTask(node, kSpec, 16, [](const auto&) { return true; });
  EXPECT_EQ(all.batch, 16);
  EXPECT_EQ(all.devices,
            (std::vector<ProfileDevice>{{"cpu", 1, 0}, {"cpu", 2, 0}, {"opencl:0", 1, 0}}));
  const ProfileTask some = nodeProfileTask(
      node, kSpec, 16, [](const partitioner::ClusterDevice& d) { return d.name == "cpu2"; });
  EXPECT_EQ(some.devices, (std::vector<ProfileDevice>{{"cpu", 2, 0}}));
}

TEST(PlanningTest, EachLinkCarriesThePlansCodecs) {
  // Stage 0 sends int8 activations; both replicas of stage 1 send fp16 gradients back to it
  // and fp32 activations on; stage 2 sends fp32 gradients back.
  const Codecs planned = {
      {0, "int8", "fp32"}, {1, "fp32", "fp16"}, {1, "fp32", "fp16"}, {2, "fp32", "fp32"}};
  EXPECT_EQ(codecs(""), planned);
  EXPECT_EQ(codecs("codec: {activations: auto, gradients: auto}\n"), planned);
}

TEST(PlanningTest, ADirectionTheJobFixesIsItsOnEveryLink) {
  EXPECT_EQ(
      codecs("codec: {activations: bf16}\n"),
      (Codecs{{0, "bf16", "fp32"}, {1, "bf16", "fp16"}, {1, "bf16", "fp16"}, {2, "bf16", "fp32"}}));
  EXPECT_EQ(
      codecs("codec: {activations: auto, gradients: fp32}\n"),
      (Codecs{{0, "int8", "fp32"}, {1, "fp32", "fp32"}, {1, "fp32", "fp32"}, {2, "fp32", "fp32"}}));
}

// Unequal replicas, from a plan or the job's ranges: every worker cuts its batches by the
// stage's shares; two stages with shares, or another replicated stage whose replica count
// differs, are refused (microbatch g goes to replica g mod R of every replicated stage).
TEST(PlanningTest, UnequalReplicasSharesReachEveryWorker) {
  const Model model(parseModelSpec(kSpec));
  const char* plan =
      "stages:\n"
      "  - {layers: [0, 3], devices: [fast/cpu, slow/cpu], backend: cpu, shares: [1, 0.25]}\n";
  const std::vector<partitioner::PlanStageSpec> planned = partitioner::parsePlan(plan, "p.yaml");
  const JobSpec job = parseJobSpec("model: m.yaml\npartition: p.yaml\n", "j.yaml");
  const auto stages = jobStages(job, model, &planned);
  ASSERT_EQ(stages.size(), 1u);
  EXPECT_EQ(stages[0].replicas, 2);
  EXPECT_EQ(stages[0].replica_devices, (std::vector<std::string>{"fast/cpu", "slow/cpu"}));
  // The whole model's replicas rebalance their shares (the job's default steps)...
  for (const Assign& a : jobAssignments(job, stages, RunMode::kTrain, false, kSpec, "", 0)) {
    EXPECT_EQ(a.train.microbatch_shares, (std::vector<double>{1, 0.25}));
    EXPECT_EQ(a.train.rebalance_steps, kDefaultRebalanceSteps);
  }
  const JobSpec fixed =
      parseJobSpec("model: m.yaml\npartition: p.yaml\nrebalance_steps: 0\n", "j.yaml");
  for (const Assign& a : jobAssignments(fixed, stages, RunMode::kTrain, false, kSpec, "", 0))
    EXPECT_EQ(a.train.rebalance_steps, 0);
  const JobSpec ranged = parseJobSpec(
      "model: m.yaml\npartition: [[0, 1], {layers: [1, 3], replicas: 2, shares: [3, 1]}]\n",
      "j.yaml");
  const auto ranged_stages = jobStages(ranged, model);
  const std::vector<Assign> assigned =
      jobAssignments(ranged, ranged_stages, RunMode::kTrain, false, kSpec, "", 0);
  ASSERT_EQ(assigned.size(), 3u);
  for (const Assign& a : assigned) {
    EXPECT_EQ(a.train.microbatch_shares, (std::vector<double>{3, 1}));
    EXPECT_EQ(a.train.rebalance_steps, 0) << "...a replicated stage of a pipeline does not";
  }
  // Equal replicas cut equally.
  const JobSpec equal =
      parseJobSpec("model: m.yaml\npartition: [[0, 1], {layers: [1, 3], replicas: 2}]\n", "j.yaml");
  for (const Assign& a :
       jobAssignments(equal, jobStages(equal, model), RunMode::kTrain, false, kSpec, "", 0))
    EXPECT_TRUE(a.train.microbatch_shares.empty());
  const JobSpec three = parseJobSpec(
      "model: m.yaml\npartition: [{layers: [0, 1], replicas: 3}, "
      "{layers: [1, 3], replicas: 2, shares: [3, 1]}]\n",
      "j.yaml");
  testing::expectThrowWith<InvalidArgument>(
      [&] { microbatchShares(jobStages(three, model)); },
      {"stage 0 has 3 replicas, and stage 1 shares the work among 2 unequal ones"});
  const JobSpec both = parseJobSpec(
      "model: m.yaml\npartition: [{layers: [0, 1], replicas: 2, shares: [1, 1]}, "
      "{layers: [1, 3], replicas: 2, shares: [3, 1]}]\n",
      "j.yaml");
  testing::expectThrowWith<InvalidArgument>([&] { microbatchShares(jobStages(both, model)); },
                                            {"stages 0 and 1 both give their replicas shares"});
}

// A sharded stage's replicas get room for their shards in proportion to the memory their
// devices declare in the cluster file (relative to the largest); equal where one declares
// none; an unsharded job's, or a stage without replicas, none.
TEST(PlanningTest, ShardedReplicasRoomFollowsTheirDevicesMemory) {
  const Model model(parseModelSpec(kSpec));
  partitioner::Cluster cluster;
  for (const auto& [name, memory] : {std::pair<const char*, int64_t>{"big", int64_t{6} << 30},
                                     {"small", int64_t{2} << 30},
                                     {"unknown", 0}}) {
    partitioner::ClusterNode node;
    node.name = name;
    partitioner::ClusterDevice cpu;
    cpu.memory_bytes = memory;
    node.devices.push_back(cpu);
    cluster.nodes.push_back(node);
  }
  const JobSpec job = parseJobSpec(
      "model: m.yaml\npartition: [[0, 1], {layers: [1, 3], replicas: 2}]\nzero: 1\n", "j.yaml");
  std::vector<Assign> as =
      jobAssignments(job, jobStages(job, model), RunMode::kTrain, false, kSpec, "", 0);
  ASSERT_EQ(as.size(), 3u);
  shardStateByMemory(as, cluster, {2, 0, 1});  // stage 1's replicas on big and small
  EXPECT_TRUE(as[0].train.state_shares.empty()) << "stage 0 has no replicas";
  for (size_t i = 1; i < 3; ++i)
    EXPECT_EQ(as[i].train.state_shares, (std::vector<double>{1.0, 1.0 / 3})) << "slot " << i;
  shardStateByMemory(as, cluster, {0, 0, 2});  // one replica's device declares no memory
  for (size_t i = 1; i < 3; ++i) EXPECT_TRUE(as[i].train.state_shares.empty()) << "slot " << i;
  const JobSpec plain =
      parseJobSpec("model: m.yaml\npartition: [[0, 1], {layers: [1, 3], replicas: 2}]\n", "j.yaml");
  std::vector<Assign> unsharded =
      jobAssignments(plain, jobStages(plain, model), RunMode::kTrain, false, kSpec, "", 0);
  shardStateByMemory(unsharded, cluster, {2, 0, 1});
  for (const Assign& a : unsharded) EXPECT_TRUE(a.train.state_shares.empty());
  // What each replica is checked to hold: the stage's figure, priced with equal parts of
  // its 600 bytes of state, with its own part instead (3 : 1 of 600).
  EXPECT_EQ(replicaMemory(1000, 600, {3, 1}, 0), 1000 - 300 + 450);
  EXPECT_EQ(replicaMemory(1000, 600, {3, 1}, 1), 1000 - 300 + 150);
  EXPECT_EQ(replicaMemory(1000, 600, {}, 1), 1000);
}

// A stage's tensor ranks reach its worker; a range that does not split that many ways is
// refused before anything starts, naming the job file's line and why.
// Each worker is sent its stage's part of the starting weights: a stage's replicas one part
// between them, a worker of every layer the file itself, each named by its hash and size.
TEST(PlanningTest, EachWorkerStartsFromItsStagesPartOfTheWeights) {
  cpu::CpuBackend be;
  Model model(parseModelSpec(kSpec));
  model.build(be, 3);
  const auto whole =
      std::make_shared<const std::vector<uint8_t>>(serializeModel(model, nullptr, {}));
  const JobSpec job =
      parseJobSpec("model: m.yaml\npartition: [[0, 1], {layers: [1, 3], replicas: 2}]\n", "j.yaml");
  std::vector<Assign> assigned =
      jobAssignments(job, jobStages(job, model), RunMode::kTrain, false, kSpec, "", 0);
  const auto files = stageWeights(assigned, whole, model.size());
  ASSERT_EQ(assigned.size(), 3u);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(assigned[1].weights_hash, assigned[2].weights_hash);
  EXPECT_NE(assigned[0].weights_hash, assigned[1].weights_hash);
  for (const Assign& a : assigned) {
    const std::vector<uint8_t>& part = *files.at(a.weights_hash);
    EXPECT_EQ(contentHash(part), a.weights_hash);
    EXPECT_EQ(a.weights_bytes, static_cast<int64_t>(part.size()));
    std::vector<std::string> names;
    for (const HostTensor& t : parseModelFile(part, "part").params) names.push_back(t.name);
    const std::vector<std::string> want = a.stage == 0
                                              ? std::vector<std::string>{"0.weight", "0.bias"}
                                              : std::vector<std::string>{"2.weight", "2.bias"};
    EXPECT_EQ(names, want) << "stage " << a.stage;
  }
  const JobSpec replicas =
      parseJobSpec("model: m.yaml\npartition: [{layers: [0, 3], replicas: 2}]\n", "j.yaml");
  assigned =
      jobAssignments(replicas, jobStages(replicas, model), RunMode::kTrain, false, kSpec, "", 0);
  const auto same = stageWeights(assigned, whole, model.size());
  ASSERT_EQ(same.size(), 1u);
  EXPECT_EQ(same.begin()->second, whole);
  for (const Assign& a : assigned) EXPECT_EQ(a.weights_hash, contentHash(*whole));
}

TEST(PlanningTest, TensorRanksReachTheWorkerOrAreRefusedNamingTheRange) {
  const Model model(parseModelSpec(kSpec));  // linear 4, relu, linear 4
  const JobSpec job = parseJobSpec(
      "model: m.yaml\npartition: [{layers: [0, 3], tensor: 2, tensor_shares: [3, 1]}]\n", "j.yaml");
  const std::vector<Assign> assigned =
      jobAssignments(job, jobStages(job, model), RunMode::kTrain, false, kSpec, "", 0);
  ASSERT_EQ(assigned.size(), 1u);
  EXPECT_EQ(assigned[0].slice.tensor, 2);
  EXPECT_EQ(assigned[0].slice.tensor_shares, (std::vector<double>{3, 1}));
  EXPECT_TRUE(assigned[0].slice.tensor_devices.empty());
  EXPECT_EQ(assigned[0].slice.device, "cpu");
  // Named backends: rank 0's is the stage's device.
  const JobSpec named = parseJobSpec(
      "model: m.yaml\npartition: [{layers: [0, 3], tensor: [opencl:0, cpu]}]\n", "j.yaml");
  const std::vector<Assign> on =
      jobAssignments(named, jobStages(named, model), RunMode::kTrain, false, kSpec, "", 0);
  EXPECT_EQ(on.at(0).slice.device, "opencl:0");
  EXPECT_EQ(on.at(0).slice.tensor_devices, (std::vector<std::string>{"opencl:0", "cpu"}));
  EXPECT_EQ(on.at(0).slice.tensor, 2);
  const JobSpec alone =
      parseJobSpec("model: m.yaml\npartition: [{layers: [0, 2], tensor: 2}, [2, 3]]\n", "j.yaml");
  testing::expectThrowWith<InvalidArgument>(
      [&] { jobStages(alone, model); },
      {"j.yaml:2:22", "cannot split over 2 tensor ranks", "layers [0, 2) hold no pair"});
  const JobSpec many =
      parseJobSpec("model: m.yaml\npartition: [{layers: [0, 3], tensor: 5}]\n", "j.yaml");
  testing::expectThrowWith<InvalidArgument>(
      [&] { jobStages(many, model); },
      {"j.yaml:2:22", "cannot split over 5 tensor ranks", "fewer than the 5 ranks"});
}

// A plan's tensor-split stage (`tensor: true`, partitioner::Assignment::tensor) is one worker
// whose ranks are the plan's devices, each on its backend; its node is the devices'. A
// split the model cannot make, or ranks on two nodes, are refused naming the plan's line.
TEST(PlanningTest, APlansTensorSplitStageIsOneWorkerOverItsRanks) {
  const Model model(parseModelSpec(kSpec));
  const JobSpec job = parseJobSpec("model: m.yaml\npartition: p.yaml\n", "j.yaml");
  const std::vector<partitioner::PlanStageSpec> planned = partitioner::parsePlan(
      "stages:\n"
      "  - {layers: [0, 3], devices: [a/cpu0, a/gpu], backend: cpu, backends: [cpu, opencl:0],\n"
      "     tensor: true, shares: [1, 3], compute_s: 0.004, update_s: 0.002}\n",
      "p.yaml");
  const auto stages = jobStages(job, model, &planned);
  ASSERT_EQ(stages.size(), 1u);
  EXPECT_EQ(stages[0].replicas, 1);
  EXPECT_EQ(stages[0].slice.tensor, 2);
  EXPECT_EQ(stages[0].slice.tensor_devices, (std::vector<std::string>{"cpu", "opencl:0"}));
  EXPECT_EQ(stages[0].slice.tensor_shares, (std::vector<double>{1, 3}));
  EXPECT_TRUE(stages[0].shares.empty());  // not replicas' shares
  EXPECT_EQ(stages[0].replica_devices, (std::vector<std::string>{"a/cpu0"}));
  // The compute per microbatch, without the update spread over the job's 4 microbatches.
  EXPECT_NEAR(stages[0].predicted_compute_s, 0.004 - 0.002 / 4, 1e-12);
  const std::vector<Assign> assigned =
      jobAssignments(job, stages, RunMode::kTrain, false, kSpec, "", 0);
  ASSERT_EQ(assigned.size(), 1u);
  EXPECT_EQ(assigned[0].slice.tensor, 2);
  const std::vector<partitioner::PlanStageSpec> split_nodes = partitioner::parsePlan(
      "stages:\n  - {layers: [0, 3], devices: [a/cpu, b/cpu], backend: cpu, tensor: true}\n",
      "p.yaml");
  testing::expectThrowWith<InvalidArgument>([&] { jobStages(job, model, &split_nodes); },
                                            {"p.yaml:2:5", "ranks are on one node"});
  const std::vector<partitioner::PlanStageSpec> no_pair = partitioner::parsePlan(
      "stages:\n  - {layers: [0, 2], devices: [a/cpu, a/cpu1], backend: cpu, tensor: true}\n"
      "  - {layers: [2, 3], devices: [a/cpu2], backend: cpu}\n",
      "p.yaml");
  testing::expectThrowWith<InvalidArgument>(
      [&] { jobStages(job, model, &no_pair); },
      {"p.yaml:2:5", "cannot split over 2 tensor ranks", "hold no pair"});
}

// `schedule: auto` takes interleaved stages only when they are predicted faster than the
// best other plan by more than the selection margin (15%).
TEST(PlanningTest, InterleavedStagesMustBeatTheOthersByTheSelectionMargin) {
  EXPECT_FALSE(prefersInterleaved(1000, 1000));
  EXPECT_FALSE(prefersInterleaved(1100, 1000));
  EXPECT_FALSE(prefersInterleaved(1000 * (1 + partitioner::kSelectionMargin), 1000));
  EXPECT_TRUE(prefersInterleaved(1000 * (1 + partitioner::kSelectionMargin) + 1, 1000));
  EXPECT_FALSE(prefersInterleaved(900, 1000));
}

}  // namespace
}  // namespace tandem::runtime
