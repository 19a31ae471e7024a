// Cluster files and plan files: what they hold, and errors that name the line at fault.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "core/model_spec.h"
#include "partitioner/cluster.h"
#include "partitioner/plan.h"
#include "partitioner/random_problem.h"
#include "partitioner/search.h"
#include "tests/test_util.h"

namespace tandem::partitioner {
namespace {

using tandem::testing::expectThrowWith;

constexpr const char* kCluster = R"(nodes:
  - name: edge
    devices:
      - {name: cpu, backend: cpu, threads: 2, memory: 1GiB}
  - name: cloud
    devices:
      - {name: gpu, backend: opencl:0, memory: 8 GB}
      - {name: cpu, backend: cpu}
links:
  local: {bandwidth: 5GB/s, latency: 20us}
  default: {bandwidth: 1Gbit/s, latency: 1ms}
  between:
    - {from: edge, to: cloud, bandwidth: 100Mbit/s, latency: 20ms}
)";

Profile profileFor(const Model& model, const std::vector<std::string>& devices) {
  Profile p;
  p.model = model.name();
  p.batch = 4;
  for (const std::string& name : devices) {
    DeviceProfile d;
    d.device.name = name;
    d.device.memory_bytes = int64_t{4} << 30;
    for (size_t l = 0; l < model.size(); ++l) {
      LayerProfile lp;
      lp.index = static_cast<int64_t>(l);
      lp.type = model.layer(l).type();
      lp.forward = {1e-3 * static_cast<double>(l + 1), 0, 0, 1};
      lp.backward = {2e-3, 0, 0, 1};
      d.layers.push_back(lp);
    }
    p.devices.push_back(d);
  }
  return p;
}

TEST(ClusterTest, ParsesNodesDevicesAndLinksWithUnits) {
  const Cluster c = parseCluster(kCluster, "c.yaml");
  ASSERT_EQ(c.nodes.size(), 2u);
  EXPECT_EQ(c.nodes[0].devices[0].threads, 2);
  EXPECT_EQ(c.nodes[0].devices[0].memory_bytes, int64_t{1} << 30);
  EXPECT_EQ(c.nodes[1].devices[0].memory_bytes, 8000000000);
  EXPECT_EQ(c.nodes[1].devices[0].profile_device, "opencl:0");
  EXPECT_DOUBLE_EQ(c.local->bandwidth, 5e9);
  EXPECT_DOUBLE_EQ(c.local->latency_s, 20e-6);
  EXPECT_DOUBLE_EQ(c.fallback->bandwidth, 1.25e8);
  ASSERT_EQ(c.between.size(), 1u);
  EXPECT_DOUBLE_EQ(c.between[0].link.bandwidth, 12.5e6);
  EXPECT_DOUBLE_EQ(c.between[0].link.latency_s, 0.02);
}

TEST(ClusterTest, MakeProblemScalesTimesToTheMicrobatchAndFillsTheLinkMatrix) {
  const Model model(parseModelSpec(tandem::testing::kTinyNet));
  const Cluster c = parseCluster(kCluster, "c.yaml");
  const std::map<std::string, Profile> profiles = {
      {"p.json", profileFor(model, {"cpu", "opencl:0"})}};
  CostOptions o;
  o.microbatch_size = 8;  // twice the profile's batch
  const Problem p = makeProblem(model, c, profiles, "p.json", o);
  ASSERT_EQ(p.devices.size(), 3u);
  EXPECT_EQ(p.devices[0].name, "edge/cpu");
  EXPECT_EQ(p.devices[1].name, "cloud/gpu");
  EXPECT_EQ(p.devices[1].backend, "opencl:0");
  EXPECT_EQ(p.devices[0].memory_bytes, int64_t{1} << 30);
  EXPECT_EQ(p.devices[2].memory_bytes, int64_t{4} << 30);  // the profile's
  EXPECT_DOUBLE_EQ(p.devices[0].forward_s[1], 2 * 2e-3);
  EXPECT_DOUBLE_EQ(p.devices[1].forward_s[1], 2 * 2e-3);
  EXPECT_DOUBLE_EQ(p.links[0][1].bandwidth, 12.5e6);
  EXPECT_DOUBLE_EQ(p.links[1][1].bandwidth, 5e9);
  EXPECT_EQ(p.layers.size(), model.size());
  EXPECT_EQ(p.input_bytes, model.inputShape().numel() * 4 * 8);
  // A plan over it covers the model.
  const CostModel cost(p);
  EXPECT_EQ(bestPlan(cost).stages.back().at.end, model.size());

  expectThrowWith<InvalidArgument>(
      [&] {
        makeProblem(model, c, {{"p.json", profileFor(model, {"cpu"})}}, "p.json", o);
      },
      {"c.yaml:7:9", "has no device 'opencl:0'"});
  Profile other = profileFor(model, {"cpu", "opencl:0"});
  other.model = "resnet";
  expectThrowWith<InvalidArgument>(
      [&] {
        makeProblem(model, c, {{"p.json", other}}, "p.json", o);
      },
      {"profiles model 'resnet'"});
  const Cluster no_links =
      parseCluster("nodes: [{name: a, devices: [{backend: cpu}]}]\n", "n.yaml");
  expectThrowWith<InvalidArgument>([&] { makeProblem(model, no_links, profiles, "p.json", o); },
                                   {"no link within node 'a'", "links.local"});
}

// A daemon measures a fast device at the microbatch and a slow one at a smaller batch:
// each device's times scale from the batch it was measured at, not the profile's.
TEST(ClusterTest, ADeviceMeasuredAtItsOwnBatchScalesFromIt) {
  const Model model(parseModelSpec(tandem::testing::kTinyNet));
  const Cluster c = parseCluster(kCluster, "c.yaml");
  Profile prof = profileFor(model, {"cpu", "opencl:0"});
  prof.devices[1].batch = 16;  // the GPU at 16, the CPU at the profile's 4
  CostOptions o;
  o.microbatch_size = 16;
  const Problem p = makeProblem(model, c, {{"p.json", prof}}, "p.json", o);
  EXPECT_DOUBLE_EQ(p.devices[0].forward_s[1], 4 * 2e-3);
  EXPECT_DOUBLE_EQ(p.devices[1].forward_s[1], 2e-3);
  EXPECT_DOUBLE_EQ(p.devices[1].backward_s[0], 2e-3);
  o.microbatch_size = 8;
  EXPECT_DOUBLE_EQ(makeProblem(model, c, {{"p.json", prof}}, "p.json", o).devices[1].forward_s[1],
                   1e-3);
}

TEST(ClusterTest, ADeviceIsPricedAtWhatItSustains) {
  const Model model(parseModelSpec(tandem::testing::kTinyNet));
  const Cluster c = parseCluster(kCluster, "c.yaml");
  Profile quota = profileFor(model, {"cpu", "opencl:0"});
  // The cpu under a quarter-core quota: passes back to back took 4.5x the layers' medians.
  Sustained& su = quota.devices[0].sustained;
  su.burst_pass_s = 0.01;
  su.pass_s = 0.045;
  su.window_s = 2;
  su.passes = 44;
  su.cpu_cores = su.quota_cores = 0.25;
  su.quota_period_s = 0.1;
  // The other device sustains about what the medians say (a little faster: noise): no
  // quota, and within kThrottleNoise, so its medians stand.
  Sustained& steady = quota.devices[1].sustained;
  steady = {0.0095, 0.01, 0.5, 52, 2, 0, 0};
  CostOptions o;
  o.microbatch_size = 4;
  const Problem p = makeProblem(model, c, {{"p.json", quota}}, "p.json", o);
  EXPECT_DOUBLE_EQ(p.devices[0].forward_s[1], 4.5 * 2e-3);  // edge/cpu
  EXPECT_DOUBLE_EQ(p.devices[0].backward_s[0], 4.5 * 2e-3);
  EXPECT_DOUBLE_EQ(p.devices[0].burst_ratio, 1 / 4.5);
  EXPECT_DOUBLE_EQ(p.devices[0].burst_budget_s, 0.1 / 4.5);
  EXPECT_DOUBLE_EQ(p.devices[1].forward_s[1], 2e-3);  // cloud/gpu
  EXPECT_EQ(p.devices[1].burst_ratio, 1);             // no quota: no bursts
  EXPECT_EQ(p.devices[1].burst_budget_s, 0);
  // Without a quota, a device that sustains much less than its medians is throttled.
  steady.pass_s = 0.02;
  const Problem hot = makeProblem(model, c, {{"p.json", quota}}, "p.json", o);
  EXPECT_DOUBLE_EQ(hot.devices[1].forward_s[1], 2 * 2e-3);
  EXPECT_EQ(hot.devices[1].burst_ratio, 1);  // no quota: it does not burst back
  // A profile without the sustained measurement (before version 3) is taken as it is.
  const Problem old =
      makeProblem(model, c, {{"p.json", profileFor(model, {"cpu", "opencl:0"})}}, "p.json", o);
  EXPECT_DOUBLE_EQ(old.devices[0].forward_s[1], 2e-3);
  EXPECT_EQ(old.devices[0].burst_ratio, 1);
  EXPECT_EQ(old.devices[0].update_s_per_param_byte, 0);  // nor the update (version 4)
  // The optimizer's update over the model's parameters, for the job's optimizer, scaled
  // like the layers.
  // Under the quota its fastest repeat: the others were stalled by it.
  quota.devices[0].update = {{"sgd", {0.009, 0.002, 0.05, 3}}, {"adamw", {0.02, 0.005, 0.06, 3}}};
  // Without a quota the median (this one throttled twice over, as its layers are).
  quota.devices[1].update = {{"sgd", {0.003, 0.001, 0.004, 3}}};
  int64_t params = 0;
  for (size_t l = 0; l < model.size(); ++l) params += model.layer(l).paramCount() * 4;
  ASSERT_GT(params, 0);
  for (const char* kind : {"sgd", "adamw"}) {
    o.optimizer = kind;
    const Problem u = makeProblem(model, c, {{"p.json", quota}}, "p.json", o);
    const double update = kind[0] == 's' ? 0.002 : 0.005;
    EXPECT_DOUBLE_EQ(u.devices[0].update_s_per_param_byte,
                     update * 4.5 / static_cast<double>(params))
        << kind;
    EXPECT_DOUBLE_EQ(u.devices[1].update_s_per_param_byte,
                     kind[0] == 's' ? 0.003 * 2 / static_cast<double>(params) : 0)
        << kind;  // adamw: not measured there
    const CostModel cost(u);
    EXPECT_NEAR(cost.update(0, 0, model.size()), update * 4.5, 1e-12);
  }
}

// Measured links (`tandem profile --links`) fill the matrix where the cluster file lists
// no link between the two nodes; listed links win; one-way measurements serve both ways.
TEST(ClusterTest, MeasuredLinksFillTheMatrixUnderListedOnes) {
  const Model model(parseModelSpec(tandem::testing::kTinyNet));
  const std::string yaml = std::string(kCluster) + "  measured: links.json\n";
  const Cluster c = parseCluster(yaml, "dir/c.yaml");
  EXPECT_EQ(c.measured, "dir/links.json");
  EXPECT_EQ(c.measured_where, "dir/c.yaml:14:13");
  EXPECT_EQ(c.nodes[0].host, "127.0.0.1");
  const std::vector<std::string> paths = profilePaths(c, "p.json");
  EXPECT_NE(std::find(paths.begin(), paths.end(), "dir/links.json"), paths.end());

  Profile links;
  links.links = LinkSet{"tcp", 1 << 20, 1, 3, {}};
  links.links->links = {{"edge", "edge", 2e9, 1e-5, {}},
                        {"cloud", "edge", 3e8, 4e-4, {}},   // listed in the file: ignored
                        {"cloud", "cloud", 7e9, 2e-5, {}},  // only one way: both ways
                        {"edge", "cloud", 4e8, 5e-4, {}, 3e-9, 0.7}};
  std::map<std::string, Profile> profiles = {{"p.json", profileFor(model, {"cpu", "opencl:0"})},
                                             {"dir/links.json", links}};
  CostOptions o;
  o.microbatch_size = 4;
  const Problem p = makeProblem(model, c, profiles, "p.json", o);
  EXPECT_DOUBLE_EQ(p.links[0][0].bandwidth, 2e9);  // measured, over `local`
  EXPECT_DOUBLE_EQ(p.links[0][0].latency_s, 1e-5);
  EXPECT_DOUBLE_EQ(p.links[1][1].bandwidth, 7e9);
  EXPECT_DOUBLE_EQ(p.links[0][1].bandwidth, 12.5e6);  // `between` wins
  EXPECT_DOUBLE_EQ(p.links[1][0].latency_s, 0.02);

  // Without the `between` entry, each direction is its own measurement.
  const Cluster unlisted = parseCluster(
      "nodes: [{name: edge, devices: [{backend: cpu}]}, {name: cloud, host: 10.0.0.2, devices: "
      "[{backend: cpu}]}]\nlinks: {measured: links.json}\n",
      "u.yaml");
  EXPECT_EQ(unlisted.nodes[1].host, "10.0.0.2");
  profiles["links.json"] = links;
  const Problem q = makeProblem(model, unlisted, profiles, "p.json", o);
  EXPECT_DOUBLE_EQ(q.links[0][1].bandwidth, 4e8);
  EXPECT_DOUBLE_EQ(q.links[1][0].bandwidth, 3e8);
  EXPECT_DOUBLE_EQ(q.links[1][0].latency_s, 4e-4);
  // With the CPU its bytes cost the hosts, where the daemons measured it.
  EXPECT_DOUBLE_EQ(q.links[0][1].cpu_s_per_byte, 3e-9);
  EXPECT_DOUBLE_EQ(q.links[1][0].cpu_s_per_byte, 0);
  // And the sender's part of it, where measured (else half).
  EXPECT_DOUBLE_EQ(q.links[0][1].sender_share, 0.7);
  EXPECT_DOUBLE_EQ(q.links[1][0].sender_share, 0.5);

  // A profile without links, and links naming nodes the cluster lacks, are refused.
  profiles["links.json"] = profileFor(model, {"cpu"});
  expectThrowWith<InvalidArgument>(
      [&] { makeProblem(model, unlisted, profiles, "p.json", o); },
      {"u.yaml:2:19", "links.json holds no links", "tandem profile --links"});
  links.links->links.push_back({"edge", "moon", 1e9, 0, {}});
  profiles["links.json"] = links;
  expectThrowWith<InvalidArgument>([&] { makeProblem(model, unlisted, profiles, "p.json", o); },
                                   {"a link from 'edge' to 'moon'", "has no node 'moon'"});
}

// The loss, measured with the layers, is paid by the last layer's stage when training.
TEST(ClusterTest, TheLossJoinsTheLastLayerWhenTraining) {
  const Model model(parseModelSpec(tandem::testing::kTinyNet));
  const Cluster c = parseCluster(kCluster, "c.yaml");
  Profile prof = profileFor(model, {"cpu", "opencl:0"});
  for (DeviceProfile& d : prof.devices) d.loss = {5e-3, 0, 0, 1};
  CostOptions o;
  o.microbatch_size = 8;
  const Problem train = makeProblem(model, c, {{"p.json", prof}}, "p.json", o);
  const double last = 1e-3 * static_cast<double>(model.size());
  EXPECT_DOUBLE_EQ(train.devices[0].forward_s.back(), 2 * (last + 5e-3));
  EXPECT_DOUBLE_EQ(train.devices[0].forward_s[0], 2 * 1e-3);
  o.objective = Objective::kInferThroughput;
  const Problem serve = makeProblem(model, c, {{"p.json", prof}}, "p.json", o);
  EXPECT_DOUBLE_EQ(serve.devices[0].forward_s.back(), 2 * last);
}

// What a device's profile says it lacks reaches the problem: for training every lacked op
// of a layer, for serving only a forward it cannot run.
TEST(ClusterTest, WhatAProfileLacksReachesTheProblem) {
  const Model model(parseModelSpec(tandem::testing::kTinyNet));
  const Cluster c = parseCluster(kCluster, "c.yaml");
  Profile prof = profileFor(model, {"cpu", "opencl:0"});
  LayerProfile& relu = prof.devices[1].layers[1];
  relu.lacks = {{Op::kActivationBackward, DType::kF32}};
  LayerProfile& gelu = prof.devices[1].layers[6];
  gelu.lacks = {{Op::kActivation, DType::kF32}, {Op::kActivationBackward, DType::kF32}};
  gelu.forward_runs = false;
  CostOptions o;
  o.microbatch_size = 8;
  const Problem train = makeProblem(model, c, {{"p.json", prof}}, "p.json", o);
  // Devices in the cluster's order: edge/cpu (cpu), cloud/gpu (opencl:0), cloud/cpu.
  const DeviceCosts& gpu = train.devices[1];
  ASSERT_EQ(gpu.name, "cloud/gpu");
  ASSERT_EQ(gpu.lacks.size(), model.size());
  EXPECT_EQ(gpu.lacks[1], "lacks activationBackward on f32");
  EXPECT_EQ(gpu.lacks[6], "lacks activation on f32, activationBackward on f32");
  EXPECT_EQ(gpu.lacks[0], "");
  for (const std::string& l : train.devices[0].lacks) EXPECT_EQ(l, "");
  o.objective = Objective::kInferThroughput;
  const Problem serve = makeProblem(model, c, {{"p.json", prof}}, "p.json", o);
  EXPECT_EQ(serve.devices[1].lacks[1], "");  // its forward runs
  EXPECT_EQ(serve.devices[1].lacks[6], "lacks activation on f32, activationBackward on f32");
}

// A node's message costs are the lines through its daemon's points: the CPU of both ends,
// and the sending thread's time in the send call.
TEST(ClusterTest, ANodesMessageCostsAreTheLinesThroughItsPoints) {
  const Model model(parseModelSpec(tandem::testing::kTinyNet));
  const Cluster c = parseCluster(kCluster, "c.yaml");
  Profile prof = profileFor(model, {"cpu", "opencl:0"});
  prof.message_cpu = {{1000, 2e-5, 1e-5}, {3000, 6e-5, 2e-5}};
  CostOptions o;
  o.microbatch_size = 4;
  const Problem problem = makeProblem(model, c, {{"p.json", prof}}, "p.json", o);
  ASSERT_EQ(problem.node_message_cpu.size(), 2u);
  const MessageCpuCost& m = problem.node_message_cpu[0];
  EXPECT_NEAR(m.per_byte_s, 2e-8, 1e-20);
  EXPECT_NEAR(m.fixed_s, 0, 1e-15);
  EXPECT_NEAR(m.send_per_byte_s, 5e-9, 1e-20);
  EXPECT_NEAR(m.send_fixed_s, 5e-6, 1e-15);
  EXPECT_NEAR(m.send(5000), 3e-5, 1e-15);
}

TEST(ClusterTest, NodesMayNameTheirDaemonsAndTheClusterItsKey) {
  const Cluster c = parseCluster(
      "key: keys/c.key\n"
      "nodes:\n"
      "  - {name: edge, address: '10.0.0.5:7600', devices: [{backend: cpu}]}\n"
      "  - {name: v6, address: '[::1]:7601', devices: [{backend: cpu}]}\n"
      "  - {name: here, devices: [{backend: cpu}]}\n",
      "conf/c.yaml");
  EXPECT_EQ(c.key, "conf/keys/c.key");  // relative to the cluster file
  ASSERT_TRUE(c.nodes[0].address.has_value());
  EXPECT_EQ(c.nodes[0].address->host, "10.0.0.5");
  EXPECT_EQ(c.nodes[0].address->port, 7600);
  EXPECT_EQ(c.nodes[0].host, "10.0.0.5");  // its stages listen where its daemon does
  EXPECT_EQ(c.nodes[1].address->host, "::1");
  EXPECT_EQ(c.nodes[1].address->str(), "[::1]:7601");
  EXPECT_FALSE(c.nodes[2].address.has_value());
  EXPECT_EQ(c.nodes[2].host, "127.0.0.1");
}

TEST(ClusterTest, MalformedFilesNameTheLine) {
  struct Case {
    const char* yaml;
    std::vector<std::string> expect;
  } cases[] = {
      {"nodes: []\n", {"c.yaml:1:8", "non-empty list"}},
      {"nodes: [{name: a, devices: [{backend: tpu}]}]\n", {"c.yaml:1:39", "unknown backend 'tpu'"}},
      {"nodes: [{name: a, devices: [{backend: cpu, memory: lots}]}]\n",
       {"c.yaml:1:52", "'memory' must be a byte count"}},
      {"nodes: [{name: a, devices: [{backend: cpu}]}]\nlinks: {local: {bandwidth: fast}}\n",
       {"c.yaml:2:28", "'bandwidth' must be a rate"}},
      {"nodes: [{name: a, devices: [{backend: cpu}]}]\nlinks: {local: {latency: 1ms}}\n",
       {"c.yaml:2:16", "needs a 'bandwidth'"}},
      {"nodes: [{name: a, devices: [{backend: cpu}, {backend: cpu}]}]\n",
       {"c.yaml:1:45", "a second device named 'cpu'"}},
      {"nodes: [{name: a, devices: [{backend: cpu}]}, {name: a, devices: [{backend: cpu}]}]\n",
       {"c.yaml:1:", "a second node named 'a'"}},
      {"nodes: [{name: a, devices: [{backend: cpu}]}]\nlinks: {between: [{from: a, to: b, "
       "bandwidth: 1}]}\n",
       {"c.yaml:2:19", "names node 'b'"}},
      {"nodes: [{name: a, devices: [{backend: cpu}]}]\nspeed: 3\n", {"c.yaml:2:1", "unknown key"}},
      {"nodes: [{name: a, host: 'tcp://x:1', devices: [{backend: cpu}]}]\n",
       {"c.yaml:1:25", "'tcp://x:1' is not a host name or address"}},
      {"nodes: [{name: a, devices: [{backend: cpu}]}]\nlinks: {measured: [a]}\n",
       {"c.yaml:2:19", "'measured' must be"}},
      {"nodes: [{name: a, address: 'host', devices: [{backend: cpu}]}]\n",
       {"c.yaml:1:28", "'host' is not an address HOST:PORT"}},
      {"nodes: [{name: a, address: 'h:99999', devices: [{backend: cpu}]}]\n",
       {"c.yaml:1:28", "port must be a number from 1 to 65535"}},
      {"nodes: [{name: a, address: '::1:80', devices: [{backend: cpu}]}]\n",
       {"c.yaml:1:28", "IPv6 host goes in [brackets]"}},
      {"nodes:\n  - {name: a, address: 'h:1', devices: [{backend: cpu}]}\n"
       "  - {name: b, address: 'h:1', devices: [{backend: cpu}]}\n",
       {"c.yaml:3:24", "node 'b' has the address of node 'a' (h:1)"}},
      {"nodes: [{name: a, adress: 'h:1', devices: [{backend: cpu}]}]\n",
       {"c.yaml:1:19", "unknown node key 'adress'", "expected name, address"}},
  };
  for (const Case& c : cases)
    expectThrowWith<InvalidArgument>([&] { parseCluster(c.yaml, "c.yaml"); }, c.expect);
  expectThrowWith<FormatError>([&] { parseCluster("nodes: [\n", "c.yaml"); },
                               {"YAML syntax error"});
}

// The stages a plan file states, read back from planToYaml, are those planStageSpecs
// makes without the file (to its rounding of the predicted times).
void expectTheSameStages(const CostModel& cost, const Plan& plan) {
  const std::vector<PlanStageSpec> read = parsePlan(planToYaml(cost, plan), "plan.yaml");
  const std::vector<PlanStageSpec> made = planStageSpecs(cost, plan, "the auto plan");
  ASSERT_EQ(read.size(), made.size());
  for (size_t s = 0; s < read.size(); ++s) {
    EXPECT_EQ(made[s].begin, read[s].begin);
    EXPECT_EQ(made[s].end, read[s].end);
    EXPECT_EQ(made[s].devices, read[s].devices);
    EXPECT_EQ(made[s].backend, read[s].backend);
    EXPECT_EQ(made[s].backends, read[s].backends);
    EXPECT_EQ(made[s].activation_codec, read[s].activation_codec);
    EXPECT_EQ(made[s].gradient_codec, read[s].gradient_codec);
    EXPECT_EQ(made[s].threads, read[s].threads);
    EXPECT_NEAR(made[s].compute_s, read[s].compute_s, 1e-5 * made[s].compute_s);
    EXPECT_NEAR(made[s].allreduce_s, read[s].allreduce_s, 1e-5 * made[s].allreduce_s);
    EXPECT_NEAR(made[s].update_s, read[s].update_s, 1e-5 * made[s].update_s);
    EXPECT_EQ(made[s].where, "the auto plan");
  }
}

TEST(PlanTest, WrittenPlansReadBack) {
  RandomProblemOptions o;
  o.layers = 9;
  o.devices = 3;
  const CostModel cost(randomProblem(o));
  const Plan plan = bestPlan(cost);
  const auto specs = parsePlan(planToYaml(cost, plan), "plan.yaml");
  ASSERT_EQ(specs.size(), plan.stages.size());
  for (size_t s = 0; s < specs.size(); ++s) {
    EXPECT_EQ(specs[s].begin, plan.stages[s].at.begin);
    EXPECT_EQ(specs[s].end, plan.stages[s].at.end);
    EXPECT_EQ(specs[s].devices[0],
              cost.problem().devices[static_cast<size_t>(plan.stages[s].at.devices[0])].name);
    EXPECT_NEAR(specs[s].compute_s, plan.stages[s].compute_s, 1e-6 * plan.stages[s].compute_s);
  }
  expectTheSameStages(cost, plan);
  // With each link's codecs chosen.
  std::vector<LinkCodec> codecs(plan.stages.size() - 1, LinkCodec{"int8", "fp16"});
  std::vector<Assignment> at;
  for (const PlanStage& st : plan.stages) at.push_back(st.at);
  expectTheSameStages(cost, evaluate(cost, at, "coded", codecs));
  expectThrowWith<InvalidArgument>(
      [&] { parsePlan("stages:\n  - {layers: [3, 1], devices: [a], backend: cpu}\n", "p.yaml"); },
      {"p.yaml:2:14", "[3, 1) is empty"});
  expectThrowWith<InvalidArgument>(
      [&] { parsePlan("stages:\n  - {layers: [0, 1], backend: cpu}\n", "p.yaml"); },
      {"p.yaml:2:5", "no 'devices'"});
  expectThrowWith<InvalidArgument>([&] { parsePlan("objective: train\n", "p.yaml"); },
                                   {"needs 'stages'"});
  expectThrowWith<InvalidArgument>(
      [&] {
        parsePlan(
            "stages:\n  - {layers: [0, 1], devices: [a, b], backend: opencl:0, "
            "backends: [opencl:0]}\n",
            "p.yaml");
      },
      {"p.yaml:2:68", "'backends' lists 1 devices for the stage's 2 replicas"});
}

// A replicated stage's plan names each replica's device: two GPUs are opencl:0 and
// opencl:1, not opencl:0 twice.
TEST(PlanTest, ReplicasKeepTheirOwnDevices) {
  Problem p;
  p.layers = {{"linear", 4000, 400, 400}, {"linear", 4000, 40, 40}};
  p.input_bytes = 400;
  p.node_names = {"n"};
  for (int i = 0; i < 2; ++i) {
    DeviceCosts d;
    d.name = "n/gpu" + std::to_string(i);
    d.memory_bytes = int64_t{1} << 30;
    d.forward_s = d.backward_s = {1e-3, 1e-3};
    d.backend = "opencl:" + std::to_string(i);
    p.devices.push_back(d);
  }
  p.links = {{LinkCosts{1e9, 1e-5}}};
  p.options.max_replicas = 2;
  for (DeviceCosts& d : p.devices) d.update_s_per_param_byte = 1e-9;
  const CostModel cost(p);
  const Plan plan = evaluate(cost, {Assignment{0, 2, {0, 1}}}, "replicated");
  const auto specs = parsePlan(planToYaml(cost, plan), "plan.yaml");
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs[0].devices, (std::vector<std::string>{"n/gpu0", "n/gpu1"}));
  EXPECT_EQ(specs[0].backends, (std::vector<std::string>{"opencl:0", "opencl:1"}));
  EXPECT_GT(specs[0].allreduce_s, 0);
  // The stage's update per step: its parameter bytes at the device's rate.
  EXPECT_GT(specs[0].update_s, 0);
  EXPECT_NEAR(specs[0].update_s, cost.update(cost.typeOf(0), 0, 2), 1e-5 * specs[0].update_s);
  expectTheSameStages(cost, plan);
}

}  // namespace
}  // namespace tandem::partitioner
