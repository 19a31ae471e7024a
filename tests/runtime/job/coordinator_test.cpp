// The coordinator and its stage workers in one process (workers as threads, connected
// over authenticated loopback channels): the assignments travel in-band, and the trained
// slices that come back make bitwise the model single-device gradient accumulation makes.
#include "runtime/job/coordinator.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/data/dataset.h"
#include "core/error.h"
#include "core/file.h"
#include "core/generate.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "core/train/trainer.h"
#include "runtime/control/handshake.h"
#include "runtime/control/listener.h"
#include "runtime/node/chunks.h"
#include "runtime/node/node_info.h"
#include "runtime/node/weight_cache.h"
#include "runtime/worker/stage_worker.h"
#include "tests/test_util.h"

namespace tandem::runtime {
namespace {

using namespace std::chrono_literals;

const std::string kMlp = std::string(TANDEM_SOURCE_DIR) + "/examples/models/mlp.yaml";

struct Stage {
  int64_t begin, end;
  int replicas;
};

// One assignment per replica of each stage, for the MLP (or `spec`) on 96 training samples.
std::vector<Assign> assignments(const std::vector<Stage>& stages, ScheduleKind schedule,
                                const std::string& spec = readFile(kMlp, "model spec")) {
  std::vector<Assign> out;
  const int p = static_cast<int>(stages.size());
  for (int s = 0; s < p; ++s)
    for (int r = 0; r < stages[static_cast<size_t>(s)].replicas; ++r) {
      Assign a;
      a.job = "coordinator test";
      a.model_spec = spec;
      a.stage = s;
      a.stages = p;
      a.replica = r;
      a.replicas = stages[static_cast<size_t>(s)].replicas;
      a.prev_replicas = s > 0 ? stages[static_cast<size_t>(s - 1)].replicas : 0;
      a.next_replicas = s + 1 < p ? stages[static_cast<size_t>(s + 1)].replicas : 0;
      a.slice.layers.begin = stages[static_cast<size_t>(s)].begin;
      a.slice.layers.end = stages[static_cast<size_t>(s)].end;
      a.train.schedule = schedule;
      a.train.microbatches = 4;
      a.train.batch = 32;
      a.train.epochs = 1;
      a.train.seed = 3;
      a.data.train_limit = 96;
      a.data.test_limit = 64;
      a.wire.timeout_s = 30;
      a.record_spans = true;
      a.save = true;
      out.push_back(a);
    }
  return out;
}

std::vector<std::string> names(const std::vector<Assign>& as) {
  std::vector<std::string> out;
  for (const Assign& a : as)
    out.push_back("stage " + std::to_string(a.stage) + " replica " + std::to_string(a.replica));
  return out;
}

std::map<std::string, std::vector<float>> singleDevice() {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model ref(loadModelSpec(kMlp));
  ref.build(be, 3);
  Optimizer opt(be, OptimizerOptions{});
  Trainer trainer(ref, opt, TrainOptions{32, 3, true, 4});
  trainer.trainEpoch(loadFashionMnist(kFashionMnistDir, true, 96), 0, {});
  std::map<std::string, std::vector<float>> w;
  for (const Param* p : ref.params()) w[p->name] = toHost(p->value);
  return w;
}

TEST(CoordinatorTest, WorkersInThreadsTrainBitwiseAsOneDevice) {
  const auto want = singleDevice();
  struct Case {
    std::vector<Stage> stages;
    ScheduleKind schedule;
    bool encrypt;  // CurveZMQ links with keys from the run's key
  } cases[] = {
      {{{0, 3, 1}, {3, 6, 1}}, ScheduleKind::k1F1B, false},
      {{{0, 3, 1}, {3, 6, 1}}, ScheduleKind::k1F1B, true},
      {{{0, 2, 1}, {2, 4, 2}, {4, 6, 1}}, ScheduleKind::kGPipe, false},
      // The replicas' group over CurveZMQ (ZeroMQ links) instead of plain sockets.
      {{{0, 2, 1}, {2, 4, 2}, {4, 6, 1}}, ScheduleKind::kGPipe, true},
  };
  std::map<std::string, std::vector<float>> replicated_plain;
  for (const Case& c : cases) {
    std::vector<Assign> as = assignments(c.stages, c.schedule);
    for (Assign& a : as) a.encrypt = c.encrypt;
    auto launcher = threadLauncher();
    int epochs = 0, wired = 0;
    RunCallbacks cb;
    cb.epoch = [&](const EpochDone& e) {
      ++epochs;
      EXPECT_GT(e.test_accuracy, 0.0);
    };
    cb.wired = [&] { ++wired; };
    const RunResult r = coordinate(as, names(as), *launcher, cb, RunOptions{});
    EXPECT_EQ(epochs, 1);
    EXPECT_EQ(wired, 1);
    ASSERT_EQ(r.reports.size(), as.size());
    std::map<std::string, std::vector<float>> got;
    for (size_t i = 0; i < as.size(); ++i) {
      // 3 steps of 4 microbatches, shared among a stage's replicas.
      EXPECT_EQ(r.reports[i].counters.microbatches, 12 / as[i].replicas) << names(as)[i];
      ASSERT_FALSE(r.reports[i].spans.empty());
      // On this machine's realtime clock, within the test's own minute.
      const double now = static_cast<double>(realtimeNs()) * 1e-9;
      EXPECT_LT(std::abs(r.reports[i].spans.front().start_s - now), 60.0);
      if (as[i].stage > 0) {
        EXPECT_GT(r.reports[i].bytes_received, 0u);
      }
      if (as[i].replica != 0) continue;
      const ModelFile slice = parseModelFile(r.slices[i], names(as)[i]);
      for (const HostTensor& t : slice.params) got[t.name] = t.data;
    }
    ASSERT_EQ(got.size(), want.size());
    bool replicated = false;
    for (const Stage& st : c.stages) replicated = replicated || st.replicas > 1;
    if (replicated && !c.encrypt) replicated_plain = got;
    if (replicated && c.encrypt) {  // either group sums in the same order
      EXPECT_TRUE(got == replicated_plain) << "encrypted replicas differ from plain ones";
    }
    for (const auto& [name, w] : want) {
      if (!replicated) {
        EXPECT_EQ(got.at(name), w) << name;  // bitwise
        continue;
      }
      // Replicas sum their gradients in another order than one device: as close as
      // RunTest.HybridStagesMatchSingleDeviceAccumulation asks.
      const std::vector<float>& g = got.at(name);
      ASSERT_EQ(g.size(), w.size());
      for (size_t k = 0; k < w.size(); ++k)
        ASSERT_NEAR(g[k], w[k], 1e-5f * (1 + std::abs(w[k]))) << name << "[" << k << "]";
    }
  }
}

TEST(CoordinatorTest, ATrainedSliceLargerThanAMessageComesBackWhole) {
  // 784 x 8192 weights (25.7 MB) and Adam's two moments: about 77 MB for stage 0, more
  // than four times what one control message may carry.
  const std::string wide =
      "name: wide\ninput: [1, 28, 28]\nlayers:\n  - flatten\n"
      "  - linear: {out: 8192}\n  - relu\n  - linear: {out: 10}\n";
  std::vector<Assign> as = assignments({{0, 2, 1}, {2, 4, 1}}, ScheduleKind::k1F1B, wide);
  for (Assign& a : as) {
    a.train.optimizer.kind = "adamw";
    a.data.train_limit = 32;
    a.data.test_limit = 32;
  }
  auto launcher = threadLauncher();
  const RunResult r = coordinate(as, names(as), *launcher, RunCallbacks{}, RunOptions{});
  ASSERT_EQ(r.slices.size(), 2u);
  EXPECT_GT(r.slices[0].size(), size_t{64} << 20);
  const ModelFile first = parseModelFile(r.slices[0], "stage 0's slice");
  ASSERT_EQ(first.params.size(), 2u);  // the linear layer's weight and bias
  EXPECT_EQ(first.params[0].data.size() + first.params[1].data.size(), 784u * 8192 + 8192);
  ASSERT_TRUE(first.optimizer.has_value());
  EXPECT_EQ(first.optimizer->steps, 1);
  EXPECT_EQ(r.reports[0].model_hash, contentHash(r.slices[0]));
}

TEST(CoordinatorTest, CheckpointsComeFromEveryStageAtTheSameStep) {
  std::vector<Assign> as = assignments({{0, 2, 1}, {2, 4, 2}, {4, 6, 1}}, ScheduleKind::k1F1B);
  for (Assign& a : as) a.checkpoint.every_steps = 1;  // 3 steps: 3 checkpoints
  auto launcher = threadLauncher();
  std::vector<int64_t> steps;
  std::vector<std::vector<uint8_t>> last;
  RunCallbacks cb;
  cb.checkpoint = [&](int64_t step, const std::vector<std::vector<uint8_t>>& slices,
                      const std::vector<double>& shares) {
    EXPECT_TRUE(shares.empty()) << "only replicas of the whole model have shares";
    steps.push_back(step);
    last = slices;
  };
  const RunResult r = coordinate(as, names(as), *launcher, cb, RunOptions{});
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));
  ASSERT_EQ(last.size(), as.size());
  for (size_t i = 0; i < as.size(); ++i) {
    if (as[i].replica != 0) {  // replicas hold what replica 0 holds: it alone sends
      EXPECT_TRUE(last[i].empty()) << names(as)[i];
      continue;
    }
    // After the last step the checkpoint is the trained slice itself.
    EXPECT_TRUE(last[i] == r.slices[i]) << names(as)[i];
  }
}

