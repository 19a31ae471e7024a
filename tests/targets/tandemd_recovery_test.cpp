// Runs through daemons that are interrupted, resumed from a checkpoint, lose a node, get it
// back, or lose a stage while serving: each ends as the uninterrupted run does (bitwise),
// or says why not, and leaves no process behind.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/endpoint.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "tests/process_util.h"
#include "tests/runtime/flood.h"
#include "tests/targets/tandemd_util.h"
#include "tests/test_util.h"

namespace {

using namespace std::chrono_literals;
using namespace tandem::testing::daemons;

// SIGINT or SIGTERM to `tandem run`, while its workers start and mid-epoch: it says it
// was interrupted, exits 130, and leaves no process behind (its workers, the tandemd it
// started: found by the node's unique name) and nothing in /tmp named after the run.
TEST(TandemdTest, AnInterruptedRunSaysSoAndLeavesNothingBehind) {
  const std::string dir = tandem::testing::freshDir("interrupt");
  const std::string node = "interrupt-" + std::to_string(getpid());
  std::ofstream(dir + "/c.yaml") << "nodes: [{name: " << node << ", devices: [{}]}]\n";
  const std::string job = writeJob(dir, "job", "epochs: 50\ncluster: c.yaml\n");
  struct Case {
    int signal;
    const char* after;  // what the run has printed when the signal is sent
  } cases[] = {{SIGINT, "pid "}, {SIGTERM, "first step done"}, {SIGINT, "epoch 1/50 step "}};
  for (const Case& c : cases) {
    Background r("exec " + kCli + " run " + job, dir + "/run.log");
    ASSERT_TRUE(r.waitFor(c.after, 60s)) << r.output();
    const std::vector<pid_t> workers = stagePids(r.output());
    ASSERT_FALSE(processesWith("--name " + node).empty()) << "no tandemd for the run";
    r.signal(c.signal);
    EXPECT_EQ(r.wait(30s), 130) << r.output();
    const std::string out = r.output();
    EXPECT_NE(out.find(std::string("interrupted by ") +
                       (c.signal == SIGINT ? "SIGINT" : "SIGTERM") + ": every worker was stopped"),
              std::string::npos)
        << out;
    for (pid_t w : workers) {
      for (int i = 0; i < 500 && !tandem::testing::processGone(w); ++i)
        std::this_thread::sleep_for(10ms);
      EXPECT_TRUE(tandem::testing::processGone(w)) << "worker " << w << " outlived the run";
    }
    EXPECT_TRUE(processesWith("--name " + node).empty()) << "the run's tandemd outlived it";
  }
  // While saving: a model wide enough (13 M parameters and their momentum, 100 MB) that
  // its save takes a good part of a second. The signal lets the save finish whole (never a
  // half-written file), then the run ends with 130.
  std::ofstream(dir + "/wide.yaml")
      << "name: wide\ninput: [1, 28, 28]\nlayers:\n  - flatten\n"
      << "  - linear: {out: 16384}\n  - relu\n  - linear: {out: 10}\n";
  std::ofstream(dir + "/saving.yaml")
      << "model: wide.yaml\nbatch: 32\nmicrobatches: 2\npartition: equal\nstages: 2\n"
      << "epochs: 1\ntrain_limit: 64\ntest_limit: 32\ncluster: c.yaml\nsave: out/m.tdm\n";
  {
    Background r("exec " + kCli + " run " + dir + "/saving.yaml", dir + "/run.log");
    ASSERT_TRUE(r.waitFor("saving the trained model to ", 60s)) << r.output();
    r.signal(SIGINT);
    EXPECT_EQ(r.wait(30s), 130) << r.output();
    EXPECT_NE(r.output().find("interrupted by SIGINT after the workers had finished; the model "
                              "was saved whole"),
              std::string::npos)
        << r.output();
    EXPECT_EQ(tandem::readModelFile(dir + "/out/m.tdm").params.size(), 4u);
    for (const auto& e : std::filesystem::directory_iterator(dir + "/out"))
      EXPECT_EQ(e.path().filename(), "m.tdm") << "left behind: " << e.path();
    EXPECT_TRUE(processesWith("--name " + node).empty()) << "the run's tandemd outlived it";
  }
  for (const auto& e : std::filesystem::directory_iterator("/tmp"))
    EXPECT_EQ(e.path().filename().string().find("tandem-run-"), std::string::npos) << e.path();
}

// Checkpoints and --resume: a run resumed from any usable checkpoint — on another split
// and schedule, after a damaged newer checkpoint, after SIGINT or SIGKILL of `tandem run`
// itself — saves bitwise the model of the run that was never interrupted.
TEST(TandemdTest, ARunResumedFromACheckpointEndsBitwiseAsTheUninterruptedOne) {
  const std::string dir = tandem::testing::freshDir("resume");
  auto job = [&](const std::string& name, const std::string& extra) {
    std::ofstream(dir + "/" + name + ".yaml")
        << "model: " << TANDEM_SOURCE_DIR << "/examples/models/mlp.yaml\n"
        << "batch: 32\nmicrobatches: 4\nseed: 3\nepochs: 2\ntrain_limit: 640\ntest_limit: 64\n"
        << "optimizer: {kind: adamw, lr: 0.001}\n"
        << "checkpoint: {every_steps: 3, keep: 3, dir: ck-" << name << "}\n"
        << "save: out/" << name << ".tdm\n"
        << extra;
    return dir + "/" + name + ".yaml";
  };
  const std::string full = job("full", "partition: equal\nstages: 2\n");
  Ran r = run(kCli + " run " + full);
  ASSERT_EQ(r.code, 0) << r.out;
  // 40 steps: checkpoints at 3, 6, ..., 39; the newest three kept.
  for (const char* step : {"33", "36", "39"}) {
    EXPECT_TRUE(
        std::filesystem::exists(dir + "/ck-full/step-0000000000" + std::string(step) + ".tdm"))
        << step;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/ck-full/step-000000000030.json"));
  const std::string want = slurp(dir + "/out/full.tdm");
  ASSERT_FALSE(want.empty());

  // From step 36 (the newest, 39, removed) on three stages with GPipe.
  std::filesystem::copy(dir + "/ck-full", dir + "/from36");
  std::filesystem::remove(dir + "/from36/step-000000000039.json");
  const std::string split = job("split", "partition: equal\nstages: 3\nschedule: gpipe\n");
  r = run(kCli + " run " + split + " --resume " + dir + "/from36");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resuming from " + dir + "/from36/step-000000000036.tdm (step 36)"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(slurp(dir + "/out/split.tdm") == want) << "resumed on 3 stages: not bitwise";

  // The newest checkpoint damaged: named, passed over, the one before it used.
  std::filesystem::copy(dir + "/ck-full", dir + "/damaged");
  {
    std::fstream f(dir + "/damaged/step-000000000039.tdm",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000);
    f.put('\x7f');
  }
  const std::string again = job("again", "partition: equal\nstages: 2\n");
  r = run(kCli + " run " + again + " --resume " + dir + "/damaged");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("checkpoint at step 39 in " + dir + "/damaged is damaged, passed over: "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("(step 36)"), std::string::npos) << r.out;
  EXPECT_TRUE(slurp(dir + "/out/again.tdm") == want) << "resumed past a damaged one: not bitwise";

  // A job that differs from the checkpoint's is refused, naming the setting.
  const std::string other = job("other", "partition: equal\nstages: 2\nbatch: 64\n");
  r = run(kCli + " run " + other + " --resume " + dir + "/ck-full");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("was taken with batch 32, the job has 64"), std::string::npos) << r.out;

  // tandem run itself stopped: SIGINT (it says where to resume from), and SIGKILL.
  for (int sig : {SIGINT, SIGKILL}) {
    const std::string name = sig == SIGINT ? "int" : "kill";
    const std::string stopped = job(name, "partition: equal\nstages: 2\n");
    {
      Background b("exec " + kCli + " run " + stopped, dir + "/" + name + ".log");
      ASSERT_TRUE(b.waitFor("checkpoint at step 3:", 60s)) << b.output();
      b.signal(sig);
      const int code = b.wait(30s);
      if (sig == SIGINT) {
        EXPECT_EQ(code, 130) << b.output();
        EXPECT_NE(b.output().find("the newest checkpoint is "), std::string::npos) << b.output();
      }
    }
    r = run(kCli + " run " + stopped + " --resume " + dir + "/ck-" + name);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out.find("(step 39)"), std::string::npos) << "the run was not stopped early";
    EXPECT_TRUE(slurp(dir + "/out/" + name + ".tdm") == want)
        << "resumed after " << name << ": not bitwise";
  }
}

