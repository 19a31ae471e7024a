// `tandem run` across processes: one worker process per stage over tcp or ipc loopback
// gives bitwise the weights of single-device gradient accumulation; a killed stage ends
// the whole run promptly, named, with a non-zero exit and no process left behind; bad
// job files are refused before anything starts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/data/dataset.h"
#include "core/data/text.h"
#include "core/file.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "core/train/trainer.h"
#include "tests/pipeline/run_util.h"
#include "tests/process_util.h"
#include "tests/profile_util.h"
#include "transport/link_seal.h"
#include "transport/tcp/socket.h"
#include "transport/wire.h"

extern char** environ;

namespace tandem {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::kMlp;
using testing::Reference;
using testing::RunProcess;
using testing::singleDevice;
using testing::writeJob;

// The whole matrix of the issue: p = 2, 3, 4; m = 1, 2, 4, 8; GPipe and 1F1B; with and
// without recomputation; over tcp loopback (encrypted with the run's key) without
// recomputation, and over the transport a local run chooses (ipc) with it.
TEST(RunTest, StageProcessesMatchSingleDeviceAccumulationBitwise) {
  const int64_t train_limit = 300, batch = 32;
  const Dataset train = loadFashionMnist(kFashionMnistDir, true, train_limit);
  std::map<int64_t, Reference> reference;
  for (const int64_t m : {1, 2, 4, 8}) reference[m] = singleDevice(train, batch, m);
  const std::string model = ::testing::TempDir() + "/run_equal.tdm";
  int runs = 0;
  for (const int stages : {2, 3, 4})
    for (const int64_t m : {1, 2, 4, 8})
      for (const char* schedule : {"gpipe", "1f1b"})
        for (const bool recompute : {false, true}) {
          const std::string transport = recompute ? "" : "transport: tcp\n";
          const std::string config = std::string(schedule) + " p=" + std::to_string(stages) +
                                     " m=" + std::to_string(m) + (recompute ? " recompute " : " ") +
                                     transport;
          std::ostringstream body;
          body << "train_limit: " << train_limit << "\ntest_limit: 100\nepochs: 1\nbatch: " << batch
               << "\nmicrobatches: " << m << "\nschedule: " << schedule << "\n"
               << transport << "recompute: " << (recompute ? "true" : "false")
               << "\npartition: equal\nstages: " << stages << "\nseed: 3\nsave: " << model << "\n";
          std::filesystem::remove(model);
          RunProcess run(writeJob("run_equal", body.str()));
          ASSERT_EQ(run.wait(120s), 0) << config << "\n" << run.output();
          EXPECT_NE(run.output().find("bubble: measured"), std::string::npos) << run.output();
          EXPECT_NE(
              run.output().find(recompute ? "fp32 over ipc\n" : "fp32 over tcp (encrypted)\n"),
              std::string::npos)
              << run.output();
          const ModelFile saved = readModelFile(model);
          const auto& [weights, steps] = reference.at(m);
          ASSERT_EQ(saved.params.size(), weights.size()) << config;
          for (const HostTensor& t : saved.params) {
            ASSERT_EQ(weights.count(t.name), 1u) << t.name << ": " << config;
            ASSERT_EQ(t.data, weights.at(t.name)) << t.name << ": " << config;
          }
          ASSERT_TRUE(saved.optimizer.has_value()) << config;
          EXPECT_EQ(saved.optimizer->steps, steps) << config;
          ++runs;
        }
  EXPECT_EQ(runs, 48);
}

// torchvision's resnet18 (examples/models/resnet18.yaml: batch norms on each
// microbatch's statistics, downsample projections with theirs) trained across 3 stage
// processes ends bitwise where one device accumulating the same microbatches does: the
// weights, the running statistics and the optimizer's steps.
TEST(RunTest, Resnet18AcrossThreeStageProcessesIsBitwiseOneDevice) {
  const int64_t train_limit = 128, batch = 32;  // whole batches: >= 2 samples a microbatch
  const std::string spec = TANDEM_SOURCE_DIR "/examples/models/resnet18.yaml";
  const Dataset train = loadFashionMnist(kFashionMnistDir, true, train_limit);
  const std::string model = ::testing::TempDir() + "/run_resnet18.tdm";
  for (const int64_t m : {2, 4}) {
    const std::string config = "m=" + std::to_string(m);
    const Reference want = singleDevice(train, batch, m, {}, spec);
    const std::string job = ::testing::TempDir() + "/run_resnet18.yaml";
    std::ofstream(job) << "model: " << spec << "\ntrain_limit: " << train_limit
                       << "\ntest_limit: 64\nepochs: 1\nbatch: " << batch << "\nmicrobatches: " << m
                       << "\nschedule: 1f1b\npartition: equal\nstages: 3\nseed: 3\nsave: " << model
                       << "\n";
    std::filesystem::remove(model);
    RunProcess run(job);
    ASSERT_EQ(run.wait(300s), 0) << config << "\n" << run.output();
    const ModelFile saved = readModelFile(model);
    ASSERT_EQ(saved.params.size(), want.weights.size()) << config;
    ASSERT_EQ(want.weights.count("8.proj.1.running_var"), 1u);
    for (const HostTensor& t : saved.params) {
      ASSERT_EQ(want.weights.count(t.name), 1u) << t.name << ": " << config;
      ASSERT_EQ(t.data, want.weights.at(t.name)) << t.name << ": " << config;
    }
    ASSERT_TRUE(saved.optimizer.has_value()) << config;
    EXPECT_EQ(saved.optimizer->steps, want.steps) << config;
  }
}

// Interleaved stages across processes: each holds several chunks of the model, the last
// stage's links reaching back to the first; the saved weights and optimizer steps are
// still single-device accumulation's, bitwise (a microbatch count the stages do not
// divide among them; one configuration over ipc).
TEST(RunTest, InterleavedStageProcessesMatchSingleDeviceAccumulationBitwise) {
  const int64_t train_limit = 300, batch = 32;
  const Dataset train = loadFashionMnist(kFashionMnistDir, true, train_limit);
  const std::string model = ::testing::TempDir() + "/run_interleaved.tdm";
  struct Config {
    int stages, chunks;
    int64_t m;
    const char* transport;
    const char* layers;  // stage 1's row in the table
  };
  for (const Config& c :
       {Config{2, 2, 4, "tcp", "[2,4)+[5,6)"}, Config{3, 2, 4, "ipc", "[1,2)+[4,5)"},
        Config{2, 3, 2, "tcp", "[1,2)+[3,4)+[5,6)"}}) {
    const std::string config = "p=" + std::to_string(c.stages) + " v=" + std::to_string(c.chunks) +
                               " m=" + std::to_string(c.m) + " " + c.transport;
    std::ostringstream body;
    body << "train_limit: " << train_limit << "\ntest_limit: 100\nepochs: 1\nbatch: " << batch
         << "\nmicrobatches: " << c.m << "\nschedule: interleaved\nchunks: " << c.chunks
         << "\ntransport: " << c.transport << "\npartition: equal\nstages: " << c.stages
         << "\nseed: 3\nsave: " << model << "\n";
    std::filesystem::remove(model);
    RunProcess run(writeJob("run_interleaved", body.str()));
    ASSERT_EQ(run.wait(120s), 0) << config << "\n" << run.output();
    EXPECT_NE(run.output().find("formula (p-1)/(vm+p-1)"), std::string::npos) << run.output();
    EXPECT_NE(run.output().find(std::string("\n1      ") + c.layers), std::string::npos)
        << config << "\n"
        << run.output();
    EXPECT_NE(run.output().find("test accuracy"), std::string::npos) << run.output();
    const ModelFile saved = readModelFile(model);
    const Reference want = singleDevice(train, batch, c.m);
    ASSERT_EQ(saved.params.size(), want.weights.size()) << config;
    for (const HostTensor& t : saved.params) {
      ASSERT_EQ(want.weights.count(t.name), 1u) << t.name << ": " << config;
      ASSERT_EQ(t.data, want.weights.at(t.name)) << t.name << ": " << config;
    }
    ASSERT_TRUE(saved.optimizer.has_value()) << config;
    EXPECT_EQ(saved.optimizer->steps, want.steps) << config;
  }
}

// `partition: auto` with `schedule: interleaved`: the planner cuts its stages into chunks
// (mlp-deep over two equal nodes, on a profile whose layers are slow enough that
// splitting pays whatever the links cost), the workers run them, and the saved weights
// and optimizer steps are single-device accumulation's, bitwise.
TEST(RunTest, AnInterleavedAutoPlanMatchesSingleDeviceAccumulationBitwise) {
  const int64_t train_limit = 300, batch = 32, m = 4;
  const std::string dir = ::testing::TempDir();
  const std::string profile = dir + "/run_il_profile.json", cluster = dir + "/run_il_cluster.yaml";
  const std::string model = dir + "/run_il.tdm";
  // Six equal hidden layers: an even split over two equal nodes is the plan.
  const std::string deep = std::string(TANDEM_SOURCE_DIR) + "/examples/models/mlp-deep.yaml";
  RunProcess measure("--model",
                     {deep, "--batch", "8", "--repeats", "2", "--warmup", "1", "--out", profile},
                     "profile");
  ASSERT_EQ(measure.wait(60s), 0) << measure.output();
  tandem::testing::scaleProfileTimes(profile, 1000);
  std::ofstream(cluster) << "nodes:\n  - {name: a, devices: [{name: cpu, backend: cpu}]}\n"
                            "  - {name: b, devices: [{name: cpu, backend: cpu}]}\n";
  std::ostringstream body;
  body << "train_limit: " << train_limit << "\ntest_limit: 100\nepochs: 1\nbatch: " << batch
       << "\nmicrobatches: " << m
       << "\nschedule: interleaved\npartition: auto\ncluster: " << cluster
       << "\nprofile: " << profile << "\nseed: 3\nsave: " << model << "\n";
  std::filesystem::remove(model);
  const std::string job = dir + "/run_interleaved_auto.yaml";
  std::ofstream(job) << "model: " << deep << "\n" << body.str();
  RunProcess run(job);
  ASSERT_EQ(run.wait(120s), 0) << run.output();
  for (const char* s : {"partition: auto: 2 stages of 2 chunks by the", "interleaved schedule",
                        "formula (p-1)/(vm+p-1)", ")+[", "test accuracy"})
    EXPECT_NE(run.output().find(s), std::string::npos) << s << "\n" << run.output();
  const ModelFile saved = readModelFile(model);
  const Reference want =
      singleDevice(loadFashionMnist(kFashionMnistDir, true, train_limit), batch, m, {}, deep);
  ASSERT_EQ(saved.params.size(), want.weights.size());
  for (const HostTensor& t : saved.params) {
    ASSERT_EQ(want.weights.count(t.name), 1u) << t.name;
    ASSERT_EQ(t.data, want.weights.at(t.name)) << t.name;
  }
  ASSERT_TRUE(saved.optimizer.has_value());
  EXPECT_EQ(saved.optimizer->steps, want.steps);
}

// A learning-rate schedule (warm-up, then cosine decay) and the linear scaling rule, as
// a job's stages apply them: bitwise the single device's weights under the same rates.
TEST(RunTest, StagesApplyTheLearningRateScheduleAsTheSingleDeviceDoes) {
  const int64_t train_limit = 300, batch = 32, m = 4;
  const Dataset train = loadFashionMnist(kFashionMnistDir, true, train_limit);
  OptimizerOptions o;
  o.lr = 0.05f * 32 / 16;  // lr_scale: linear from reference_batch 16
  o.min_lr = 0.001f * 32 / 16;
  o.lr_schedule = "cosine";
  o.warmup_steps = 3;
  o.decay_steps = 4;  // (the epoch has 10 steps: warm-up, decay, then the floor)
  const Reference want = singleDevice(train, batch, m, o);
  const std::string model = ::testing::TempDir() + "/run_schedule.tdm";
  std::ostringstream body;
  body << "train_limit: " << train_limit << "\ntest_limit: 100\nepochs: 1\nbatch: " << batch
       << "\nmicrobatches: " << m << "\nschedule: 1f1b\npartition: equal\nstages: 3\nseed: 3"
       << "\noptimizer: {kind: sgd, lr: 0.05, momentum: 0.9, lr_schedule: cosine, "
       << "warmup_steps: 3, decay_steps: 4, min_lr: 0.001, lr_scale: linear, "
       << "reference_batch: 16}\nsave: " << model << "\n";
  std::filesystem::remove(model);
  RunProcess run(writeJob("run_schedule", body.str()));
  ASSERT_EQ(run.wait(120s), 0) << run.output();
  const ModelFile saved = readModelFile(model);
  ASSERT_EQ(saved.params.size(), want.weights.size());
  for (const HostTensor& t : saved.params) ASSERT_EQ(t.data, want.weights.at(t.name)) << t.name;
  ASSERT_TRUE(saved.optimizer.has_value());
  EXPECT_EQ(saved.optimizer->steps, want.steps);
  EXPECT_EQ(saved.optimizer->options, o);
  // At the same rate without the schedule the weights differ: a stage ignoring the
  // schedule would be seen.
  OptimizerOptions flat = o;
  flat.lr_schedule = "constant";
  flat.warmup_steps = 0;
  EXPECT_NE(singleDevice(train, batch, m, flat).weights, want.weights);
}

// A GPT across 2 stage processes on a text file (token ids into the first stage, a label
// per token to the last): bitwise the single device's weights, and the epoch reports the
// held-out perplexity.
TEST(RunTest, AGptTrainsOnTextAcrossStageProcessesAsOneDeviceDoes) {
  const std::string dir = ::testing::TempDir();
  const std::string corpus = dir + "/run_text.txt", spec = dir + "/run_gpt.yaml";
  {
    std::ofstream text(corpus);
    for (int i = 0; i < 120; ++i) text << "fortune " << i % 9 << ": the cat sat on the mat.\n";
  }
  std::ofstream(spec) << "name: run-gpt\ninput: [16]\nlayers:\n"
                      << "  - embedding: {vocab: 256, dim: 16}\n  - positional: {context: 16}\n"
                      << "  - transformer: {heads: 2, mlp: 32}\n  - layernorm\n"
                      << "  - linear: {out: 256}\n";
  const int64_t batch = 16, m = 4;
  const Dataset train = loadText(corpus, 16, true, 3, 96);
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model ref(loadModelSpec(spec));
  ref.build(be, 3);
  Optimizer opt(be, OptimizerOptions{});
  Trainer trainer(ref, opt, TrainOptions{batch, 3, true, m});
  trainer.trainEpoch(train, 0, {});
  const std::string model = dir + "/run_gpt.tdm", job = dir + "/run_gpt_job.yaml";
  std::filesystem::remove(model);
  std::ofstream(job) << "model: " << spec << "\ndata: text:" << corpus
                     << "\ntrain_limit: 96\ntest_limit: 20\nepochs: 1\nbatch: " << batch
                     << "\nmicrobatches: " << m << "\nschedule: 1f1b\npartition: equal\n"
                     << "stages: 2\nseed: 3\nsave: " << model << "\n";
  RunProcess run(job);
  ASSERT_EQ(run.wait(120s), 0) << run.output();
  EXPECT_NE(run.output().find("test perplexity"), std::string::npos) << run.output();
  const ModelFile saved = readModelFile(model);
  ASSERT_EQ(saved.params.size(), ref.params().size());
  for (const HostTensor& t : saved.params)
    ASSERT_EQ(t.data, toHost(ref.param(t.name).value)) << t.name;
}

// The tcp ports a process listens on (its sockets in LISTEN, from /proc).
std::vector<int> listeningPorts(pid_t pid) {
  std::set<std::string> sockets;
  std::error_code ec;
  const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& e : std::filesystem::directory_iterator(fds, ec)) {
    const std::string to = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && to.rfind("socket:[", 0) == 0) sockets.insert(to.substr(8, to.size() - 9));
  }
  std::vector<int> out;
  std::ifstream table("/proc/" + std::to_string(pid) + "/net/tcp");
  std::string line;
  std::getline(table, line);  // the header
  while (std::getline(table, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    in >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >>
        inode;
    if (state == "0A" && sockets.count(inode) && local.find(':') != std::string::npos)
      out.push_back(std::stoi(local.substr(local.find(':') + 1), nullptr, 16));
  }
  return out;
}