TEST(CoordinatorTest, AWorkerGoneBeforeItsKeyIsWrittenDoesNotEndTheLauncher) {
  // A worker that exits at once closes its end of the pipe its key goes through; the
  // write must fail, not raise SIGPIPE (which would end this test's process).
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  close(fds[0]);
  EXPECT_FALSE(writeToChild(fds[1], "key\n"));
  close(fds[1]);
  ASSERT_EQ(pipe(fds), 0);
  EXPECT_TRUE(writeToChild(fds[1], "key\n"));
  close(fds[0]);
  close(fds[1]);
}

TEST(CoordinatorTest, OnlyAnExitWithCodeZeroEndsCleanly) {
  EXPECT_TRUE(endedCleanly({0, "(pid 4) exited with code 0", false}));
  EXPECT_TRUE(endedCleanly({0, "exited with code 0", false}));
  EXPECT_FALSE(endedCleanly({0, "(pid 4) exited with code 1", false}));
  EXPECT_FALSE(endedCleanly({0, "(pid 4) was killed by signal 9", true}));
  // A failure whose message happens to say "code 0" is still a failure.
  EXPECT_FALSE(endedCleanly({0, "exited with code 1 (exited with code 0 elsewhere)", false}));
  EXPECT_EQ(endedBadly({3, "(pid 4) was killed by signal 9", true}),
            "worker 3 (pid 4) was killed by signal 9 after finishing; ");
  EXPECT_EQ(endedBadly({3, "(pid 4) exited with code 0", false}), "");
}