// Unequal replicas of the whole model set their shares from their first steps' speed:
// a run resumed after that cuts its batches by the shares its checkpoint carries, and
// gives each replica the microbatches it had (3 microbatches a step for 2 replicas, and
// resumed at step 33: an odd number of microbatches before it), so it saves bitwise the
// model of the run that was never interrupted.
TEST(TandemdTest, UnequalReplicasResumedFromACheckpointEndBitwiseAsTheUninterruptedRun) {
  const std::string dir = tandem::testing::freshDir("resume-shares");
  auto job = [&](const std::string& name,
                 const std::string& partition = "[{layers: [0, 6], replicas: 2, shares: [7, 1]}]") {
    std::ofstream(dir + "/" + name + ".yaml")
        << "model: " << TANDEM_SOURCE_DIR << "/examples/models/mlp.yaml\n"
        << "batch: 32\nmicrobatches: 3\nseed: 3\nepochs: 2\ntrain_limit: 640\ntest_limit: 64\n"
        << "optimizer: {kind: adamw, lr: 0.001}\n"
        << "partition: " << partition << "\n"
        << "checkpoint: {every_steps: 3, keep: 3, dir: ck-" << name << "}\n"
        << "save: out/" << name << ".tdm\n";
    return dir + "/" + name + ".yaml";
  };
  Ran r = run(kCli + " run " + job("full"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the shares were set from the replicas' speed measured in steps 1 to 3"),
            std::string::npos)
      << r.out;
  const std::string want = slurp(dir + "/out/full.tdm");
  ASSERT_FALSE(want.empty());
  const std::string manifest = slurp(dir + "/ck-full/step-000000000033.json");
  EXPECT_NE(manifest.find("\"replicas\""), std::string::npos) << manifest;

  std::filesystem::copy(dir + "/ck-full", dir + "/from33");
  for (const char* step : {"36", "39"})
    std::filesystem::remove(dir + "/from33/step-0000000000" + std::string(step) + ".json");
  r = run(kCli + " run " + job("resumed") + " --resume " + dir + "/from33");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s :
       {"resuming from ", "(step 33)", "replicas' shares from the checkpoint at step 33: ",
        "the shares the checkpoint at step 33 carried throughout"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  EXPECT_TRUE(slurp(dir + "/out/resumed.tdm") == want) << "resumed replicas: not bitwise";

  // Resumed without replicas, the shares have nothing to cut: said, and the run goes on.
  r = run(kCli + " run " + job("alone", "[[0, 6]]") + " --resume " + dir + "/from33");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the checkpoint at step 33 carries the shares of replicas on "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("this run has no replicas of the whole model"), std::string::npos) << r.out;
}

// Losing a node mid-run: the run leaves it out, plans the job's layers over the nodes
// left with the partitioner (its equal split was made for three), resumes from the
// newest checkpoint and saves bitwise the model of a run that lost nothing. Without
// restarts left it ends naming the node, as before.
// A job of examples/models/MODEL.yaml in three equal stages on the cluster file
// `cluster` (in `dir`), batch 32 in 4 microbatches, seed 3, with `data` (epochs and
// limits) and `extra`, saving out/NAME.tdm; its path.
std::string threeStageJob(const std::string& dir, const std::string& name, const std::string& model,
                          const std::string& data, const std::string& cluster,
                          const std::string& extra) {
  std::ofstream(dir + "/" + name + ".yaml")
      << "model: " << TANDEM_SOURCE_DIR << "/examples/models/" << model << ".yaml\n"
      << "batch: 32\nmicrobatches: 4\nseed: 3\ntest_limit: 64\n"
      << data << "partition: equal\nstages: 3\ncluster: " << cluster << "\nsave: out/" << name
      << ".tdm\n"
      << extra;
  return dir + "/" + name + ".yaml";
}

// DIR/abc.yaml: nodes a, b and c at these daemons' addresses, with the key DIR/c.key.
void writeAbcCluster(const std::string& dir, const std::string& a, const std::string& b,
                     const std::string& c) {
  std::ofstream(dir + "/abc.yaml") << "key: c.key\nnodes:\n"
                                   << "  - {name: a, address: '" << a << "', devices: [{}]}\n"
                                   << "  - {name: b, address: '" << b << "', devices: [{}]}\n"
                                   << "  - {name: c, address: '" << c << "', devices: [{}]}\n";
}

// DIR/c.yaml: local nodes a-TAG, b-TAG and c-TAG of one device each (this machine's
// daemons, named so that a test can kill one).
void writeTaggedNodes(const std::string& dir, const std::string& tag) {
  std::ofstream(dir + "/c.yaml") << "nodes:\n  - {name: a-" << tag << ", devices: [{}]}\n"
                                 << "  - {name: b-" << tag << ", devices: [{}]}\n"
                                 << "  - {name: c-" << tag << ", devices: [{}]}\n";
}

// What `job` saves at `saved` when nothing goes wrong ("" if the run failed).
std::string uninterrupted(const std::string& job, const std::string& saved) {
  const Ran r = run(kCli + " run " + job);
  EXPECT_EQ(r.code, 0) << r.out;
  return r.code == 0 ? slurp(saved) : "";
}

TEST(TandemdTest, ARunThatLosesANodeRecoversOnTheOthersBitwise) {
  const std::string dir = tandem::testing::freshDir("recover");
  const std::string tag = std::to_string(getpid());
  writeTaggedNodes(dir, tag);
  auto job = [&](const std::string& name, const std::string& extra) {
    return threeStageJob(dir, name, "mlp", "epochs: 2\ntrain_limit: 1280\n", "c.yaml", extra);
  };
  const std::string want = uninterrupted(job("whole", ""), dir + "/out/whole.tdm");
  ASSERT_FALSE(want.empty());
  const std::string b = "--name b-" + tag;
  {
    Background run(
        "exec " + kCli + " run " + job("lossy", "checkpoint: {every_steps: 3, dir: ck}\n"),
        dir + "/lossy.log");
    ASSERT_TRUE(run.waitFor("checkpoint at step 6:", 60s)) << run.output();
    ASSERT_TRUE(killTheOneProcessWith(b)) << "node b's tandemd";
    EXPECT_EQ(run.wait(60s), 0) << run.output();
    const std::string out = run.output();
    for (const std::string& s :
         {"was lost with node 'b-" + tag + "'",
          "recovering (1 of 3 restarts): node 'b-" + tag + "' is left out; resuming from step ",
          "partition: the job's equal split re-planned by the partitioner over the 2 nodes "
          "left (a-" +
              tag + ", c-" + tag + "): [0, ",
          "stages on a-" + tag + ", c-" + tag, std::string("training again ")})
      EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out;
  }
  EXPECT_TRUE(slurp(dir + "/out/lossy.tdm") == want) << "recovered run: not bitwise";
  // No restarts allowed: the loss ends the run, named.
  {
    Background run("exec " + kCli + " run " +
                       job("fragile", "checkpoint: {every_steps: 3, dir: ck2}\nmax_restarts: 0\n"),
                   dir + "/fragile.log");
    ASSERT_TRUE(run.waitFor("checkpoint at step 6:", 60s)) << run.output();
    ASSERT_TRUE(killTheOneProcessWith(b)) << "node b's tandemd";
    EXPECT_EQ(run.wait(60s), 1) << run.output();
    EXPECT_NE(run.output().find("was lost with node 'b-" + tag + "'"), std::string::npos)
        << run.output();
    EXPECT_NE(run.output().find("the newest checkpoint is "), std::string::npos) << run.output();
  }
  for (const char* node : {"a-", "b-", "c-"})
    EXPECT_TRUE(processesWith("--name " + std::string(node) + tag).empty()) << node;
}

// The last epoch's test loss a run printed ("... test loss 0.4321, ..."), or -1.
double lastTestLoss(const std::string& out) {
  const size_t at = out.rfind("test loss ");
  return at == std::string::npos ? -1 : std::atof(out.c_str() + at + 10);
}

// Losing the node of a tensor-split stage (its ranks are one worker there): the run leaves
// the node out, re-plans the layers over the nodes left, resumes from the checkpoint the
// split stage wrote (its ranks' slices merged) and ends. Not bitwise the uninterrupted
// run: the split's all-reduces round the sums its way (docs/tensor-parallel.md), and the
// re-plan splits nothing; its test loss is within 2% of that run's.
TEST(TandemdTest, ARunThatLosesATensorSplitStagesNodeRecoversOnTheOthers) {
  const std::string dir = tandem::testing::freshDir("recover-tensor");
  const std::string tag = std::to_string(getpid());
  writeTaggedNodes(dir, tag);
  auto job = [&](const std::string& name, const std::string& extra) {
    std::ofstream(dir + "/" + name + ".yaml")
        << "model: " << TANDEM_SOURCE_DIR << "/examples/models/mlp.yaml\n"
        << "batch: 32\nmicrobatches: 4\nseed: 3\ntest_limit: 256\nepochs: 2\ntrain_limit: 1280\n"
        << "partition: [[0, 1], {layers: [1, 4], tensor: 2}, [4, 6]]\ncluster: c.yaml\n"
        << "save: out/" << name << ".tdm\n"
        << extra;
    return dir + "/" + name + ".yaml";
  };
  const Ran whole = run(kCli + " run " + job("whole", ""));
  ASSERT_EQ(whole.code, 0) << whole.out;
  EXPECT_NE(whole.out.find("stage 1: 2 tensor ranks (feature shares 1 : 1)"), std::string::npos)
      << whole.out;
  const double want = lastTestLoss(whole.out);
  ASSERT_GT(want, 0) << whole.out;
  Background lossy(
      "exec " + kCli + " run " + job("lossy", "checkpoint: {every_steps: 3, dir: ck}\n"),
      dir + "/lossy.log");
  ASSERT_TRUE(lossy.waitFor("checkpoint at step 6:", 60s)) << lossy.output();
  ASSERT_TRUE(killTheOneProcessWith("--name b-" + tag)) << "node b's tandemd";
  EXPECT_EQ(lossy.wait(60s), 0) << lossy.output();
  const std::string out = lossy.output();
  for (const std::string& s :
       {"was lost with node 'b-" + tag + "'",
        "recovering (1 of 3 restarts): node 'b-" + tag + "' is left out; resuming from step ",
        std::string("training again ")})
    EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out;
  const double got = lastTestLoss(out);
  EXPECT_NEAR(got, want, 0.02 * want) << out;
  EXPECT_FALSE(slurp(dir + "/out/lossy.tdm").empty());
  for (const char* node : {"a-", "b-", "c-"})
    EXPECT_TRUE(processesWith("--name " + std::string(node) + tag).empty()) << node;
}

// Nodes left that cannot hold the model: the recovery ends the run naming them, what
// the model needs and what they have (mlp-deep's weights with their gradients and
// momentum, 20.6 MB, on three devices of 8.5 MiB in three stages; two of them hold 17.8 MB).
TEST(TandemdTest, ARecoveryOnNodesThatCannotHoldTheModelEndsNamingTheMemory) {
  const std::string dir = tandem::testing::freshDir("recover-memory");
  const std::string tag = std::to_string(getpid());
  std::ofstream(dir + "/c.yaml") << "nodes:\n  - {name: a-" << tag
                                 << ", devices: [{memory: 8704KiB}]}\n"
                                 << "  - {name: b-" << tag << ", devices: [{memory: 8704KiB}]}\n"
                                 << "  - {name: c-" << tag << ", devices: [{memory: 8704KiB}]}\n";
  std::ofstream(dir + "/j.yaml") << "model: " << TANDEM_SOURCE_DIR
                                 << "/examples/models/mlp-deep.yaml\n"
                                 << "batch: 32\nmicrobatches: 4\nseed: 3\ntest_limit: 64\n"
                                 << "epochs: 2\ntrain_limit: 1280\n"
                                 << "partition: [[0, 4], [4, 8], [8, 14]]\ncluster: c.yaml\n"
                                 << "checkpoint: {every_steps: 3, dir: ck}\n";
  Background run("exec " + kCli + " run " + dir + "/j.yaml", dir + "/j.log");
  ASSERT_TRUE(run.waitFor("checkpoint at step 6:", 60s)) << run.output();
  ASSERT_TRUE(killTheOneProcessWith("--name b-" + tag)) << "node b's tandemd";
  EXPECT_EQ(run.wait(60s), 1) << run.output();
  for (const std::string& s :
       {"recovering (1 of 3 restarts): node 'b-" + tag + "' is left out",
        "the 2 nodes left (a-" + tag + ", c-" + tag + ") cannot hold the job's stages: ",
        std::string("found no split of the 14 layers over the 2 devices that fits in memory: "
                    "the model needs more than "),
        std::string("the devices have 17825792 in all")})
    EXPECT_NE(run.output().find(s), std::string::npos) << s << "\n" << run.output();
  for (const char* node : {"a-", "b-", "c-"})
    EXPECT_TRUE(processesWith("--name " + std::string(node) + tag).empty()) << node;
}

// A recovery gets through floods on the daemons that survive, from a peer without the
// key: 300 idle connections on one (more than the 256 a daemon lets one address keep
// waiting: the oldest are closed and reopened all the while), and 100 that each sent a byte
// and stalled on the other, from before the run starts to after it ends. The node killed
// mid-run is left out, the run resumes from its checkpoint on the flooded daemons and
// saves bitwise what the run that lost nothing saves.
TEST(TandemdTest, ARecoveryGetsThroughFloodsOnTheSurvivingDaemons) {
  const std::string dir = tandem::testing::freshDir("recover-flood");
  ASSERT_EQ(run(kCli + " keygen --cluster --out " + dir + "/c").code, 0);
  const std::string key = dir + "/c.key";
  DaemonProcess a(dir, key, "a"), c(dir, key, "c");
  auto b = std::make_unique<DaemonProcess>(dir, key, "b");
  writeAbcCluster(dir, a.address(), b->address(), c.address());
  auto job = [&](const std::string& name, const std::string& extra) {
    return threeStageJob(dir, name, "mlp", "epochs: 2\ntrain_limit: 1280\n", "abc.yaml", extra);
  };
  const std::string want = uninterrupted(job("whole", ""), dir + "/out/whole.tdm");
  ASSERT_FALSE(want.empty());
  tandem::testing::IdleFlood idle(tandem::parseEndpoint(a.address()), 300);
  tandem::testing::IdleFlood stalled(tandem::parseEndpoint(c.address()), 100,
                                     /*first_byte=*/true);
  Background lossy(
      "exec " + kCli + " run " + job("lossy", "checkpoint: {every_steps: 3, dir: ck}\n"),
      dir + "/lossy.log");
  ASSERT_TRUE(lossy.waitFor("checkpoint at step 6:", 60s)) << lossy.output();
  b->kill9();
  EXPECT_EQ(lossy.wait(120s), 0) << lossy.output() << "\nnode a:\n" << a.log();
  const std::string out = lossy.output();
  for (const std::string& s :
       {std::string("recovering (1 of 3 restarts): node 'b' is left out; resuming from step "),
        std::string("re-planned by the partitioner over the 2 nodes left (a, c)"),
        std::string("stages on a, c"), std::string("training again ")})
    EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out;
  EXPECT_TRUE(slurp(dir + "/out/lossy.tdm") == want) << "recovered under a flood: not bitwise";
  EXPECT_GT(idle.reopened(), 0u) << "the flood did not go on through the run";
}

TEST(TandemdTest, ALostNodeThatComesBackRejoinsAtACheckpointAndAgainLaterBitwise) {
  const std::string dir = tandem::testing::freshDir("rejoin");
  ASSERT_EQ(run(kCli + " keygen --cluster --out " + dir + "/c").code, 0);
  const std::string key = dir + "/c.key";
  DaemonProcess a(dir, key, "a"), c(dir, key, "c");
  auto b = std::make_unique<DaemonProcess>(dir, key, "b");
  const std::string b_address = b->address();
  writeAbcCluster(dir, a.address(), b_address, c.address());
  auto job = [&](const std::string& name, const std::string& extra) {
    return threeStageJob(dir, name, "cnn", "epochs: 1\ntrain_limit: 3200\nschedule: gpipe\n",
                         "abc.yaml", extra);
  };
  const std::string want = uninterrupted(job("whole", ""), dir + "/out/whole.tdm");
  ASSERT_FALSE(want.empty());
  Background lossy("exec " + kCli + " run " +
                       job("lossy", "checkpoint: {every_steps: 5, dir: ck}\nrejoin_after_s: 0.5\n"),
                   dir + "/lossy.log");
  auto waitFor = [&](const std::string& text, size_t times) {
    return lossy.waitFor(text, 60s, times);
  };
  ASSERT_TRUE(waitFor("checkpoint at step 10:", 1)) << lossy.output();
  b->kill9();
  ASSERT_TRUE(
      waitFor("membership: node 'b' left (lost 1 time); tried again at a checkpoint "
              "after 0.5 s",
              1))
      << lossy.output();
  b = std::make_unique<DaemonProcess>(dir, key, "b", b_address);  // back, where it was
  ASSERT_TRUE(waitFor("membership: node 'b' rejoins at the checkpoint at step ", 1))
      << lossy.output();
  // Lost again once it trains: left out for twice as long.
  ASSERT_TRUE(waitFor("training again ", 2)) << lossy.output();
  b->kill9();
  EXPECT_EQ(lossy.wait(120s), 0) << lossy.output();
  const std::string out = lossy.output();
  for (const std::string& s :
       {std::string("re-planned by the partitioner over the 2 nodes left (a, c)"),
        std::string("rejoins at the checkpoint at step "),
        std::string("3 stages on a, b, c"),  // the job's own ranges again
        std::string("after node 'b' rejoined"),
        std::string("membership: node 'b' left (lost 2 times); tried again at a checkpoint "
                    "after 1.0 s")})
    EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out;
  EXPECT_TRUE(slurp(dir + "/out/lossy.tdm") == want) << "run with a rejoin: not bitwise";
}

TEST(TandemdTest, AStreamThatLosesAStageAnswersEveryRequestOnceAsWithoutTheLoss) {
  const std::string dir = tandem::testing::freshDir("recover-infer");
  const std::string tag = std::to_string(getpid());
  writeTaggedNodes(dir, tag);
  std::ofstream(dir + "/serve.yaml")
      << "model: " << TANDEM_SOURCE_DIR << "/examples/models/mlp.yaml\n"
      << "batch: 32\nmicrobatches: 4\nseed: 3\ntest_limit: 2000\n"
      << "partition: equal\nstages: 3\ncluster: c.yaml\n";
  const std::string serve = kCli + " infer " + dir + "/serve.yaml --answers " + dir;
  Ran r = run(serve + "/whole.txt");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string want = slurp(dir + "/whole.txt");
  ASSERT_EQ(std::count(want.begin(), want.end(), '\n'), 2000);
  // 252 requests at 100 a second: node b (stage 1) is killed with sample 400 answered,
  // ~2 s before the stream's end.
  Background stream("exec " + serve + "/lossy.txt --rate 100", dir + "/lossy.log");
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (slurp(dir + "/lossy.txt").find("\n400 ") == std::string::npos &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(killTheOneProcessWith("--name b-" + tag)) << "node b's tandemd";
  EXPECT_EQ(stream.wait(60s), 0) << stream.output();
  const std::string out = stream.output();
  for (const std::string& s :
       {"stage 1 was lost with node 'b-" + tag + "'",
        "recovering (1 of 3 restarts): node 'b-" + tag + "' is left out; resuming the stream",
        std::string("answering again "),
        std::string("2000 samples as 252 requests (microbatches of ~8), each answered once")})
    EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out;
  // Every sample answered once, each answer bitwise the fault-free one.
  EXPECT_TRUE(slurp(dir + "/lossy.txt") == want) << "answers differ from the fault-free stream";
  for (const char* node : {"a-", "b-", "c-"})
    EXPECT_TRUE(processesWith("--name " + std::string(node) + tag).empty()) << node;
}

}  // namespace