// A local run over tcp: any process on the machine can connect to its workers' links.
// One that pushes well-formed activations and gradients (for every microbatch the run
// will send, of a shape no stage takes, behind a hello naming a link of the run) into
// every port the workers listen on, from their start to their end, gets nothing in: the
// links admit only the run's workers (sealed with the run's key), and the run saves
// bitwise what the undisturbed run saves. (200
// steps: long enough, on a loaded machine, for the workers' ports to be found while they
// run; with 50, a full ctest once ended a run before its second worker's port was seen.)
TEST(RunTest, ALocalRunsLinksOverTcpAdmitOnlyItsWorkers) {
  const std::string model = ::testing::TempDir() + "/run_intruded.tdm";
  const std::string job =
      writeJob("run_intruded",
               "train_limit: 6400\ntest_limit: 100\nepochs: 1\nbatch: 32\nmicrobatches: 4\n"
               "transport: tcp\npartition: equal\nstages: 2\nseed: 3\nsave: " +
                   model + "\n");
  std::filesystem::remove(model);
  {
    RunProcess run(job);
    ASSERT_EQ(run.wait(120s), 0) << run.output();
  }
  const std::string want = readFile(model, "the saved model");
  ASSERT_FALSE(want.empty());
  std::filesystem::remove(model);
  // What the intruder sends on each connection: a hello in the clear naming a link of the
  // run (stage 0 to 1, or 1 to 0) and the port it connects to, then well-formed messages,
  // as a socket link in the clear would.
  auto stream = [](int port, int32_t from, int32_t to) {
    const transport::HelloBytes hello = transport::writeHello(
        {false, from, to, 0, "tcp://127.0.0.1:" + std::to_string(port)}, std::nullopt);
    std::vector<uint8_t> out(hello.begin(), hello.end());
    for (int64_t tag = 0; tag < 260; ++tag)
      for (const MessageKind kind : {MessageKind::kActivation, MessageKind::kGradient}) {
        transport::WireHeader h;
        h.src_stage = from;
        h.dst_stage = to;
        h.kind = kind;
        h.microbatch = tag;
        h.shape = Shape{8, 3};
        h.payload_bytes = 8 * 3 * sizeof(float);
        const std::vector<uint8_t> header = transport::encodeHeader(h);
        uint8_t prefix[16] = {};
        transport::putLittle(prefix, header.size(), 4);
        transport::putLittle(prefix + 8, h.payload_bytes, 8);
        out.insert(out.end(), prefix, prefix + 16);
        out.insert(out.end(), header.begin(), header.end());
        const std::vector<float> payload(24, 1e30f);
        const auto* bytes = reinterpret_cast<const uint8_t*>(payload.data());
        out.insert(out.end(), bytes, bytes + h.payload_bytes);
      }
    return out;
  };

  RunProcess run(job);
  std::vector<pid_t> workers;
  for (const char* stage : {"stage 0: layers ", "stage 1: layers "}) {
    const std::optional<std::string> line = run.waitForLine(stage, 60s);
    ASSERT_TRUE(line && line->find("pid ") != std::string::npos) << run.output();
    workers.push_back(static_cast<pid_t>(std::stol(line->substr(line->find("pid ") + 4))));
  }
  std::vector<transport::tcp::Socket> intruders;
  std::set<int> reached;
  const auto until = Clock::now() + 60s;
  while (Clock::now() < until &&
         !std::all_of(workers.begin(), workers.end(), testing::processGone)) {
    for (pid_t w : workers)
      for (int port : listeningPorts(w)) {
        if (!reached.insert(port).second) continue;
        for (const auto& [from, to] : {std::pair{0, 1}, std::pair{1, 0}}) {
          try {
            transport::tcp::Socket& s = intruders.emplace_back(transport::tcp::connectTo(
                transport::tcp::Address::resolve("127.0.0.1", std::to_string(port), false), {},
                Clock::now() + 1s, "intruder", false));
            const std::vector<uint8_t> bytes = stream(port, from, to);
            (void)::send(s.get(), bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
          } catch (const Error&) {  // the port closed meanwhile
          }
        }
      }
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_EQ(run.wait(120s), 0) << run.output();
  EXPECT_GE(reached.size(), 2u) << "the workers' links were not found listening";
  EXPECT_NE(run.output().find("over tcp (encrypted)"), std::string::npos) << run.output();
  EXPECT_TRUE(readFile(model, "the saved model") == want) << "a run with an intruder: not bitwise";
}

TEST(RunTest, AKilledReplicaEndsTheRunNamed) {
  RunProcess run(writeJob("run_kill_replica",
                          "epochs: 100\nbatch: 16\nmicrobatches: 4\ntimeout_s: 10\n"
                          "partition: [[0, 2], {layers: [2, 6], replicas: 2}]\n"));
  const auto line = run.waitForLine("stage 1 replica 1: layers ", 60s);
  ASSERT_TRUE(line && line->find("pid ") != std::string::npos) << run.output();
  const auto pid = static_cast<pid_t>(std::stol(line->substr(line->find("pid ") + 4)));
  ASSERT_TRUE(run.waitForLine("epoch 1/100 step", 60s)) << run.output();
  kill(pid, SIGKILL);
  EXPECT_NE(run.wait(30s), 0) << run.output();
  EXPECT_NE(run.output().find(std::string("stage 1 replica 1 (pid ").append(std::to_string(pid)) +
                              ") was killed by signal 9"),
            std::string::npos)
      << run.output();
}

TEST(RunTest, TheTimelineOptionWritesATraceAndAnSvg) {
  const std::string dir = ::testing::TempDir() + "/run_timeline";
  std::filesystem::remove_all(dir);
  RunProcess run(writeJob("run_timeline",
                          "train_limit: 256\ntest_limit: 64\nbatch: 32\nmicrobatches: 4\n"
                          "partition: equal\nstages: 2\n"),
                 {"--timeline", dir});
  ASSERT_EQ(run.wait(120s), 0) << run.output();
  std::ifstream trace(dir + "/trace.json");
  std::stringstream text;
  text << trace.rdbuf();
  // 8 steps x 4 microbatches: each stage forwards microbatches 0 to 31 in training and
  // 8 in the evaluation (64 samples in microbatches of 8, numbered 0 to 7 apart).
  EXPECT_NE(text.str().find("\"name\":\"forward 31\""), std::string::npos);
  EXPECT_EQ(text.str().find("\"name\":\"forward 32\""), std::string::npos);
  EXPECT_NE(text.str().find("\"args\":{\"name\":\"stage 1\"}"), std::string::npos);
  std::ifstream svg(dir + "/timeline.svg");
  std::stringstream picture;
  picture << svg.rdbuf();
  EXPECT_NE(picture.str().find("<svg"), std::string::npos);
  EXPECT_NE(picture.str().find("<title>backward"), std::string::npos);
}

TEST(RunTest, InferServesSavedWeightsAndReportsLatency) {
  const std::string model = ::testing::TempDir() + "/run_infer.tdm";
  RunProcess train(writeJob("run_infer_train",
                            "train_limit: 512\ntest_limit: 64\nbatch: 32\nmicrobatches: 4\n"
                            "partition: equal\nstages: 2\nsave: " +
                                model + "\n"));
  ASSERT_EQ(train.wait(120s), 0) << train.output();
  RunProcess infer(writeJob("run_infer",
                            "test_limit: 300\nbatch: 40\nmicrobatches: 4\npartition: equal\n"
                            "stages: 3\nweights: " +
                                model + "\n"),
                   {}, "infer");
  ASSERT_EQ(infer.wait(120s), 0) << infer.output();
  const std::string& out = infer.output();
  // 300 samples in batches of 40 cut into 4: 7 full batches of 4 requests, then 20 in 4.
  EXPECT_NE(out.find("inference: 300 samples as 32 requests"), std::string::npos) << out;
  const auto lat = infer.waitForLine("latency per request: ", 1s);
  double p50 = 0, p95 = 0, p99 = 0;
  ASSERT_TRUE(
      lat && std::sscanf(lat->c_str(), "p50 %lf ms, p95 %lf ms, p99 %lf ms", &p50, &p95, &p99) == 3)
      << out;
  EXPECT_GT(p50, 0.0);
  EXPECT_LE(p50, p95);
  EXPECT_LE(p95, p99);
  // The stages serve the saved weights: the accuracy one device gets with them.
  cpu::CpuBackend be;
  const auto saved = loadModel(readModelFile(model), be);
  const Dataset test = loadFashionMnist(kFashionMnistDir, false, 300);
  const EvalResult want = evaluate(*saved, test, 40);
  const auto acc = infer.waitForLine("test accuracy: ", 1s);
  ASSERT_TRUE(acc) << out;
  EXPECT_NEAR(std::stod(*acc), want.accuracy, 1.0 / 300 + 1e-4);
}

TEST(RunTest, AKilledStageEndsTheRunNamedWithNothingLeftBehind) {
  RunProcess run(writeJob("run_kill",
                          "epochs: 100\nbatch: 16\nmicrobatches: 4\npartition: equal\nstages: 3\n"
                          "timeout_s: 10\n"));
  std::vector<pid_t> pids;
  for (int s = 0; s < 3; ++s) {
    const auto line = run.waitForLine("stage " + std::to_string(s) + ": layers ", 60s);
    ASSERT_TRUE(line && line->find("pid ") != std::string::npos) << run.output();
    pids.push_back(static_cast<pid_t>(std::stol(line->substr(line->find("pid ") + 4))));
  }
  ASSERT_TRUE(run.waitForLine("epoch 1/100 step", 60s)) << run.output();
  const auto t0 = Clock::now();
  kill(pids[1], SIGKILL);
  const int code = run.wait(30s);
  EXPECT_LT(Clock::now() - t0, 30s);
  EXPECT_NE(code, 0) << run.output();
  EXPECT_NE(
      run.output().find("stage 1 (pid " + std::to_string(pids[1]) + ") was killed by signal 9"),
      std::string::npos)
      << run.output();
  for (pid_t pid : pids) {
    for (int i = 0; i < 100 && !testing::processGone(pid); ++i) std::this_thread::sleep_for(50ms);
    EXPECT_TRUE(testing::processGone(pid)) << "stage process " << pid << " is still running";
  }
}

TEST(RunTest, BadJobsAreRefusedBeforeAnythingStarts) {
  RunProcess overlap(writeJob("run_overlap", "partition: [[0, 3], [2, 6]]\n"));
  EXPECT_EQ(overlap.wait(30s), 1);
  EXPECT_NE(overlap.output().find("run_overlap.yaml:2:21: stage 1's layers [2, 6) overlap"),
            std::string::npos)
      << overlap.output();
  RunProcess typo(writeJob("run_typo", "partition: equal\nstages: 2\nmicrobatch: 4\n"));
  EXPECT_EQ(typo.wait(30s), 1);
  EXPECT_NE(typo.output().find("run_typo.yaml:4:1: unknown key 'microbatch'"), std::string::npos)
      << typo.output();
  EXPECT_EQ(typo.output().find("pid"), std::string::npos) << "a worker was started";
}

}  // namespace
}  // namespace tandem