TEST(CoordinatorTest, AWorkerThatCannotRunItsAssignmentEndsTheRunNamed) {
  std::vector<Assign> as = assignments({{0, 3, 1}, {3, 6, 1}}, ScheduleKind::k1F1B);
  as[1].slice.device = "opencl:99";
  auto launcher = threadLauncher();
  testing::expectThrowWith<Error>(
      [&] { coordinate(as, names(as), *launcher, RunCallbacks{}, RunOptions{}); },
      {"stage 1 replica 0 failed: ", "no OpenCL device 99"});
}

// A launcher whose one worker is a script run on a thread: it connects and says hello as
// a worker does, then `script` plays the rest (a hostile or broken worker).
class ScriptedLauncher final : public Launcher {
 public:
  explicit ScriptedLauncher(std::function<void(Channel&)> script) : script_(std::move(script)) {}
  ~ScriptedLauncher() override {
    if (thread_.joinable()) thread_.join();
  }
  int64_t start(int slot, const Endpoint& coordinator, const ClusterKey& key) override {
    thread_ = std::thread([this, slot, coordinator, key] {
      try {
        std::unique_ptr<Channel> c = connectChannelRetrying(coordinator, key, HandshakeOptions{});
        c->send(WorkerHello{slot, static_cast<int64_t>(getpid())});
        script_(*c);
      } catch (const std::exception&) {  // (the coordinator closed on it)
      }
    });
    return 0;
  }
  std::optional<Ended> ended() override { return std::nullopt; }
  std::string finish(std::chrono::milliseconds) override {
    if (thread_.joinable()) thread_.join();
    return "";
  }
  void stopAll() override {}  // (the script ends once its channel closes)

