// `tandem run` with the parallel axes beside stages, across worker processes: replicated
// stages (within rounding of single-device accumulation), a stage split over tensor ranks,
// and replicas that shard their training state (bitwise the plain replicas' files, and
// resumed bitwise).
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "core/data/dataset.h"
#include "core/file.h"
#include "core/model_file.h"
#include "tests/pipeline/run_util.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using testing::Reference;
using testing::RunProcess;
using testing::singleDevice;
using testing::writeJob;

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

}  // namespace
}  // namespace tandem
