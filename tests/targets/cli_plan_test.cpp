// The tandem CLI's planning path end to end: profile, partition, plans that run,
// `partition: auto` measured by the nodes' daemons, the planner's choices (microbatches,
// schedule, each link's codecs) and its predictions beside what ran.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/file.h"
#include "tests/profile_util.h"
#include "tests/targets/cli_util.h"
#include "tests/test_util.h"

namespace {

using tandem::testing::cli::CliRun;
using tandem::testing::cli::kModels;
using tandem::testing::cli::run;

// The "MB sent" column of each stage's row in `tandem run`'s stage table.
std::vector<double> megabytesSent(const std::string& out) {
  std::vector<double> sent;
  const size_t table = out.find("\nstage  ");
  if (table == std::string::npos) return sent;
  std::istringstream lines(out.substr(table + 1));
  std::string line;
  std::getline(lines, line);  // the header
  while (std::getline(lines, line) && !line.empty() && std::isdigit(line[0])) {
    std::istringstream f(line);
    std::vector<std::string> fields;
    for (std::string field; f >> field;) fields.push_back(field);
    if (fields.size() < 10) break;
    // ... MB sent, MB received, ms/micro, cpu ms, all cpu, predicted (the layers are one
    // field or two: "[0, 3)", "[0,2)+[5,8)").
    sent.push_back(std::stod(fields[fields.size() - 6]));
  }
  return sent;
}
// profile -> partition -> a job that runs the written plan, and one that plans itself
// (partition: auto): the stages are the plan's, and the run shows the prediction.
TEST(CliTest, PartitionWritesAPlanThatRunRuns) {
  const std::string dir = ::testing::TempDir();
  const std::string profile = dir + "cli_partition_profile.json", plan = dir + "cli_plan.yaml";
  const std::string cluster = std::string(TANDEM_SOURCE_DIR) + "/examples/clusters/local.yaml";
  ASSERT_EQ(run("profile --model " + kModels + "cnn.yaml --batch 8 --repeats 2 --warmup 1 --out " +
                profile)
                .code,
            0);
  const CliRun r = run("partition --model " + kModels + "cnn.yaml --cluster " + cluster +
                       " --profile " + profile + " --batch 32 --microbatches 4 --out " + plan);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s :
       {"plan for cnn on", "local/cpu", "equal-layers", "equal-params", "memory-proportional",
        "plan's speedup", "a training step", "predicted:", "wrote"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;

  // A baseline written as a plan, to run it beside the search's.
  const std::string equal = dir + "cli_equal_plan.yaml";
  const CliRun e =
      run("partition --model " + kModels + "cnn.yaml --cluster " + cluster + " --profile " +
          profile + " --batch 32 --microbatches 4 --baseline equal-layers --out " + equal);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("(train, equal-layers baseline, 3 of 3 devices"), std::string::npos)
      << e.out;
  EXPECT_NE(e.out.find("[3, 7)"), std::string::npos) << e.out;

  // The last: auto, with replicas allowed (whatever the plan, `tandem run` runs it).
  const std::vector<std::string> partitions = {plan, "auto", equal, "auto\nbaseline: equal-layers",
                                               "auto\nmax_replicas: 3"};
  for (const std::string& partition : partitions) {
    const std::string job = dir + "cli_partition_job.yaml";
    std::ofstream(job) << "model: " << kModels << "cnn.yaml\ntrain_limit: 256\ntest_limit: 64\n"
                       << "batch: 32\nmicrobatches: 4\npartition: " << partition
                       << "\ncluster: " << cluster << "\nprofile: " << profile << "\n";
    const CliRun j = run("run " + job);
    ASSERT_EQ(j.code, 0) << j.out;
    EXPECT_NE(j.out.find("predicted"), std::string::npos) << j.out;
    EXPECT_NE(j.out.find("on cpu (1 threads)"), std::string::npos) << j.out;
    if (partition.starts_with("auto")) {
      EXPECT_NE(j.out.find("partition: auto: "), std::string::npos) << j.out;
      // The other splits, priced on the same measurements, beside the one that runs.
      EXPECT_NE(j.out.find("beside it: memory-proportional "), std::string::npos) << j.out;
    }
    if (partition.ends_with("baseline: equal-layers")) {
      EXPECT_NE(j.out.find("3 stages by the equal-layers baseline ([0, 3) "), std::string::npos)
          << j.out;
      EXPECT_NE(j.out.find("layers [3, 7) on cpu"), std::string::npos) << j.out;
      EXPECT_NE(j.out.find("beside it: exact "), std::string::npos) << j.out;
    }
  }
  // Devices too small for any placement: auto refuses the job before any worker starts
  // (as a run that lost a node does when the nodes left cannot hold its stages).
  const std::string tiny = dir + "cli_tiny_cluster.yaml";
  std::ofstream(tiny) << "nodes:\n  - name: local\n    devices:\n"
                      << "      - {name: cpu0, backend: cpu, threads: 1, memory: 5MiB}\n"
                      << "      - {name: cpu1, backend: cpu, threads: 1, memory: 5MiB}\n";
  const std::string tight = dir + "cli_tight_job.yaml";
  std::ofstream(tight) << "model: " << kModels << "cnn.yaml\ntrain_limit: 256\n"
                       << "batch: 32\nmicrobatches: 4\npartition: auto\ncluster: " << tiny
                       << "\nprofile: " << profile << "\n";
  const CliRun no_fit = run("run " + tight);
  EXPECT_EQ(no_fit.code, 1) << no_fit.out;
  for (const char* s : {"found no split of the 10 layers over the 2 devices that fits in memory",
                        "the devices have 10485760 in all"})
    EXPECT_NE(no_fit.out.find(s), std::string::npos) << s << "\n" << no_fit.out;
  EXPECT_EQ(no_fit.out.find("pid "), std::string::npos) << no_fit.out;
  // A plan's stage on two devices runs as two replicas (a row each in the stage table).
  const std::string replicated = dir + "cli_replicated_plan.yaml";
  std::ofstream(replicated) << "stages:\n"
                            << "  - {layers: [0, 3], devices: [local/cpu0], backend: cpu}\n"
                            << "  - {layers: [3, 10], devices: [local/cpu1, local/cpu2], "
                            << "backend: cpu, compute_s: 0.003, allreduce_s: 0.004, "
                            << "update_s: 0.004}\n";
  const std::string job = dir + "cli_replicated_job.yaml";
  std::ofstream(job) << "model: " << kModels << "cnn.yaml\ntrain_limit: 256\ntest_limit: 64\n"
                     << "batch: 32\nmicrobatches: 4\npartition: " << replicated << "\n";
  const CliRun rep = run("run " + job);
  ASSERT_EQ(rep.code, 0) << rep.out;
  EXPECT_NE(rep.out.find("stage 1 replica 1: layers [3, 10)"), std::string::npos) << rep.out;
  // One replica computes a whole microbatch, without its share of the allreduce and the
  // update: (0.003 - (0.004 + 0.004) / 4) x 2 = 2 ms predicted.
  EXPECT_NE(rep.out.find("\n1.1    [3, 10)"), std::string::npos) << rep.out;
  EXPECT_NE(rep.out.find("2.0000\n"), std::string::npos) << rep.out;

  const CliRun bad = run("partition --model " + kModels + "cnn.yaml --cluster " + cluster +
                         " --profile " + profile + " --objective latency --source nowhere/cpu");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("--source nowhere/cpu is not a device"), std::string::npos) << bad.out;
  const CliRun mlp = run("partition --model " + kModels + "mlp.yaml --cluster " + cluster +
                         " --profile " + profile);
  EXPECT_NE(mlp.code, 0);
  EXPECT_NE(mlp.out.find("profiles model 'cnn'"), std::string::npos) << mlp.out;
}