 private:
  std::function<void(Channel&)> script_;
  std::thread thread_;
};

// Shares of the batches come only with the checkpoint of a stage that is the whole model
// and replicated, as many as its replicas: a worker that sends others is failed, named.
TEST(CoordinatorTest, AWorkerSendingSharesItCannotHaveIsFailedNamed) {
  std::vector<Assign> as = assignments({{0, 6, 1}}, ScheduleKind::k1F1B);
  as[0].checkpoint.every_steps = 1;
  ScriptedLauncher launcher([](Channel& c) {
    std::optional<Message> m = c.recv(30s);
    ASSERT_TRUE(m && std::holds_alternative<Assign>(*m));
    c.send(Ready{{}, {}, "cpu", 96, 64});
    m = c.recv(30s);
    ASSERT_TRUE(m && std::holds_alternative<Start>(*m));
    const std::vector<uint8_t> slice(100, 7);
    const std::string hash = contentHash(slice);
    sendChunks(c, hash, slice, 30s);
    c.send(Checkpointed{1, hash, 100, {0.75, 0.25}});
    while (c.recv(30s)) {
    }
  });
  testing::expectThrowWith<Error>(
      [&] { coordinate(as, names(as), launcher, RunCallbacks{}, RunOptions{}); },
      {"stage 0 replica 0",
       "sent 2 replicas' shares with its checkpoint at step 1, being one "
       "of 1 replicas"});
}

// A worker that has reported keeps its links open (what it sent last may still be on its
// way to the next stage) until its coordinator says the run is over, then ends at once.
TEST(CoordinatorTest, AWorkerThatReportedWaitsForTheCoordinatorsLeave) {
  const ClusterKey key = generateClusterKey();
  Listener listener("127.0.0.1:0", key, HandshakeOptions{});
  std::vector<Assign> as = assignments({{0, 6, 1}}, ScheduleKind::k1F1B);
  as[0].save = false;
  as[0].record_spans = false;
  auto worker = std::async(std::launch::async, [&] {
    std::unique_ptr<Channel> c = connectChannel(listener.endpoint(), key, HandshakeOptions{});
    runStageWorker(*c, key);
  });
  std::unique_ptr<Channel> w = listener.accept(10s);
  ASSERT_TRUE(w);
  w->send(as[0]);
  std::optional<Message> m = w->recv(30s);
  ASSERT_TRUE(m && std::holds_alternative<Ready>(*m));
  const Ready ready = std::get<Ready>(*m);
  w->send(Start{{}, {}, ready.train_samples, ready.test_samples});
  for (m = w->recv(30s); m && !std::holds_alternative<StageReport>(*m); m = w->recv(30s))
    ASSERT_FALSE(std::holds_alternative<Failed>(*m)) << std::get<Failed>(*m).message;
  ASSERT_TRUE(m) << "no report";
  EXPECT_EQ(worker.wait_for(500ms), std::future_status::timeout) << "it left before the leave";
  w->send(Leave{"the run is over"});
  EXPECT_EQ(worker.wait_for(5s), std::future_status::ready);
  worker.get();
}

