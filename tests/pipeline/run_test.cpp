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

const std::string kMlp = std::string(TANDEM_SOURCE_DIR) + "/examples/models/mlp.yaml";

// A running `tandem run`, its stdout and stderr read through one pipe.
class RunProcess {
 public:
  explicit RunProcess(const std::string& job, std::vector<std::string> extra = {},
                      const char* command = "run") {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    std::vector<const char*> argv = {TANDEM_CLI, command, job.c_str()};
    for (const std::string& e : extra) argv.push_back(e.c_str());
    argv.push_back(nullptr);
    EXPECT_EQ(
        posix_spawn(&pid_, TANDEM_CLI, &actions, nullptr, const_cast<char**>(argv.data()), environ),
        0);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    out_fd_ = fds[0];
  }
  ~RunProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(out_fd_);
  }

  // Reads output until a whole line contains `marker` or `limit` passes; the rest of
  // that line after the marker, or nullopt. (No std::regex: GCC 12 warns inside it
  // under the sanitizer build.)
  std::optional<std::string> waitForLine(const std::string& marker, std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    for (;;) {
      const size_t at = text_.find(marker);
      if (at != std::string::npos) {
        const size_t end = text_.find('\n', at);
        if (end != std::string::npos)
          return text_.substr(at + marker.size(), end - at - marker.size());
      }
      if (Clock::now() >= deadline) return std::nullopt;
      readSome(100);
    }
  }

  // Waits for the exit (bounded) and returns the exit code, -1 on a signal or timeout.
  int wait(std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    int status = 0;
    while (Clock::now() < deadline) {
      readSome(50);
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        while (readSome(0)) {
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
    }
    return -1;
  }

  const std::string& output() const { return text_; }

 private:
  bool readSome(int timeout_ms) {
    pollfd p{out_fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    const ssize_t n = read(out_fd_, buf, sizeof buf);
    if (n <= 0) return false;
    text_.append(buf, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  bool exited_ = false;
  std::string text_;
};

std::string writeJob(const std::string& name, const std::string& body) {
  const std::string path = ::testing::TempDir() + "/" + name + ".yaml";
  std::ofstream(path) << "model: " << kMlp << "\n" << body;
  return path;
}

// Single-device gradient accumulation over m microbatches, one epoch from seed 3: the
// weights (by name) and optimizer steps every pipeline must give.
struct Reference {
  std::map<std::string, std::vector<float>> weights;
  int64_t steps = 0;
};
Reference singleDevice(const Dataset& train, int64_t batch, int64_t m,
                       const OptimizerOptions& options = {}, const std::string& model = kMlp) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model ref(loadModelSpec(model));
  ref.build(be, 3);
  Optimizer opt(be, options);
  Trainer trainer(ref, opt, TrainOptions{batch, 3, true, m});
  trainer.trainEpoch(train, 0, {});
  Reference r;
  for (const Param* p : ref.params()) r.weights[p->name] = toHost(p->value);
  r.steps = opt.steps();
  return r;
}

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

// Hybrid: a stage with replicas (each a worker process, gradients summed over a
// cross-process group at the flush) gives single-device accumulation's weights within
// float rounding — the replicas add their own microbatches first, then each other's.
TEST(RunTest, ReplicatedStagesMatchSingleDeviceAccumulationWithinRounding) {
  const int64_t train_limit = 300, batch = 32, m = 4;
  const Dataset train = loadFashionMnist(kFashionMnistDir, true, train_limit);
  const Reference want = singleDevice(train, batch, m);

  // `save:` in a folder that does not exist yet: the run makes it.
  const std::string out_dir = ::testing::TempDir() + "/run_hybrid_out";
  const std::string model = out_dir + "/nested/run_hybrid.tdm";
  const std::string timeline = ::testing::TempDir() + "/run_hybrid_timeline";
  struct Config {
    const char *partition, *schedule, *transport, *rows;
  } configs[] = {
      {"[[0, 2], {layers: [2, 4], replicas: 2}, [4, 6]]", "1f1b", "tcp", "1.1 "},
      {"[{layers: [0, 3], replicas: 2}, {layers: [3, 6], replicas: 2}]", "gpipe", "ipc", "0.1 "},
  };
  for (const Config& c : configs) {
    std::ostringstream body;
    body << "train_limit: " << train_limit << "\ntest_limit: 100\nepochs: 1\nbatch: " << batch
         << "\nmicrobatches: " << m << "\nschedule: " << c.schedule
         << "\ntransport: " << c.transport << "\npartition: " << c.partition
         << "\nseed: 3\nsave: " << model << "\n";
    std::filesystem::remove_all(out_dir);
    std::filesystem::remove_all(timeline);
    RunProcess run(writeJob("run_hybrid", body.str()), {"--timeline", timeline});
    ASSERT_EQ(run.wait(120s), 0) << c.partition << "\n" << run.output();
    // A row per replica in the stage table, a timeline row per replica.
    EXPECT_NE(run.output().find(std::string("\n").append(c.rows)), std::string::npos)
        << run.output();
    std::ifstream trace(timeline + "/trace.json");
    std::stringstream text;
    text << trace.rdbuf();
    EXPECT_NE(text.str().find(std::string("\"name\":\"stage ").append(c.rows, 3).append("\"")),
              std::string::npos);
    const ModelFile saved = readModelFile(model);
    ASSERT_EQ(saved.params.size(), want.weights.size()) << c.partition;
    for (const HostTensor& t : saved.params) {
      const std::vector<float>& w = want.weights.at(t.name);
      ASSERT_EQ(t.data.size(), w.size());
      for (size_t i = 0; i < w.size(); ++i)
        ASSERT_NEAR(t.data[i], w[i], 1e-5f * (1 + std::abs(w[i])))
            << c.partition << ": " << t.name << "[" << i << "]";
    }
    EXPECT_EQ(saved.optimizer->steps, want.steps) << c.partition;
  }
}

// A stage split over tensor ranks in its worker's process (`tensor: N`): the saved model,
// merged from the ranks, is single-device accumulation's within rounding (the row layer's
// all-reduce regroups a sum), with even and unequal shares, 2 and 3 ranks, first and last
// stage; beside a replicated stage with fp16 activations, within fp16's rounding (each
// activation to 11 significant bits: the weights within 2e-3 after 10 steps). Its
// checkpoints hold the merged slice, and a run resumed from one ends bitwise where the
// uninterrupted run did.
TEST(RunTest, ATensorSplitStageTrainsAsOneDeviceAndResumesBitwise) {
  const int64_t train_limit = 320, batch = 32, m = 4;
  const Dataset train = loadFashionMnist(kFashionMnistDir, true, train_limit);
  const Reference want = singleDevice(train, batch, m);
  const std::string dir = ::testing::TempDir() + "/run_tensor";
  struct Config {
    const char *partition, *schedule, *said, *last_row;
    const char* codec = "fp32";
    float tolerance = 1e-5f;
  } configs[] = {
      {"[{layers: [0, 2], replicas: 2}, {layers: [2, 6], tensor: 3, tensor_shares: [1, 2, 1]}]",
       "1f1b", "stage 1: 3 tensor ranks (feature shares 1 : 2 : 1)", "\n1/t2   [2, 6)", "fp16",
       2e-3f},
      {"[[0, 2], {layers: [2, 6], tensor: 2, tensor_shares: [1, 3]}]", "1f1b",
       "stage 1: 2 tensor ranks (feature shares 1 : 3): 2 relu whole, 3 linear column, 4 relu "
       "slice, 5 linear row",
       "\n1/t1   [2, 6)"},
      {"[{layers: [0, 4], tensor: 3}, [4, 6]]", "gpipe",
       "stage 0: 3 tensor ranks (feature shares 1 : 1 : 1): 0 flatten whole, 1 linear column",
       "\n0/t2   [0, 4)"},
  };
  auto job = [&](const std::string& name, const Config& c) {
    std::ostringstream body;
    body << "train_limit: " << train_limit << "\ntest_limit: 100\nepochs: 1\nbatch: " << batch
         << "\nmicrobatches: " << m << "\nschedule: " << c.schedule
         << "\ncodec: {activations: " << c.codec << ", gradients: fp32}"
         << "\npartition: " << c.partition << "\nseed: 3\nsave: " << dir << "/" << name
         << ".tdm\ncheckpoint: {every_steps: 3, keep: 3, dir: " << dir << "/ck-" << name << "}\n";
    return writeJob("run_" + name, body.str());
  };
  std::filesystem::remove_all(dir);
  for (const Config& c : configs) {
    RunProcess run(job("tensor", c));
    ASSERT_EQ(run.wait(120s), 0) << c.partition << "\n" << run.output();
    EXPECT_NE(run.output().find(c.said), std::string::npos) << run.output();
    // The stage table has a row per tensor rank.
    EXPECT_NE(run.output().find(c.last_row), std::string::npos) << run.output();
    const ModelFile saved = readModelFile(dir + "/tensor.tdm");
    ASSERT_EQ(saved.params.size(), want.weights.size()) << c.partition;
    for (const HostTensor& t : saved.params) {
      const std::vector<float>& w = want.weights.at(t.name);
      ASSERT_EQ(t.data.size(), w.size()) << t.name;
      for (size_t i = 0; i < w.size(); ++i)
        ASSERT_NEAR(t.data[i], w[i], c.tolerance * (1 + std::abs(w[i])))
            << c.partition << ": " << t.name << "[" << i << "]";
    }
    EXPECT_EQ(saved.optimizer->steps, want.steps) << c.partition;
  }
  // The last config's run again from its checkpoint at step 6 (of 10): bitwise the same.
  const Config& last = configs[std::size(configs) - 1];
  const std::string uninterrupted = readFile(dir + "/tensor.tdm", "model");
  std::filesystem::copy(dir + "/ck-tensor", dir + "/from6");
  std::filesystem::remove(dir + "/from6/step-000000000009.json");
  RunProcess resumed(job("resumed", last), {"--resume", dir + "/from6"});
  ASSERT_EQ(resumed.wait(120s), 0) << resumed.output();
  EXPECT_NE(resumed.output().find("(step 6)"), std::string::npos) << resumed.output();
  EXPECT_TRUE(readFile(dir + "/resumed.tdm", "model") == uninterrupted) << "not bitwise";
}

// Worker `who`'s ("1.0": stage 1's replica 0) optimizer state, MiB, from a training run's
// "training state" line; -1 if it has none.
double stateMiB(const std::string& out, const std::string& who) {
  const size_t line = out.find("training state MiB per worker");
  if (line == std::string::npos) return -1;
  const std::string text = out.substr(line, out.find('\n', line) - line);
  const size_t at = text.find(" " + who + " ");
  if (at == std::string::npos) return -1;
  std::istringstream in(text.substr(at + who.size() + 2));  // "weights/gradients/state"
  double weights = 0, gradients = 0, state = -1;
  char slash = 0;
  in >> weights >> slash >> gradients >> slash >> state;
  return state;
}

// A replicated stage whose replicas shard their training state (`zero: 1`: the AdamW
// state; `zero: 2`: and the summed gradients) trains bitwise as plain replicas: the saved
// model — weights and the optimizer state gathered from the shards — is byte for byte the
// plain run's, for 2 and 3 replicas. A run resumed from a sharded checkpoint ends bitwise
// where the uninterrupted one did, and one resumed into another replica count and level
// ends where the plain run resumed into that count does.
TEST(RunTest, ShardedReplicatedStagesSaveThePlainRunsFileAndResume) {
  const std::string dir = ::testing::TempDir() + "/run_zero";
  std::filesystem::remove_all(dir);
  auto job = [&](const std::string& name, int zero, int replicas) {
    std::ostringstream body;
    body << "train_limit: 320\ntest_limit: 100\nepochs: 1\nbatch: 32\nmicrobatches: 4\n"
         << "schedule: 1f1b\noptimizer: {kind: adamw, lr: 0.002}\n"
         << "partition: [[0, 2], {layers: [2, 6], replicas: " << replicas << "}]\nzero: " << zero
         << "\nseed: 3\nsave: " << dir << "/" << name << ".tdm\ncheckpoint: {every_steps: 3, "
         << "keep: 3, dir: " << dir << "/ck-" << name << "}\n";
    return writeJob("run_zero_" + name, body.str());
  };
  auto saved = [&](const std::string& name) {
    return readFile(dir + "/" + name + ".tdm", "model");
  };
  double whole = 0;  // the stage's optimizer state, MiB
  for (const int replicas : {2, 3})
    for (const int zero : {0, 1, 2}) {
      const std::string name = "r" + std::to_string(replicas) + "z" + std::to_string(zero);
      RunProcess run(job(name, zero, replicas));
      ASSERT_EQ(run.wait(120s), 0) << name << "\n" << run.output();
      // The stage's replicas hold the whole state each, or its shards: together the
      // whole (to the line's rounding of each to 0.01 MiB).
      double held = 0;
      for (int r = 0; r < replicas; ++r) {
        const double mine = stateMiB(run.output(), "1." + std::to_string(r));
        ASSERT_GE(mine, 0) << run.output();
        held += mine;
        if (zero > 0) {
          EXPECT_LT(mine, whole * 0.6) << name << " replica " << r;
        }
      }
      if (zero == 0) {
        whole = held / replicas;
      } else {
        EXPECT_NEAR(held, whole, 0.01 * replicas) << name;
        EXPECT_TRUE(saved(name) == saved("r" + std::to_string(replicas) + "z0")) << name;
      }
    }
  const ModelFile file = readModelFile(dir + "/r2z2.tdm");
  ASSERT_TRUE(file.optimizer.has_value());
  EXPECT_EQ(file.optimizer->tensors.size(), 2 * file.params.size()) << "adamw's m and v, whole";
  // From the 2-replica ZeRO 2 run's checkpoint at step 6 (of 10): as it was, and into 3
  // replicas at ZeRO 1 beside 3 plain ones.
  std::filesystem::copy(dir + "/ck-r2z2", dir + "/from6");
  std::filesystem::remove(dir + "/from6/step-000000000009.json");
  struct Resume {
    const char* name;
    int zero, replicas;
  } resumes[] = {{"again", 2, 2}, {"into3z1", 1, 3}, {"into3z0", 0, 3}};
  for (const Resume& r : resumes) {
    RunProcess resumed(job(r.name, r.zero, r.replicas), {"--resume", dir + "/from6"});
    ASSERT_EQ(resumed.wait(120s), 0) << r.name << "\n" << resumed.output();
    EXPECT_NE(resumed.output().find("(step 6)"), std::string::npos) << resumed.output();
  }
  EXPECT_TRUE(saved("again") == saved("r2z2")) << "not bitwise";
  EXPECT_TRUE(saved("into3z1") == saved("into3z0")) << "not bitwise";
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