// A plan's tensor-split stage (`tensor: true`): `tandem partition --evaluate` prices it and
// names what each of its layers becomes, `tandem run` runs it as one worker over its ranks
// (a row per rank); with `--max-tensor 1` the search splits nothing.
TEST(CliTest, APlansTensorSplitStageIsPricedAndRuns) {
  const std::string dir = tandem::testing::freshDir("cli-tensor-plan");
  const std::string profile = dir + "/profile.json", plan = dir + "/plan.yaml";
  const std::string cluster = std::string(TANDEM_SOURCE_DIR) + "/examples/clusters/local.yaml";
  ASSERT_EQ(run("profile --model " + kModels + "cnn.yaml --batch 8 --repeats 2 --warmup 1 --out " +
                profile)
                .code,
            0);
  std::ofstream(plan) << "stages:\n"
                      << "  - {layers: [0, 6], devices: [local/cpu0, local/cpu1], backend: cpu,"
                      << " tensor: true}\n"
                      << "  - {layers: [6, 10], devices: [local/cpu2], backend: cpu}\n";
  const std::string common = "partition --model " + kModels + "cnn.yaml --cluster " + cluster +
                             " --profile " + profile + " --batch 32 --microbatches 4";
  const CliRun e = run(common + " --evaluate " + plan);
  ASSERT_EQ(e.code, 0) << e.out;
  for (const char* s : {"local/cpu0+local/cpu1", "stage 0: 2 tensor ranks (equal shares)",
                        "0 conv2d column, 1 relu slice, 2 maxpool2d slice, 3 conv2d row, 4 relu "
                        "whole, 5 maxpool2d whole"})
    EXPECT_NE(e.out.find(s), std::string::npos) << s << "\n" << e.out;
  const CliRun layers = run(common + " --max-tensor 1");
  ASSERT_EQ(layers.code, 0) << layers.out;
  EXPECT_EQ(layers.out.find("tensor ranks"), std::string::npos) << layers.out;
  const std::string job = dir + "/job.yaml";
  std::ofstream(job) << "model: " << kModels << "cnn.yaml\ntrain_limit: 256\ntest_limit: 64\n"
                     << "batch: 32\nmicrobatches: 4\npartition: " << plan << "\n";
  const CliRun r = run("run " + job);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"stage 0: 2 tensor ranks (feature shares 1 : 1)", "\n0/t1   [0, 6)",
                        "layers [6, 10) on cpu"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

// partition: auto without a profile: each node's daemon (tandemd processes started here
// for a cluster without addresses) profiles the model on its devices, and the links the
// cluster file does not state are measured; the second run finds the profiles cached.
TEST(CliTest, AutoWithoutAProfileIsMeasuredByTheNodesDaemons) {
  const std::string dir = ::testing::TempDir();
  const std::string cluster = dir + "cli_auto_cluster.yaml", job = dir + "cli_auto_job.yaml";
  std::ofstream(cluster)
      << "nodes:\n"
         "  - {name: a, devices: [{name: cpu, backend: cpu}]}\n"
         "  - {name: b, host: 127.0.0.2, devices: [{name: cpu, backend: cpu}]}\n";
  std::ofstream(job) << "model: " << kModels << "mlp.yaml\ntrain_limit: 256\ntest_limit: 64\n"
                     << "batch: 32\nmicrobatches: 4\npartition: auto\ncluster: " << cluster << "\n";
  const CliRun first = run("run " + job);
  ASSERT_EQ(first.code, 0) << first.out;
  for (const char* s : {"2 device profiles measured by the nodes' daemons", "4 links measured",
                        "link a -> b:", "link b -> b:", "partition: auto: ", "test accuracy"})
    EXPECT_NE(first.out.find(s), std::string::npos) << s << "\n" << first.out;
  const CliRun second = run("run " + job);
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_NE(
      second.out.find("2 device profiles measured by the nodes' daemons (2 from their caches)"),
      std::string::npos)
      << second.out;
  // A link the cluster states is taken as stated: only the other three are measured.
  std::ofstream(cluster, std::ios::app)
      << "links:\n  between: [{from: a, to: b, bandwidth: 1GB/s, latency: 10us}]\n";
  const CliRun stated = run("run " + job);
  ASSERT_EQ(stated.code, 0) << stated.out;
  EXPECT_NE(stated.out.find("2 links measured"), std::string::npos) << stated.out;
}

// `microbatches: auto` and `schedule: auto`: the planner prices every microbatch count
// (1, 2, 4, 8 for a batch of 8), each profiled by the daemons at its microbatch size (all
// four in one task per node, whatever the schedule), with each schedule, and the run trains with
// the fastest, saying what it priced and chose; every device the plan leaves out is named with why.
TEST(CliTest, AutoChoosesTheMicrobatchCountAndSchedule) {
  const std::string dir = ::testing::TempDir();
  const std::string cluster = dir + "cli_choose_cluster.yaml", job = dir + "cli_choose_job.yaml";
  std::ofstream(cluster) << "nodes:\n"
                            "  - {name: a, devices: [{name: cpu, backend: cpu}]}\n"
                            "  - {name: b, devices: [{name: cpu, backend: cpu}]}\n";
  std::ofstream(job) << "model: " << kModels << "mlp.yaml\ntrain_limit: 256\ntest_limit: 64\n"
                     << "batch: 8\nmicrobatches: auto\nschedule: auto\npartition: auto\n"
                     << "cluster: " << cluster << "\n";
  const CliRun r = run("run " + job);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s :
       {"1 1f1b: ", "1 gpipe: ", "2 1f1b: ", "4 gpipe: ", "8 1f1b: ", "2 interleaved x2: ",
        "1 interleaved x2: ",  // (priced, or "not planned: ..." when its plan is one device)
        "(predicted step per candidate", "step: measured", "test accuracy"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  // The daemons measure every count's microbatch size in one task each, not once per
  // count nor per count and schedule.
  int asked = 0;
  for (size_t at = r.out.find("device profiles measured by the nodes' daemons");
       at != std::string::npos;
       at = r.out.find("device profiles measured by the nodes' daemons", at + 1))
    ++asked;
  EXPECT_EQ(asked, 1) << r.out;
  for (const char* s : {"8 device profiles measured by the nodes' daemons (",  // 2 nodes x 4
                        "caches) at 4 microbatch sizes, "})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  const size_t chose = r.out.find("chose ");
  ASSERT_NE(chose, std::string::npos) << r.out;
  const int m = std::stoi(r.out.substr(chose + 6));
  EXPECT_TRUE(m == 1 || m == 2 || m == 4 || m == 8) << r.out;
  // The run trains with the microbatches it chose.
  EXPECT_NE(r.out.find(std::to_string(m) + " microbatches of a 8-sample batch"), std::string::npos)
      << r.out;
  // A plan on one of the two devices names the other.
  if (r.out.find("1 stages by") != std::string::npos) {
    EXPECT_TRUE(r.out.find("  a/cpu: ") != std::string::npos ||
                r.out.find("  b/cpu: ") != std::string::npos)
        << r.out;
  }
}

// tandem partition --schedule interleaved writes a plan whose stages are cut into chunks
// (mlp-deep over two equal devices, on a profile whose layers are slow enough that
// splitting pays);
// a job runs the file with `schedule: interleaved` and the same `chunks`, and a job
// without them is refused, naming the plan's chunks.
TEST(CliTest, AnInterleavedPlanFileRuns) {
  const std::string dir = tandem::testing::freshDir("cli-interleaved-plan");
  const std::string profile = dir + "/profile.json", plan = dir + "/plan.yaml";
  ASSERT_EQ(run("profile --model " + kModels +
                "mlp-deep.yaml --batch 8 --repeats 2 --warmup 1 --out " + profile)
                .code,
            0);
  tandem::testing::scaleProfileTimes(profile, 1000);
  std::ofstream(dir + "/cluster.yaml")
      << "nodes:\n  - name: local\n    devices:\n"
         "      - {name: cpu0, backend: cpu, threads: 1, memory: 2GiB}\n"
         "      - {name: cpu1, backend: cpu, threads: 1, memory: 2GiB}\n"
         "links:\n  local: {bandwidth: 2GB/s, latency: 50us}\n";
  const CliRun p =
      run("partition --model " + kModels + "mlp-deep.yaml --cluster " + dir +
          "/cluster.yaml --profile " + profile +
          " --batch 32 --microbatches 4 --schedule interleaved --chunks 2 --out " + plan);
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("interleaved: 2 stages of 2 chunks"), std::string::npos) << p.out;
  EXPECT_NE(tandem::readFile(plan, "plan").find("\nchunks: 2\n"), std::string::npos);
  // Priced again from the file, the same step.
  const CliRun e =
      run("partition --model " + kModels + "mlp-deep.yaml --cluster " + dir +
          "/cluster.yaml --profile " + profile + " --batch 32 --microbatches 4 --evaluate " + plan);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("interleaved: 2 stages of 2 chunks"), std::string::npos) << e.out;
  const auto step = [](const std::string& out) {
    const size_t at = out.find("a training step ");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 16));
  };
  EXPECT_NEAR(step(e.out), step(p.out), 1e-3 * step(p.out)) << p.out << e.out;
  for (const bool interleaved : {true, false}) {
    std::ofstream(dir + "/job.yaml")
        << "model: " << kModels << "mlp-deep.yaml\ntrain_limit: 256\ntest_limit: 64\nbatch: 32\n"
        << "microbatches: 4\n"
        << (interleaved ? "schedule: interleaved\nchunks: 2\n" : "") << "partition: " << plan
        << "\ncluster: " << dir << "/cluster.yaml\n";
    const CliRun j = run("run " + dir + "/job.yaml");
    if (interleaved) {
      ASSERT_EQ(j.code, 0) << j.out;
      EXPECT_NE(j.out.find("interleaved schedule"), std::string::npos) << j.out;
      EXPECT_NE(j.out.find(")+["), std::string::npos) << j.out;
    } else {
      EXPECT_EQ(j.code, 1) << j.out;
      EXPECT_NE(j.out.find("the plan's stages are in 2 chunks each, the job's one range each "
                           "(give 'schedule: interleaved' with 'chunks: 2')"),
                std::string::npos)
          << j.out;
    }
  }
  // Codecs per link in a plan file (chunk 0's: stage 0 to 1; chunk 1's: the ring, stage 1
  // to 0), with the job's codecs auto: every chunk crossing a link carries its codecs.
  // Cuts after layers 2, 5 and 8, each 512 wide.
  auto interleavedPlan = [&](const std::string& name, const std::string& first,
                             const std::string& second) {
    std::ofstream(dir + "/" + name)
        << "chunks: 2\nstages:\n"
        << "  - {layers: [0, 3], devices: [local/cpu0], backend: cpu" << first << "}\n"
        << "  - {layers: [3, 6], devices: [local/cpu1], backend: cpu" << second << "}\n"
        << "  - {layers: [6, 9], devices: [local/cpu0], backend: cpu}\n"
        << "  - {layers: [9, 14], devices: [local/cpu1], backend: cpu}\n";
  };
  interleavedPlan("exact.yaml", "", "");
  interleavedPlan("coded.yaml", ", codec: {activations: int8, gradients: fp32}",
                  ", codec: {activations: bf16, gradients: fp16}");
  auto codedJob = [&](const std::string& file) {
    std::ofstream(dir + "/job.yaml") << "model: " << kModels << "mlp-deep.yaml\ntrain_limit: 256\n"
                                     << "test_limit: 64\nbatch: 32\nmicrobatches: 4\n"
                                     << "schedule: interleaved\nchunks: 2\npartition: " << dir
                                     << "/" << file << "\ncluster: " << dir << "/cluster.yaml\n"
                                     << "codec: {activations: auto, gradients: auto}\n";
    return run("run " + dir + "/job.yaml");
  };
  const CliRun exact_links = codedJob("exact.yaml");
  ASSERT_EQ(exact_links.code, 0) << exact_links.out;
  EXPECT_NE(exact_links.out.find("batch, fp32 over ipc"), std::string::npos) << exact_links.out;
  const std::string exact_run = exact_links.out;
  const CliRun coded = codedJob("coded.yaml");
  ASSERT_EQ(coded.code, 0) << coded.out;
  EXPECT_NE(coded.out.find("0->1 int8/fp32, 1->0 bf16/fp16 over ipc"), std::string::npos)
      << coded.out;
  EXPECT_NE(coded.out.find("test accuracy"), std::string::npos) << coded.out;
  // Every cut is 512 wide. Per training sample stage 0 sends two activations on link
  // 0 -> 1 (int8: 0.258 of fp32) and one gradient back on the ring (fp16), stage 1 one
  // activation on the ring (bf16) and two gradients back on link 0 -> 1 (fp32); each of
  // the 64 test samples adds stage 0's two activations and stage 1's one.
  const std::vector<double> a = megabytesSent(exact_run), b = megabytesSent(coded.out);
  ASSERT_EQ(a.size(), 2u) << exact_run;
  ASSERT_EQ(b.size(), 2u) << coded.out;
  EXPECT_NEAR(b[0] / a[0], (256 * (2 * 0.258 + 0.5) + 64 * 2 * 0.258) / (256 * 3 + 64 * 2), 0.02)
      << exact_run << coded.out;
  EXPECT_NEAR(b[1] / a[1], (256 * (0.5 + 2) + 64 * 0.5) / (256 * 3 + 64), 0.02)
      << exact_run << coded.out;
}