// A small GPT of `context` tokens.
std::string gptSpec(int context) {
  // Appended: GCC 12 at -O3 warns falsely (-Wrestrict) on a literal plus a string.
  const std::string n = std::to_string(context);
  std::string spec = "name: coord-gpt\ninput: [";
  spec += n;
  spec += "]\nlayers:\n  - embedding: {vocab: 256, dim: 16}\n  - positional: {context: ";
  spec += n;
  spec += "}\n  - transformer: {heads: 2, mlp: 24}\n  - transformer: {heads: 4}\n";
  spec += "  - layernorm\n  - linear: {out: 256}\n";
  return spec;
}
const std::string kGpt = gptSpec(20);
// A context of 400 tokens: a sequence long enough to be cut short.
const std::string kLongGpt = gptSpec(400);

// A generation run of the GPT's layers cut at `cuts` (ring-linked, one worker per stage).
std::vector<Assign> generationAssignments(const std::vector<int64_t>& cuts, bool encrypt,
                                          const std::string& spec = kGpt) {
  std::vector<Assign> as;
  const int p = static_cast<int>(cuts.size()) - 1;
  for (int s = 0; s < p; ++s) {
    Assign a;
    a.job = "generation test";
    a.model_spec = spec;
    a.stage = s;
    a.stages = p;
    a.prev_replicas = s > 0 || p > 1 ? 1 : 0;
    a.next_replicas = s + 1 < p || p > 1 ? 1 : 0;
    a.slice.layers.begin = cuts[static_cast<size_t>(s)];
    a.slice.layers.end = cuts[static_cast<size_t>(s) + 1];
    a.train.seed = 5;
    a.wire.timeout_s = 30;
    a.mode = RunMode::kGenerate;
    a.in_flight = 2;
    a.encrypt = encrypt;
    // (Generation's messages travel raw whatever the job's codecs: still bitwise.)
    a.wire.activations = encrypt ? WireCodec::kF16 : WireCodec::kRaw;
    a.wire.gradients = encrypt ? WireCodec::kI8 : WireCodec::kRaw;
    as.push_back(a);
  }
  return as;
}

TEST(CoordinatorTest, AGenerationRunGivesEachPromptTheTokensAndLogitsOfOneProcess) {
  const std::vector<Prompt> prompts = {{0, {116, 104, 101}, 7, 0.0f, 0, 1},
                                       {1, {97}, 5, 0.8f, 12, 3},
                                       {2, {111, 110, 99, 101}, 9, 1.1f, 0, 4},
                                       {3, {120}, 1, 0.0f, 0, 1},
                                       {4, {122, 122, 32}, 6, 0.6f, 4, 8}};
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model whole(parseModelSpec(kGpt));
  whole.build(be, 5);  // layer i from (seed, i): the stages build the same weights
  for (const auto& [cuts, encrypt] : {std::pair{std::vector<int64_t>{0, 3, 6}, false},
                                      std::pair{std::vector<int64_t>{0, 2, 4, 6}, true},
                                      std::pair{std::vector<int64_t>{0, 6}, false}}) {
    const std::vector<Assign> as = generationAssignments(cuts, encrypt);
    PromptQueue queue;
    // Two prompts before the run, the others while it runs.
    queue.push(prompts[0]);
    queue.push(prompts[1]);
    std::map<int64_t, std::vector<Token>> got;
    RunCallbacks cb;
    cb.token = [&](const Token& t) {
      got[t.id].push_back(t);
      if (t.id == 0 && t.index == 2)
        for (size_t i = 2; i < prompts.size(); ++i) queue.push(prompts[i]);
      if (got.size() == prompts.size() &&
          got[t.id].size() == static_cast<size_t>(prompts[t.id].count))
        queue.close();
    };
    RunOptions ro;
    ro.prompts = &queue;
    auto launcher = threadLauncher();
    const RunResult r = coordinate(as, names(as), *launcher, cb, ro);
    ASSERT_EQ(r.reports.size(), as.size());
    ASSERT_EQ(got.size(), prompts.size());
    for (const Prompt& p : prompts) {
      const Generation want =
          generate(whole, p.tokens, p.count, SamplingOptions{p.temperature, p.top_k, p.seed});
      const std::vector<Token>& tokens = got[p.id];
      ASSERT_EQ(tokens.size(), want.tokens.size()) << "prompt " << p.id;
      for (size_t i = 0; i < tokens.size(); ++i) {
        EXPECT_EQ(tokens[i].index, static_cast<int64_t>(i));
        EXPECT_EQ(tokens[i].token, want.tokens[i]) << "prompt " << p.id << " token " << i;
        const float logit = want.logits[i][static_cast<size_t>(want.tokens[i])];
        EXPECT_EQ(std::memcmp(&tokens[i].logit, &logit, sizeof logit), 0)  // bitwise
            << "prompt " << p.id << " token " << i << ": " << tokens[i].logit << " vs " << logit;
      }
    }
  }
}