// `partition: auto` plans over `--cluster`'s cluster when the job names none (as
// docs/runtime.md says: the cluster is --cluster's, else the job's `cluster:`), and a run
// with neither says what is missing, naming the job's line.
TEST(CliTest, AutoPlansOverTheClusterGivenOnTheCommandLine) {
  const std::string dir = tandem::testing::freshDir("cli-auto-cluster");
  std::ofstream(dir + "/cluster.yaml") << "nodes:\n"
                                          "  - {name: a, devices: [{name: cpu, backend: cpu}]}\n";
  std::ofstream(dir + "/job.yaml")
      << "model: " << kModels << "mlp.yaml\ntrain_limit: 128\ntest_limit: 32\n"
      << "batch: 32\nmicrobatches: 2\npartition: auto\n";
  const CliRun r = run("run " + dir + "/job.yaml --cluster " + dir + "/cluster.yaml");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("partition: auto: 1 stages"), std::string::npos) << r.out;
  const CliRun none = run("run " + dir + "/job.yaml");
  EXPECT_EQ(none.code, 1) << none.out;
  EXPECT_NE(none.out.find("job.yaml:6:12: 'partition: auto' needs a cluster to plan over"),
            std::string::npos)
      << none.out;
}

// tandem profile --model --cluster: each node's daemon profiles the devices the cluster
// file lists for it; one profile per node (schema-valid), and their sustained speeds
// side by side.
TEST(CliTest, ProfileOnTheNodesWritesOneProfilePerNode) {
  const std::string dir = tandem::testing::freshDir("cli-profile-nodes");
  const std::string cluster = dir + "/cluster.yaml";
  std::ofstream(cluster) << "nodes:\n"
                            "  - {name: edge, devices: [{name: cpu, backend: cpu}]}\n"
                            "  - {name: cloud, devices: [{name: cpu, backend: cpu, threads: 2}]}\n";
  const CliRun r = run("profile --model " + kModels + "mlp.yaml --cluster " + cluster +
                       " --batch 4 --repeats 2 --warmup 0 --out-dir " + dir + "/nodes");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"node edge", "node cloud", "sustained: ", "pass ms", "speed"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  for (const char* node : {"edge", "cloud"}) {
    const std::string check = "python3 -c \"import json, jsonschema; p = json.load(open('" + dir +
                              "/nodes/" + node +
                              ".json')); jsonschema.validate(p, json.load(open('" TANDEM_SOURCE_DIR
                              "/docs/profile.schema.json'))); assert p['devices'][0]['sustained']"
                              "['passes'] >= 2\" 2>&1";
    EXPECT_EQ(std::system(check.c_str()), 0) << check;
  }
  const CliRun both = run("profile --model " + kModels + "mlp.yaml --cluster " + cluster +
                          " --out " + dir + "/p.json");
  EXPECT_EQ(both.code, 1);
  EXPECT_NE(both.out.find("write them with --out-dir"), std::string::npos) << both.out;
  const CliRun dir_alone = run("profile --model " + kModels + "mlp.yaml --out-dir " + dir);
  EXPECT_EQ(dir_alone.code, 1);
  EXPECT_NE(dir_alone.out.find("--out-dir is for --model with --cluster"), std::string::npos)
      << dir_alone.out;
}

// A job whose stages need more memory than their node has free is refused before any
// worker starts (the model is never built: a 20M-wide layer of 784 inputs is 60 GB).
TEST(CliTest, AJobThatDoesNotFitItsNodesIsRefusedBeforeAnythingStarts) {
  const std::string dir = ::testing::TempDir();
  const std::string model = dir + "cli_huge.yaml", job = dir + "cli_huge_job.yaml";
  std::ofstream(model) << "name: huge\ninput: [1, 28, 28]\nlayers:\n  - flatten\n"
                          "  - linear: {out: 20000000}\n  - relu\n  - linear: {out: 10}\n";
  std::ofstream(job) << "model: " << model << "\ntrain_limit: 64\nbatch: 32\nmicrobatches: 4\n"
                     << "partition: [[0, 2], [2, 4]]\n";
  const CliRun r = run("run " + job);
  EXPECT_EQ(r.code, 1) << r.out;
  for (const char* s : {"cli_huge_job.yaml:5:12: node 'local' has ",
                        "MiB of memory free, and its workers need about ",
                        "(stage 0: ", "the job does not fit, and nothing was started"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  EXPECT_EQ(r.out.find("pid "), std::string::npos) << r.out;  // no worker was started
  // ... nor a daemon: the node is this machine, checked before its tandemd would start.
  EXPECT_EQ(r.out.find("round trip"), std::string::npos) << r.out;
}

// Unequal replicas of the whole model: the run says what share of the samples each one
// took beside its planned share, and whether the shares were set from the speed the
// first steps measured (the default) or kept (`rebalance_steps: 0`).
TEST(CliTest, RunSaysWhatShareOfTheSamplesEachUnequalReplicaTook) {
  const std::string dir = ::testing::TempDir();
  const std::string job = dir + "cli_shares.yaml";
  const std::string body = "model: " + kModels + "mlp.yaml\ntrain_limit: 512\ntest_limit: 64\n" +
                           "batch: 64\nmicrobatches: 4\n" +
                           "partition: [{layers: [0, 6], replicas: 2, shares: [3, 1]}]\n";
  std::ofstream(job) << body << "rebalance_steps: 0\n";
  const CliRun fixed = run("run " + job);
  ASSERT_EQ(fixed.code, 0) << fixed.out;
  EXPECT_NE(fixed.out.find("replicas' shares of the samples: 0.0 75.0% (planned 75.0%) 0.1 25.0% "
                           "(planned 25.0%); the planned shares throughout"),
            std::string::npos)
      << fixed.out;
  std::ofstream(job) << body;
  const CliRun measured = run("run " + job);
  ASSERT_EQ(measured.code, 0) << measured.out;
  for (const char* s : {"replicas' shares of the samples: 0.0 ", "(planned 75.0%) 0.1 ",
                        "(planned 25.0%); the shares were set from the replicas' speed measured "
                        "in steps 1 to 3"})
    EXPECT_NE(measured.out.find(s), std::string::npos) << s << "\n" << measured.out;
}

// Prediction vs reality: an auto plan over 3 devices run by `tandem run` reports, for each stage,
// its measured wall and compute (CPU) time per microbatch beside the plan's prediction.
// The ratios are printed, not asserted: tests assert no timings, and under a loaded
// `ctest -j2` the profile taken inside this test overstated a one-layer stage up to 5x
// (cpu/predicted 0.20-0.29 in 6 of 12 runs). scripts/partition-figures measures them.
TEST(CliTest, RunReportsThePlansPredictionPerStage) {
  const std::string dir = ::testing::TempDir();
  const std::string profile = dir + "cli_predict_profile.json", job = dir + "cli_predict.yaml";
  const std::string cluster = std::string(TANDEM_SOURCE_DIR) + "/examples/clusters/local.yaml";
  // Profiled with a second copy training beside it: three stages keep two cores busy.
  ASSERT_EQ(
      run("profile --model " + kModels + "cnn.yaml --batch 8 --repeats 5 --load 1 --out " + profile)
          .code,
      0);
  std::ofstream(job) << "model: " << kModels << "cnn.yaml\ntrain_limit: 1024\ntest_limit: 64\n"
                     << "batch: 32\nmicrobatches: 4\npartition: auto\ncluster: " << cluster
                     << "\nprofile: " << profile << "\n";
  const CliRun r = run("run " + job);
  ASSERT_EQ(r.code, 0) << r.out;
  std::istringstream lines(r.out.substr(r.out.find("\nstage  ")));
  std::string line;
  std::getline(lines, line);  // the blank line
  std::getline(lines, line);  // the header
  int stages = 0;
  while (std::getline(lines, line) && !line.empty() && std::isdigit(line[0])) {
    // The row's first fields name it; its last four are ms/micro, cpu ms, all cpu and
    // predicted.
    std::istringstream f(line);
    std::vector<std::string> fields;
    for (std::string field; f >> field;) fields.push_back(field);
    ASSERT_GE(fields.size(), 7u) << line;
    const std::string &stage = fields[0], &from = fields[1], &to = fields[2];
    // A tensor-split stage's other ranks ("0/t1") follow its row: not stages.
    if (stage.find('/') != std::string::npos) continue;
    const size_t n = fields.size();
    const double wall = std::stod(fields[n - 4]), cpu = std::stod(fields[n - 3]),
                 all_cpu = std::stod(fields[n - 2]), predicted = std::stod(fields[n - 1]);
    std::printf("stage %s %s %s: cpu/predicted %.2f, wall/predicted %.2f\n", stage.c_str(),
                from.c_str(), to.c_str(), cpu / predicted, wall / predicted);
    EXPECT_EQ(stage, std::to_string(stages)) << line;
    EXPECT_GT(cpu, 0) << line;
    EXPECT_GT(predicted, 0) << line;
    EXPECT_GE(wall, cpu * 0.5) << line;      // compute is part of the stage's wall time
    EXPECT_GE(all_cpu, cpu * 0.99) << line;  // the compute thread is one of the worker's
    ++stages;
  }
  // One row per planned stage. How many the plan has depends on the profile taken above
  // under load: a device that would slow the step is rightly left out (2 of 3 seen in CI).
  const size_t planned = r.out.find("partition: auto: ");
  ASSERT_NE(planned, std::string::npos) << r.out;
  const int planned_stages = std::atoi(r.out.c_str() + planned + 17);
  EXPECT_GE(planned_stages, 1) << r.out;
  EXPECT_EQ(stages, planned_stages) << r.out;
  // The mean step beside the plan's prediction, and each worker's memory beside its model.
  for (const char* s : {"step: measured ", "measured / predicted ",
                        "memory MiB per worker: tensors at peak / predicted"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

// Per-link codecs reach the wire: a plan that sends int8 activations on its first link
// and fp16 gradients on its second (a job with `codec: auto` takes the plan's) sends
// 0.26x and 0.5x of fp32's bytes on exactly those, the same elsewhere, and trains to a
// loss within 5% of the same run in fp32; a job that fixes a codec overrides the plan.
TEST(CliTest, EachLinkCarriesThePlansCodecs) {
  const std::string dir = tandem::testing::freshDir("cli-link-codecs");
  auto plan = [&](const std::string& name, const std::string& first, const std::string& second) {
    std::ofstream(dir + "/" + name)
        << "stages:\n"
        << "  - {layers: [0, 3], devices: [local/cpu0], backend: cpu" << first << "}\n"
        << "  - {layers: [3, 5], devices: [local/cpu1], backend: cpu" << second << "}\n"
        << "  - {layers: [5, 6], devices: [local/cpu2], backend: cpu}\n";
  };
  plan("exact.yaml", "", "");
  plan("coded.yaml", ", codec: {activations: int8, gradients: fp32}",
       ", codec: {activations: fp32, gradients: fp16}");
  auto job = [&](const std::string& name, const std::string& partition, const std::string& codec) {
    std::ofstream(dir + "/" + name)
        << "model: " << kModels << "mlp.yaml\ntrain_limit: 2048\ntest_limit: 64\nbatch: 32\n"
        << "microbatches: 4\npartition: " << dir << "/" << partition << "\n"
        << codec;
    return run("run " + dir + "/" + name);
  };
  const CliRun exact = job("exact-job.yaml", "exact.yaml", "");
  ASSERT_EQ(exact.code, 0) << exact.out;
  EXPECT_NE(exact.out.find("microbatches of a 32-sample batch, fp32 over ipc"), std::string::npos)
      << exact.out;
  const CliRun coded =
      job("coded-job.yaml", "coded.yaml", "codec: {activations: auto, gradients: auto}\n");
  ASSERT_EQ(coded.code, 0) << coded.out;
  EXPECT_NE(coded.out.find("0->1 int8/fp32, 1->2 fp32/fp16 over ipc"), std::string::npos)
      << coded.out;
  const std::vector<double> a = megabytesSent(exact.out), b = megabytesSent(coded.out);
  ASSERT_EQ(a.size(), 3u) << exact.out;
  ASSERT_EQ(b.size(), 3u) << coded.out;
  // Stage 0 sends activations only (int8: 1 byte a value and a scale per 256), stage 1
  // fp32 both ways, stage 2 gradients only (fp16).
  EXPECT_NEAR(b[0] / a[0], 0.258, 0.03) << exact.out << coded.out;
  EXPECT_NEAR(b[1] / a[1], 1.0, 0.02) << exact.out << coded.out;
  EXPECT_NEAR(b[2] / a[2], 0.5, 0.03) << exact.out << coded.out;
  auto loss = [](const std::string& out) {
    const size_t at = out.find("epoch 1/1: train loss ");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 22));
  };
  ASSERT_GT(loss(exact.out), 0) << exact.out;
  EXPECT_NEAR(loss(coded.out), loss(exact.out), 0.05 * loss(exact.out)) << coded.out;
  // The job fixes its activations: fp16 on every link, the plan's gradients kept.
  const CliRun fixed = job("fixed-job.yaml", "coded.yaml", "codec: {activations: fp16}\n");
  ASSERT_EQ(fixed.code, 0) << fixed.out;
  EXPECT_NE(fixed.out.find("0->1 fp16/fp32, 1->2 fp16 over ipc"), std::string::npos) << fixed.out;
}

// tandem profile --links: each node's daemon (here a tandemd on loopback started for each
// node without an address) measures every ordered pair over tcp (and within each node);
// the profile validates against the schema, and a cluster naming it partitions with the
// measured links. Nodes on 127.0.0.1 and 127.0.0.2 (both loopback) bind different
// addresses, as two hosts would.
TEST(CliTest, ProfileLinksMeasuresEveryPairOfNodes) {
  const std::string dir = ::testing::TempDir();
  const std::string cluster = dir + "cli_links_cluster.yaml", links = dir + "cli_links.json";
  std::ofstream(cluster) << "nodes:\n"
                            "  - {name: edge, devices: [{name: cpu, backend: cpu}]}\n"
                            "  - {name: cloud, host: 127.0.0.2, devices: [{name: cpu, backend: "
                            "cpu}]}\n"
                            "links: {measured: cli_links.json}\n";
  const CliRun r = run("profile --links --cluster " + cluster +
                       " --link-bytes 65536 --link-repeats 3 --out " + links);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"links over tcp (65536-byte messages)", "edge -> cloud", "cloud -> edge",
                        "edge -> edge", "cloud -> cloud", "wrote"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  const std::string check =
      "python3 -c \"import json, jsonschema; p = json.load(open('" + links +
      "')); jsonschema.validate(p, json.load(open('" TANDEM_SOURCE_DIR
      "/docs/profile.schema.json'))); m = p['links']['measured']; assert len(m) == 4; "
      "assert all(0 < l['sender_share'] < 1 for l in m if l['from'] != l['to'])\" 2>&1";
  EXPECT_EQ(std::system(check.c_str()), 0) << check;
  // Each pair says what its sending end spent of the CPU its bytes cost.
  EXPECT_NE(r.out.find("link edge -> cloud: the sender edge spends"), std::string::npos) << r.out;

  const std::string profile = dir + "cli_links_profile.json";
  ASSERT_EQ(run("profile --model " + kModels + "mlp.yaml --batch 8 --repeats 1 --warmup 0 --out " +
                profile)
                .code,
            0);
  const CliRun plan = run("partition --model " + kModels + "mlp.yaml --cluster " + cluster +
                          " --profile " + profile + " --batch 16");
  ASSERT_EQ(plan.code, 0) << plan.out;
  EXPECT_NE(plan.out.find("plan for mlp on"), std::string::npos) << plan.out;

  // A node on another host needs its daemon's address; nothing is started for it here.
  const std::string remote = dir + "cli_links_remote.yaml";
  std::ofstream(remote) << "nodes: [{name: far, host: 192.0.2.1, devices: [{backend: cpu}]}]\n";
  const CliRun wait = run("profile --links --cluster " + remote + " --link-timeout 1");
  EXPECT_EQ(wait.code, 1) << wait.out;
  EXPECT_NE(wait.out.find("cli_links_remote.yaml:1:9: node 'far' on 192.0.2.1 has no 'address'"),
            std::string::npos)
      << wait.out;
  const CliRun alone = run("profile --links");
  EXPECT_EQ(alone.code, 1);
  EXPECT_NE(alone.out.find("--links needs --cluster"), std::string::npos) << alone.out;
  const CliRun nothing = run("profile");
  EXPECT_NE(nothing.out.find("profile needs --model"), std::string::npos) << nothing.out;
}

}  // namespace