// A client that left: its prompt, cancelled as it goes to stage 0, ends early on every
// stage (of 390 tokens asked for, the first and those on their way when the cancel came),
// its tokens are not passed on, the run ends without it unanswered, and the prompt after
// it gets its tokens whole — with one sequence in flight, in the cancelled one's slot.
TEST(CoordinatorTest, ACancelledPromptEndsOnEveryStage) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model whole(parseModelSpec(kLongGpt));
  whole.build(be, 5);
  const Prompt next{1, {98, 99}, 6, 0.0f, 0, 1};
  const Generation want = generate(whole, next.tokens, next.count, SamplingOptions{});
  for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{0, 6}, {0, 3, 6}, {0, 2, 4, 6}}) {
    std::vector<Assign> as = generationAssignments(cuts, false, kLongGpt);
    for (Assign& a : as) a.in_flight = 1;
    PromptQueue queue;
    queue.push({0, {97}, 390, 0.0f, 0, 1});
    queue.cancel(0);
    queue.push(next);
    queue.cancel(5);  // not in flight: nothing to cancel
    std::map<int64_t, std::vector<int32_t>> got;
    RunCallbacks cb;
    cb.token = [&](const Token& t) {
      got[t.id].push_back(t.token);
      if (t.id == 1 && t.index + 1 == next.count) queue.close();
    };
    RunOptions ro;
    ro.prompts = &queue;
    auto launcher = threadLauncher();
    const RunResult r = coordinate(as, names(as), *launcher, cb, ro);
    const std::string where = std::to_string(cuts.size() - 1) + " stages";
    EXPECT_EQ(got.count(0), 0u) << where;
    EXPECT_EQ(got[1], want.tokens) << where;
    EXPECT_EQ(r.cancelled, 1) << where;
    // Without the cancel reaching the stages all 390 would come.
    EXPECT_GE(r.tokens_after_cancel, 1) << where;
    EXPECT_LT(r.tokens_after_cancel, 390) << where;
  }
}

TEST(CoordinatorTest, APromptThatDoesNotFitTheModelEndsTheRunNamingIt) {
  std::vector<Assign> as = generationAssignments({0, 3, 6}, false);
  for (Assign& a : as) a.wire.timeout_s = 2;  // (the worker threads left wait that long)
  PromptQueue queue;
  queue.push({7, std::vector<int32_t>(18, 65), 5, 0.0f, 0, 1});
  queue.close();
  RunOptions ro;
  ro.prompts = &queue;
  auto launcher = threadLauncher();
  testing::expectThrowWith<Error>(
      [&] { coordinate(as, names(as), *launcher, RunCallbacks{}, ro); },
      {"stage 0 replica 0 failed: request 7: a prompt of 18 tokens and 5 new ones exceed the "
       "context of 20"});
}

}  // namespace
}  // namespace tandem::runtime
