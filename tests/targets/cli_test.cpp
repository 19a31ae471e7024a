// The tandem CLI end to end: train on a Fashion-MNIST subset, save, eval, inspect; and bad
// arguments or files exit non-zero with a message that names the problem. (The planning
// path: cli_plan_test.cpp.)
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "backends/cpu/blas_core.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/opencl/devices.h"
#include "core/file.h"
#include "core/model_file.h"
#include "tests/process_util.h"
#include "tests/targets/cli_util.h"
#include "tests/test_util.h"

namespace {

using tandem::testing::cli::CliRun;
using tandem::testing::cli::kModels;
using tandem::testing::cli::run;

TEST(CliTest, TrainSaveEvalInspect) {
  const std::string model = ::testing::TempDir() + "/cli_mlp.tdm";
  const CliRun t = run("train --model " + kModels +
                       "mlp.yaml --epochs 1 --batch 32 --threads 2 "
                       "--train-limit 2000 --test-limit 500 --seed 3 --save " +
                       model);
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("epoch 1/1: train loss"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("samples/s"), std::string::npos) << t.out;
  const auto pos = t.out.find("test accuracy: ");
  ASSERT_NE(pos, std::string::npos) << t.out;
  const std::string acc = t.out.substr(pos + 15, 6);
  EXPECT_GT(std::stod(acc), 0.5) << t.out;

  const CliRun e = run("eval " + model + " --test-limit 500");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("test accuracy: " + acc), std::string::npos) << "train said " << acc << "\n"
                                                                    << e.out;

  const CliRun i = run("inspect " + model);
  ASSERT_EQ(i.code, 0) << i.out;
  EXPECT_NE(i.out.find("optimizer: sgd after 63 steps"), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("parameters: 235146"), std::string::npos) << i.out;
}

// A language model from the command line: a small GPT trains on a text file (byte
// tokens), reports held-out perplexity per epoch, saves, and evaluates to what it said.
TEST(CliTest, TrainAGptOnTextAndEvalIt) {
  const std::string dir = tandem::testing::freshDir("cli_text");
  {
    std::ofstream text(dir + "/corpus.txt");
    for (int i = 0; i < 200; ++i) text << "line " << i % 7 << ": the cat sat on the mat.\n";
  }
  std::ofstream(dir + "/gpt.yaml")
      << "name: gpt-test\ninput: [16]\nlayers:\n  - embedding: {vocab: 256, dim: 16}\n"
      << "  - positional: {context: 16}\n  - transformer: {heads: 2}\n  - layernorm\n"
      << "  - linear: {out: 256}\n";
  const CliRun t = run("train --model " + dir + "/gpt.yaml --data text:" + dir +
                       "/corpus.txt --epochs 2 --batch 16 --optimizer adamw --lr 0.01 "
                       "--threads 2 --no-progress --save " +
                       dir + "/gpt.tdm");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("epoch 2/2: train loss"), std::string::npos) << t.out;
  const auto at = t.out.rfind("test perplexity ");
  ASSERT_NE(at, std::string::npos) << t.out;
  const double perplexity = std::stod(t.out.substr(at + 16));
  EXPECT_LT(perplexity, 30.0) << "far below 256, the perplexity of a guess: " << t.out;
  const CliRun e = run("eval " + dir + "/gpt.tdm --data text:" + dir + "/corpus.txt");
  ASSERT_EQ(e.code, 0) << e.out;
  char said[32];
  std::snprintf(said, sizeof said, "test perplexity: %.2f", perplexity);
  EXPECT_NE(e.out.find(said), std::string::npos) << said << "\n" << e.out;

  // Generation: the prompt, then the new bytes, then the timing; the same text with the
  // cache and without (greedy); --serve answers each stdin line with a line of JSON.
  const std::string gen = "generate " + dir + "/gpt.tdm --tokens 6 ";
  const CliRun g = run(gen + "--prompt 'the cat'");
  ASSERT_EQ(g.code, 0) << g.out;
  ASSERT_EQ(g.out.rfind("the cat", 0), 0u) << g.out;
  EXPECT_NE(g.out.find("7 prompt tokens, 6 new: time to first token"), std::string::npos) << g.out;
  EXPECT_NE(g.out.find("inter-token p50"), std::string::npos) << g.out;
  const CliRun plain = run(gen + "--prompt 'the cat' --no-cache");
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(plain.out.substr(0, 13), g.out.substr(0, 13));
  // Over 2 tensor ranks (the heads and MLP features split 1 : 3): the same text.
  const CliRun tensor = run(gen + "--prompt 'the cat' --tensor 2 --shares 1,3");
  ASSERT_EQ(tensor.code, 0) << tensor.out;
  EXPECT_NE(tensor.out.find(g.out.substr(0, 13)), std::string::npos) << tensor.out;
  EXPECT_NE(tensor.out.find("6 new over 2 tensor ranks: time to first token"), std::string::npos)
      << tensor.out;
  // Training continues from the file's weights on 2 tensor ranks: with a learning rate of
  // almost nothing, the test perplexity is the file's.
  const CliRun resumed = run("train --model " + dir + "/gpt.tdm --data text:" + dir +
                             "/corpus.txt --tensor 2 --lr 1e-12 --batch 16 --train-limit 16 "
                             "--no-progress");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  char epoch_said[40];
  std::snprintf(epoch_said, sizeof epoch_said, "test perplexity %.2f,", perplexity);
  EXPECT_NE(resumed.out.find(epoch_said), std::string::npos) << epoch_said << "\n" << resumed.out;
  const CliRun served = tandem::testing::runCommand(
      "printf 'the cat\\nline 3:\\n' | " + std::string(TANDEM_CLI) + " " + gen + "--serve");
  ASSERT_EQ(served.code, 0) << served.out;
  EXPECT_NE(served.out.find("{\"first_token_ms\":"), std::string::npos) << served.out;
  EXPECT_NE(served.out.find("\"prompt\":\"line 3:\",\"text\":"), std::string::npos) << served.out;
  EXPECT_NE(served.out.find("served 2 prompts: 12 tokens, "), std::string::npos) << served.out;
  if (TANDEM_HAS_ONNX) {  // exported as ONNX, it evaluates and generates as the model file
    const CliRun exported = run("export " + dir + "/gpt.tdm --onnx " + dir + "/gpt.onnx");
    ASSERT_EQ(exported.code, 0) << exported.out;
    const CliRun onnx_eval = run("eval " + dir + "/gpt.onnx --data text:" + dir + "/corpus.txt");
    EXPECT_NE(onnx_eval.out.find(said), std::string::npos) << said << "\n" << onnx_eval.out;
    const CliRun onnx_gen = run("generate " + dir + "/gpt.onnx --tokens 6 --prompt 'the cat'");
    ASSERT_EQ(onnx_gen.code, 0) << onnx_gen.out;
    EXPECT_EQ(onnx_gen.out.substr(0, 13), g.out.substr(0, 13));
  }
  const CliRun longer = run(gen + "--prompt 'a prompt longer than the context of sixteen'");
  EXPECT_EQ(longer.code, 1) << longer.out;
  EXPECT_EQ(
      longer.out.rfind("error: a prompt of 43 tokens and 6 new ones exceed the context of 16", 0),
      0u)
      << longer.out;
}

// Data parallel from the command line: two replicas with unequal shares train, say so,
// and save a model that evaluates to the accuracy they printed; bad wiring is named;
// shares come from a profile.
TEST(CliTest, TrainWithReplicas) {
  const std::string model = ::testing::TempDir() + "/cli_dp.tdm";
  const CliRun t = run("train --model " + kModels +
                       "mlp.yaml --epochs 1 --batch 64 --replicas 2 --shares 3,1 "
                       "--train-limit 2000 --test-limit 500 --no-progress --save " +
                       model);
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("data parallel over 2 replicas"), std::string::npos) << t.out;
  const auto pos = t.out.find("test accuracy: ");
  ASSERT_NE(pos, std::string::npos) << t.out;
  const std::string acc = t.out.substr(pos + 15, 6);
  EXPECT_GT(std::stod(acc), 0.5) << t.out;
  const CliRun e = run("eval " + model + " --test-limit 500");
  EXPECT_NE(e.out.find("test accuracy: " + acc), std::string::npos) << e.out;
  const CliRun three = run("train --model " + kModels +
                           "mlp.yaml --replicas 2 --devices cpu,cpu,cpu --train-limit 10");
  EXPECT_EQ(three.code, 1);
  EXPECT_NE(three.out.find("--devices names 3 devices for --replicas 2"), std::string::npos)
      << three.out;
  const CliRun shares =
      run("train --model " + kModels + "mlp.yaml --replicas 2 --shares 1 --train-limit 10");
  EXPECT_EQ(shares.code, 1);
  EXPECT_NE(shares.out.find("--shares gives 1 shares for 2 replicas"), std::string::npos)
      << shares.out;

  // Shares from a profile of the devices: two replicas on one device split evenly.
  const std::string profile = ::testing::TempDir() + "/cli_dp_profile.json";
  const CliRun p = run("profile --model " + kModels +
                       "mlp.yaml --devices cpu --batch 8 --repeats 1 --warmup 0 --out " + profile);
  ASSERT_EQ(p.code, 0) << p.out;
  const CliRun even = run("train --model " + kModels +
                          "mlp.yaml --epochs 1 --replicas 2 --train-limit 128 --test-limit 64 "
                          "--no-progress --profile " +
                          profile);
  ASSERT_EQ(even.code, 0) << even.out;
  EXPECT_NE(even.out.find("batch shares from " + profile + ": cpu 50.0% ("), std::string::npos)
      << even.out;
  const CliRun both = run("train --model " + kModels + "mlp.yaml --replicas 2 --shares 1,1 " +
                          "--train-limit 10 --profile " + profile);
  EXPECT_EQ(both.code, 1);
  EXPECT_NE(both.out.find("give --shares or --profile, not both"), std::string::npos) << both.out;
  const CliRun other = run("train --model " + kModels + "cnn.yaml --replicas 2 " +
                           "--train-limit 10 --profile " + profile);
  EXPECT_EQ(other.code, 1);
  EXPECT_NE(other.out.find("profiles model 'mlp', not 'cnn'"), std::string::npos) << other.out;
}

// ZeRO stage 1 from the command line: the optimizer state sharded over the replicas (each
// replica's share printed), the saved model file — weights and the merged optimizer state
// — byte for byte the plain replicas'; a stage without replicas, or one not implemented,
// refused.
TEST(CliTest, TrainWithShardedOptimizerStateSavesThePlainReplicasFile) {
  const std::string dir = tandem::testing::freshDir("cli_zero");
  std::string saved[4];
  for (const int zero : {0, 1, 2, 3}) {
    saved[zero] = dir + "/zero" + std::to_string(zero) + ".tdm";
    const CliRun t = run("train --model " + kModels +
                         "mlp.yaml --epochs 1 --batch 64 --replicas 2 --optimizer adamw "
                         "--train-limit 1000 --test-limit 200 --no-progress --zero " +
                         std::to_string(zero) + " --save " + saved[zero]);
    ASSERT_EQ(t.code, 0) << t.out;
    EXPECT_NE(t.out.find("optimizer state per replica (ZeRO " + std::to_string(zero) + "): "),
              std::string::npos)
        << t.out;
    // mlp.yaml's 235,146 gradients (0.90 MiB): whole on each plain replica all the time,
    // about a half each between steps at stage 2.
    const char* grads =
        zero >= 2 ? "gradients per replica between steps (most at once): 0.45 ("
                  : "gradients per replica between steps (most at once): 0.90 (0.90), 0.90 (0.90)";
    EXPECT_NE(t.out.find(grads), std::string::npos) << t.out;
    const char* values =
        zero == 3 ? "parameters per replica between steps (most at once): 0.45 ("
                  : "parameters per replica between steps (most at once): 0.90 (0.90), 0.90 (0.90)";
    EXPECT_NE(t.out.find(values), std::string::npos) << t.out;
  }
  EXPECT_EQ(tandem::readFile(saved[0], "model file"), tandem::readFile(saved[1], "model file"));
  EXPECT_EQ(tandem::readFile(saved[0], "model file"), tandem::readFile(saved[2], "model file"));
  EXPECT_EQ(tandem::readFile(saved[0], "model file"), tandem::readFile(saved[3], "model file"));
  const tandem::ModelFile file = tandem::readModelFile(saved[1]);
  ASSERT_TRUE(file.optimizer.has_value());
  EXPECT_EQ(file.optimizer->tensors.size(), 2 * file.params.size()) << "adamw's m and v, merged";
  const CliRun alone = run("train --model " + kModels + "mlp.yaml --zero 1 --train-limit 10");
  EXPECT_EQ(alone.code, 1);
  EXPECT_NE(alone.out.find("--zero 1 shards the training state over data-parallel replicas"),
            std::string::npos)
      << alone.out;
  // Unequal room: replica 0's shards three times replica 1's, the same file again.
  const CliRun unequal = run("train --model " + kModels +
                             "mlp.yaml --epochs 1 --batch 64 --replicas 2 --optimizer adamw "
                             "--train-limit 1000 --test-limit 200 --no-progress --zero 3 "
                             "--state-shares 3,1 --save " +
                             dir + "/unequal.tdm");
  ASSERT_EQ(unequal.code, 0) << unequal.out;
  EXPECT_NE(unequal.out.find("optimizer state per replica (ZeRO 3): 1.35, 0.45 MiB"),
            std::string::npos)
      << unequal.out;
  EXPECT_EQ(tandem::readFile(saved[0], "model file"),
            tandem::readFile(dir + "/unequal.tdm", "model file"));
  for (const auto& [args, says] :
       {std::pair<std::string, std::string>{"--replicas 2 --state-shares 1,1",
                                            "--state-shares sizes the replicas' shards"},
        {"--replicas 2 --zero 1 --state-shares 1,2,3", "--state-shares gives 3 shares for 2"},
        {"--replicas 2 --zero 1 --state-shares 1,0", "state share 0 is not a positive number"}}) {
    const CliRun bad = run("train --model " + kModels + "mlp.yaml --train-limit 10 " + args);
    EXPECT_EQ(bad.code, 1) << args;
    EXPECT_NE(bad.out.find(says), std::string::npos) << args << "\n" << bad.out;
  }
  const CliRun four =
      run("train --model " + kModels + "mlp.yaml --replicas 2 --zero 4 --train-limit 10");
  EXPECT_EQ(four.code, 2) << "a usage error";
  EXPECT_NE(four.out.find("--zero: Value 4 not in range"), std::string::npos) << four.out;
}

// Train loss as the epoch line prints it.
double trainLoss(const std::string& out) {
  const auto pos = out.find("train loss ");
  return pos == std::string::npos ? -1 : std::stod(out.substr(pos + 11, 6));
}

// Tensor parallel from the command line: the mlp's first linear pair split 1 : 3 over two
// ranks trains as one device does (to rounding: tensor_parallel_test.cpp), saves the whole
// model merged from the ranks' slices, and bad wiring is named.
TEST(CliTest, TrainWithTensorRanks) {
  const std::string model = ::testing::TempDir() + "/cli_tp.tdm";
  const std::string common = "train --model " + kModels +
                             "mlp.yaml --epochs 1 --batch 64 --train-limit 2000 --test-limit 500 "
                             "--no-progress";
  const CliRun t = run(common + " --tensor 2 --shares 1,3 --save " + model);
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("tensor parallel over 2 ranks"), std::string::npos) << t.out;
  EXPECT_NE(
      t.out.find("tensor split over 2 ranks (feature shares 1 : 3): 0 flatten whole, 1 linear "
                 "column, 2 relu slice, 3 linear row, 4 relu whole, 5 linear whole"),
      std::string::npos)
      << t.out;
  const CliRun one = run(common);
  ASSERT_EQ(one.code, 0) << one.out;
  EXPECT_NEAR(trainLoss(t.out), trainLoss(one.out), 2e-4) << t.out << one.out;
  const auto pos = t.out.find("test accuracy: ");
  ASSERT_NE(pos, std::string::npos) << t.out;
  const std::string acc = t.out.substr(pos + 15, 6);
  EXPECT_GT(std::stod(acc), 0.5) << t.out;
  const CliRun e = run("eval " + model + " --test-limit 500");  // the whole model's shapes
  EXPECT_NE(e.out.find("test accuracy: " + acc), std::string::npos) << e.out;

  const CliRun both = run(common + " --tensor 2 --replicas 2");
  EXPECT_EQ(both.code, 1);
  EXPECT_NE(both.out.find("--tensor 2 with --replicas 2: one node trains on one parallel axis"),
            std::string::npos)
      << both.out;
  const CliRun three = run(common + " --tensor 2 --devices cpu,cpu,cpu");
  EXPECT_EQ(three.code, 1);
  EXPECT_NE(three.out.find("--devices names 3 devices for --tensor 2 (give one, or one per "
                           "tensor rank)"),
            std::string::npos)
      << three.out;
  const CliRun shares = run(common + " --tensor 2 --shares 1");
  EXPECT_EQ(shares.code, 1);
  EXPECT_NE(shares.out.find("--shares gives 1 shares for 2 tensor ranks"), std::string::npos)
      << shares.out;
  // Residual blocks split over the convolution pairs inside them.
  const CliRun residual =
      run("train --model " + kModels + "resnet-mini.yaml --tensor 2 --train-limit 10");
  EXPECT_EQ(residual.code, 0) << residual.out;
  EXPECT_NE(residual.out.find("2 residual split, 3 relu whole, 4 residual split"),
            std::string::npos)
      << residual.out;
  const std::string dir = tandem::testing::freshDir("cli_tensor");
  std::ofstream(dir + "/lone.yaml") << "name: lone\ninput: [1, 28, 28]\nlayers: [flatten, "
                                       "{linear: {out: 10}}]\n";
  const CliRun none = run("train --model " + dir + "/lone.yaml --tensor 2 --train-limit 10");
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.out.find("hold no pair of linear layers"), std::string::npos) << none.out;
}

TEST(CliTest, InspectPrintsAPerLayerTable) {
  const CliRun r = run("inspect " + kModels + "cnn.yaml --batch 2");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"conv2d", "[64, 7, 7]", "maxpool2d", "total", "parameters: 421642",
                        "forward FLOPs per sample: 8595466"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

// tandem import: a PyTorch-exported ONNX model (ONNX's conformance data) as a model file
// that inspect and eval read; a file that is not ONNX, and a missing one, are named.
TEST(CliTest, ImportWritesAModelFileFromAnOnnxModel) {
  if (!TANDEM_HAS_ONNX) GTEST_SKIP() << "built without ONNX import (TANDEM_ONNX=OFF)";
  const std::string onnx =
      "/usr/share/libonnx-testdata/data/pytorch-converted/test_Conv2d/model.onnx";
  if (!std::filesystem::exists(onnx)) GTEST_SKIP() << "libonnx-testdata is not installed";
  const std::string dir = ::testing::TempDir() + "cli_import";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  CliRun r = run("import " + onnx + " --out " + dir + "/conv.tdm");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("1 layers, 76 parameters, input [3, 7, 5], output [4, 5, 4]"),
            std::string::npos)
      << r.out;
  r = run("inspect " + dir + "/conv.tdm");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("conv2d"), std::string::npos) << r.out;
  // Imported for a device: the CPU runs every layer; a device there is not is refused.
  r = run("import " + onnx + " --out " + dir + "/conv-cpu.tdm --device cpu");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("cpu runs every layer's forward"), std::string::npos) << r.out;
  r = run("import " + onnx + " --out " + dir + "/conv-99.tdm --device opencl:99");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("no OpenCL device 99"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/conv-99.tdm"));
  std::ofstream(dir + "/bad.onnx") << "not protobuf";
  r = run("import " + dir + "/bad.onnx --out " + dir + "/bad.tdm");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("bad.onnx: not an ONNX model"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/bad.tdm"));
  r = run("import " + dir + "/none.onnx --out " + dir + "/x.tdm");
  EXPECT_EQ(r.code, 2) << r.out;
}

// ONNX both ways around a pipeline: a trained model exported, served and trained from as
// `model: x.onnx` across 3 stages, the run's merged save exported and imported back.
TEST(CliTest, AnOnnxModelRunsAsAJobAndItsSaveExportsBackBitwise) {
  if (!TANDEM_HAS_ONNX) GTEST_SKIP() << "built without ONNX (TANDEM_ONNX=OFF)";
  const std::string dir = ::testing::TempDir() + "cli_onnx/";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  CliRun r = run("train --model " + kModels +
                 "mlp.yaml --epochs 1 --batch 32 --threads 1 --train-limit 500 --test-limit 200 "
                 "--seed 3 --save " +
                 dir + "a.tdm");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto pos = r.out.find("test accuracy: ");
  ASSERT_NE(pos, std::string::npos) << r.out;
  const std::string acc = r.out.substr(pos, 21);
  r = run("export " + dir + "a.tdm --onnx " + dir + "a.onnx");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("6 layers, 6 parameter tensors, opset 17"), std::string::npos) << r.out;
  // Served from the ONNX model: its weights, so the accuracy training printed.
  std::ofstream(dir + "infer.yaml") << "model: a.onnx\ntest_limit: 200\nbatch: 32\n"
                                    << "partition: equal\nstages: 3\n";
  r = run("infer " + dir + "infer.yaml");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(acc), std::string::npos) << acc << "\n" << r.out;
  EXPECT_EQ(r.out.find("untrained"), std::string::npos) << r.out;
  // Trained from it across 3 stages, saved merged, exported, imported: the same weights.
  std::ofstream(dir + "train.yaml") << "model: a.onnx\ntrain_limit: 256\ntest_limit: 64\n"
                                    << "batch: 32\nmicrobatches: 4\npartition: equal\nstages: 3\n"
                                    << "save: b.tdm\n";
  r = run("run " + dir + "train.yaml");
  ASSERT_EQ(r.code, 0) << r.out;
  r = run("export " + dir + "b.tdm --onnx " + dir + "b.onnx");
  ASSERT_EQ(r.code, 0) << r.out;
  r = run("import " + dir + "b.onnx --out " + dir + "c.tdm");
  ASSERT_EQ(r.code, 0) << r.out;
  const tandem::ModelFile a = tandem::readModelFile(dir + "a.tdm");
  const tandem::ModelFile b = tandem::readModelFile(dir + "b.tdm");
  const tandem::ModelFile c = tandem::readModelFile(dir + "c.tdm");
  ASSERT_EQ(c.params.size(), b.params.size());
  for (size_t i = 0; i < b.params.size(); ++i) {
    EXPECT_EQ(c.params[i].name, b.params[i].name);
    EXPECT_TRUE(c.params[i].data == b.params[i].data) << b.params[i].name;
  }
  EXPECT_FALSE(a.params[0].data == b.params[0].data);  // the run trained
  // The other commands take it too.
  r = run("inspect " + dir + "a.onnx");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("parameters: 235146"), std::string::npos) << r.out;
  r = run("train --model " + dir + "a.onnx --replicas 2 --epochs 1 --train-limit 64");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("a.onnx: starting data-parallel replicas from the weights a model file or "
                       "ONNX model brings"),
            std::string::npos)
      << r.out;
  // A file that is not a model file is refused, and nothing is written.
  std::ofstream(dir + "junk.tdm") << "junk";
  r = run("export " + dir + "junk.tdm --onnx " + dir + "junk.onnx");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir + "junk.onnx"));
}

TEST(CliTest, DevicesListsTheCpuAndEveryOpenClDevice) {
  const CliRun r = run("devices");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"device", "units", "memory", "max alloc", "fp16", "platform", "vendor",
                        "\ncpu ", " OpenBLAS "})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  const auto cl = tandem::opencl::listClDevices();
  for (const auto& d : cl) {
    EXPECT_NE(r.out.find(std::string("\n").append(d.label()).append(" ")), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(d.name), std::string::npos) << r.out;
  }
  if (cl.empty()) {
    EXPECT_NE(r.out.find("no OpenCL devices: "), std::string::npos) << r.out;
  }
}

// The OpenBLAS kernel set `tandem devices` names on the CPU's line.
std::string cpuBlasCore(const std::string& out) {
  const auto line = out.find("\ncpu ");
  const auto at = out.find(" OpenBLAS ", line);
  if (line == std::string::npos || at == std::string::npos) return "";
  const auto begin = at + std::string(" OpenBLAS ").size();
  return out.substr(begin, out.find(' ', begin) - begin);
}

// `tandem devices` names the kernels OpenBLAS runs: a set as wide as the CPU (OpenBLAS's
// pick, or the one tandem restarts onto, backends/cpu/blas_core.h), or the set
// OPENBLAS_CORETYPE names, kept as named.
TEST(CliTest, DevicesNamesTheOpenBlasKernelsThatRun) {
  const CliRun r = run("devices");
  ASSERT_EQ(r.code, 0) << r.out;
  // The same library, CPU and environment as this test's (which starts as tandem does).
  EXPECT_EQ("OpenBLAS " + cpuBlasCore(r.out), tandem::cpu::CpuBackend::hostInfo(1).platform)
      << r.out;
  const tandem::cpu::BlasCoreFacts here = tandem::cpu::blasCoreFacts();
  const CliRun unnamed = tandem::testing::runCommand("env -u OPENBLAS_CORETYPE " +
                                                     std::string(TANDEM_CLI) + " devices");
  ASSERT_EQ(unnamed.code, 0) << unnamed.out;
  if (here.dynamic_arch) {
    EXPECT_GE(static_cast<int>(tandem::cpu::coreClass(cpuBlasCore(unnamed.out))),
              static_cast<int>(here.cpu))
        << unnamed.out;
  }
#if defined(__x86_64__)
  for (const char* core : {"Haswell", "Prescott"}) {
    const CliRun named = tandem::testing::runCommand(std::string("OPENBLAS_CORETYPE=") + core +
                                                     " " + TANDEM_CLI + " devices");
    ASSERT_EQ(named.code, 0) << named.out;
    EXPECT_EQ(cpuBlasCore(named.out), core) << named.out;
  }
#endif
}

// tandem profile on every device there is: a table per device, a JSON file that
// validates against docs/profile.schema.json (python3-jsonschema, which setup installs)
// and, against itself, every median within a factor 1.
TEST(CliTest, ProfileWritesASchemaValidProfileForEveryDevice) {
  std::string devices = "cpu";
  for (const auto& d : tandem::opencl::listClDevices()) devices.append(",").append(d.label());
  const std::string out = ::testing::TempDir() + "cli_profile.json";
  const CliRun r = run("profile --model " TANDEM_SOURCE_DIR
                       "/examples/models/mlp.yaml --batch 8 --repeats 2 --warmup 1 --devices " +
                       devices + " --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"cpu (", "sgemm 1024:", "forward ms", "backward ms", "linear", "wrote",
                        "fwd GFLOP/s", "layers with weights, forward and backward: ", "of sgemm"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  // The first linear layer (784 -> 256, layer 1) at batch 8: its forward GFLOP/s is its
  // FLOPs over its forward time, as printed (to the table's rounding).
  std::istringstream rows(r.out.substr(r.out.find("\n  1     linear")));
  std::string type, spread1, spread2, fwd_pct;
  int64_t index = 0, activation = 0, params = 0;
  double fwd_ms = 0, bwd_ms = 0, fwd_gflops = 0;
  ASSERT_TRUE(rows >> index >> type >> fwd_ms >> spread1 >> bwd_ms >> spread2 >> activation >>
              params >> fwd_gflops >> fwd_pct)
      << r.out;
  const double flops = 8.0 * (2 * 784 * 256 + 256);
  EXPECT_NEAR(fwd_gflops, flops / (fwd_ms * 1e-3) / 1e9,
              0.05 + 0.01 * flops / (fwd_ms * 1e-3) / 1e9)
      << r.out;
  const std::string check =
      "python3 -c \"import json, jsonschema; jsonschema.validate(json.load("
      "open('" +
      out + "')), json.load(open('" TANDEM_SOURCE_DIR "/docs/profile.schema.json')))\" 2>&1";
  EXPECT_EQ(std::system(check.c_str()), 0) << check;
  const CliRun again = run("profile --model " TANDEM_SOURCE_DIR
                           "/examples/models/mlp.yaml --batch 8 --repeats 2 --warmup 1 "
                           "--devices cpu --against " +
                           out);
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_NE(again.out.find("cpu: layers of 1 ms or more within a factor"), std::string::npos)
      << again.out;
  const CliRun other = run("profile --model " TANDEM_SOURCE_DIR
                           "/examples/models/mlp.yaml --batch 4 --repeats 1 --against " +
                           out);
  EXPECT_EQ(other.code, 1);
  EXPECT_NE(other.out.find("profiles model 'mlp' at batch 8, not 'mlp' at batch 4"),
            std::string::npos)
      << other.out;
  const CliRun bad =
      run("profile --model " TANDEM_SOURCE_DIR "/examples/models/mlp.yaml --devices cpu,opencl:99");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("no OpenCL device 99"), std::string::npos) << bad.out;
}

TEST(CliTest, SchedulePrintsListsAndDiagram) {
  const CliRun r = run("schedule --kind 1f1b -p 4 -m 8");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"stage 3: receive activation 0, forward 0, backward 0, send gradient 0",
                        "stage 0 |F0|F1|F2|F3|..|..|..|B0|F4|B1|",
                        "bubble: 0.272727 of stage time (formula (p-1)/(m+p-1): 0.272727)",
                        "peak stashed microbatches per stage: 4 3 2 1"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

// Serving a job that names no weights serves untrained parameters: it works, and says so.
TEST(CliTest, InferWithoutWeightsWarnsThatTheyAreUntrained) {
  const std::string job = ::testing::TempDir() + "/cli_infer_fresh.yaml";
  std::ofstream(job) << "model: " << kModels << "mlp.yaml\ntest_limit: 128\nbatch: 32\n"
                     << "partition: equal\nstages: 2\n";
  const CliRun r = run("infer " + job);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("names no 'weights': serving freshly initialised (untrained) parameters"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("throughput: "), std::string::npos) << r.out;
}

// docs/cli.md's exit codes: 0 done (help and version too), 1 the work failed (a bad file
// or value, a failed job), 2 bad usage — whatever the mistake and the command; 130
// interrupted (tandemd_test).
TEST(CliTest, ExitCodesAreTheDocumentedOnes) {
  const std::string junk = ::testing::TempDir() + "/cli_exit_junk.tdm";
  std::ofstream(junk) << "this is not a model";
  const std::string job = ::testing::TempDir() + "/cli_exit_job.yaml";
  std::ofstream(job) << "model: " << kModels << "mlp.yaml\npartition: equal\nstages: 2\n"
                     << "batch: 30\nmicrobatches: 31\n";
  struct Case {
    std::string args;
    int code;
  } cases[] = {
      {"--help", 0},
      {"--version", 0},
      {"run --help", 0},
      {"", 2},
      {"--bogus", 2},
      {"frobnicate", 2},
      {"train", 2},
      {"train --model " + kModels + "mlp.yaml --bogus", 2},
      {"train --model nope.yaml", 2},
      {"eval nope.tdm", 2},
      {"inspect nope.tdm", 2},
      {"schedule -p x", 2},
      {"run", 2},
      {"partition --batch 0", 2},
      {"eval " + junk, 1},
      {"run " + job, 1},
      {"partition --model " + kModels +
           "mlp.yaml --cluster " TANDEM_SOURCE_DIR
           "/examples/clusters/local.yaml --batch 4 --microbatches 5",
       1},
  };
  for (const Case& c : cases) {
    const CliRun r = run(c.args);
    EXPECT_EQ(r.code, c.code) << "tandem " << c.args << "\n" << r.out;
  }
  // --help shows the defaults.
  const CliRun help = run("train --help");
  EXPECT_NE(help.out.find("--epochs INT=1 "), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--batch INT=64 "), std::string::npos) << help.out;
}

TEST(CliTest, AnUnknownCommandIsToldEveryCommandTheHelpLists) {
  const CliRun help = run("--help");
  ASSERT_EQ(help.code, 0) << help.out;
  const size_t from = help.out.find("Subcommands:");
  ASSERT_NE(from, std::string::npos) << help.out;
  std::vector<std::string> commands;
  std::istringstream lines(help.out.substr(from));
  std::string line;
  std::getline(lines, line);
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    if (std::string word; words >> word) commands.push_back(word);
  }
  ASSERT_GE(commands.size(), 10u) << help.out;
  const CliRun r = run("frobnicate");
  EXPECT_EQ(r.code, 2) << r.out;
  for (const std::string& c : commands)
    EXPECT_NE(r.out.find(" " + c + (c == commands.back() ? ";" : ",")), std::string::npos)
        << c << " not in: " << r.out;
  EXPECT_EQ(r.out.find("stage"), std::string::npos) << r.out;  // the hidden worker command
}

TEST(CliTest, BadInputsExitNonZeroWithAMessage) {
  const std::string bad_yaml = ::testing::TempDir() + "/cli_bad.yaml";
  std::ofstream(bad_yaml) << "input: [1, 28, 28]\nlayers:\n  - flatten\n  - linear: {out: ten}\n";
  const std::string junk = ::testing::TempDir() + "/cli_junk.tdm";
  std::ofstream(junk) << "this is not a model";
  // `save:` makes its folder, but not under a file.
  const std::string unsaveable = ::testing::TempDir() + "/cli_unsaveable.yaml";
  std::ofstream(unsaveable) << "model: " << kModels << "mlp.yaml\ndata: fashion-mnist\n"
                            << "partition: equal\nstages: 2\nsave: " << junk << "/dir/m.tdm\n";
  const std::string plain_job = ::testing::TempDir() + "/cli_plain_job.yaml";
  std::ofstream(plain_job) << "model: " << kModels << "mlp.yaml\ndata: fashion-mnist\n"
                           << "partition: equal\nstages: 2\n";
  const std::string model_file = ::testing::TempDir() + "/cli_a_model.tdm";
  ASSERT_EQ(run("train --model " + kModels + "mlp.yaml --train-limit 64 --test-limit 16 --save " +
                model_file)
                .code,
            0);
  // The same model with int8 weights, and its f32 file under another extension.
  const std::string int8_file = ::testing::TempDir() + "/cli_a_model_int8.tdm";
  ASSERT_EQ(run("quantize " + model_file + " " + int8_file + " --int8").code, 0);
  const std::string renamed = ::testing::TempDir() + "/cli_a_model.bin";
  std::filesystem::copy_file(model_file, renamed,
                             std::filesystem::copy_options::overwrite_existing);
  // A plan placing a stage on a device its node does not have.
  const std::string no_device_plan = ::testing::TempDir() + "/cli_no_device_plan.yaml";
  std::ofstream(no_device_plan)
      << "stages:\n  - {layers: [0, 3], devices: [local/cpu0], backend: opencl:7}\n"
      << "  - {layers: [3, 6], devices: [local/cpu1], backend: cpu}\n";
  const std::string no_device_job = ::testing::TempDir() + "/cli_no_device_job.yaml";
  std::ofstream(no_device_job) << "model: " << kModels << "mlp.yaml\npartition: " << no_device_plan
                               << "\n";
  const std::string missing_weights = ::testing::TempDir() + "/cli_missing_weights.yaml";
  std::ofstream(missing_weights) << "model: " << kModels << "mlp.yaml\npartition: equal\n"
                                 << "stages: 2\nweights: /nonexistent/m.tdm\n";
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"train --model " + bad_yaml, "field 'out' must be an integer"},
      {"train --model " + kModels + "mlp.yaml --lr-schedule cosine",
       "lr_schedule cosine needs decay_steps > 0"},
      {"train --model " + kModels + "mlp.yaml --lr-schedule linear",
       "--lr-schedule: linear not in {constant,step,cosine}"},
      {"train --model " + kModels + "mlp.yaml --optimizer rmsprop", "rmsprop"},
      {"train --model " + kModels + "mlp.yaml --batch 0", "--batch must be positive"},
      {"train --model " + kModels + "mlp.yaml --threads 0", "--threads"},
      {"train --model " + kModels + "mlp.yaml --data-dir /nonexistent", "dataset-fashion-mnist"},
      {"train --model " + kModels + "mlp.yaml --data cifar", "must be fashion-mnist or text:PATH"},
      {"train --model " + kModels + "mlp.yaml --data text:" + bad_yaml,
       "needs a model whose input is [T] token ids"},
      {"train --model " + kModels + "gpt-mini.yaml --data text:" + std::string(TANDEM_CLI),
       "is not text (UTF-8 without NUL bytes)"},
      {"train --model " + kModels + "gpt-mini.yaml --data text:" + bad_yaml,
       "too little for a context of 128"},
      {"train --model " + kModels + "mlp.yaml --device opencl:7", "no OpenCL device 7"},
      {"train --model /nonexistent.yaml", "nonexistent.yaml"},
      {"eval " + junk, "not a tandem model file"},
      {"generate " + model_file + " --prompt hello", "is not a language model"},
      {"generate " + model_file, "give --prompt TEXT, or --serve"},
      {"inspect " + bad_yaml, "layer 1 (linear"},
      {"frobnicate", "unknown command 'frobnicate'"},
      {"schedule --kind zb", "unknown schedule 'zb'"},
      {"schedule -p 0", "--stages"},
      {"partition --batch 0", "--batch: must be a positive number, got '0'"},
      {"profile --model " + kModels + "mlp.yaml --devices cpu --batch 99999999999999",
       "error: out of memory"},
      {"profile --model " + kModels + "mlp.yaml --devices cpu --against " + junk, junk},
      // Refused before training, not after it.
      {"train --model " + kModels + "mlp.yaml --save /nonexistent/dir/m.tdm",
       "cannot write model file '/nonexistent/dir/m.tdm': directory '/nonexistent/dir' does "
       "not exist"},
      {"profile --model " + kModels + "mlp.yaml --devices cpu --out /nonexistent/p.json",
       "cannot write profile '/nonexistent/p.json'"},
      {"run " + unsaveable, "cannot make the folder of save: '" + junk + "/dir'"},
      {"run " + plain_job + " --timeline " + junk + "/tl",
       "cannot make the timeline directory '" + junk + "/tl'"},
      {"train --model " + kModels + "mlp.yaml --replicas 2 --bucket-mib nan",
       "--bucket-mib: must be a positive number, got 'nan'"},
      {"train --model " + kModels + "mlp.yaml --replicas 2 --bucket-mib 1e30",
       "--bucket-mib 1e+30 is above 1048576"},
      {"train --model " + kModels + "mlp.yaml --lr inf", "learning rate inf must be a positive"},
      {"train --model " + kModels + "mlp.yaml --replicas 2 --shares 1,nan", "got nan"},
      {"partition --model " + kModels +
           "mlp.yaml --cluster " TANDEM_SOURCE_DIR
           "/examples/clusters/local.yaml --batch 4 --microbatches 5",
       "--microbatches 5 exceeds --batch 4"},
      {"train --model " + renamed, "is a tandem model file (written by a save), not a model spec"},
      {"train --model " + int8_file,
       "layer 1 (linear) holds int8 weights, which are for inference only"},
      {"quantize " + int8_file + " /tmp/never.tdm --int8", "holds int8 weights already"},
      {"quantize " + model_file + " /tmp/never.tdm --int8 --group 7",
       "linear: an int8 group of 7 does not divide its 256 inputs"},
      {"quantize " + model_file + " /tmp/never.tdm", "--int8 is required"},
      // Every device is opened before the first is measured.
      {"profile --model " + kModels + "mlp.yaml --devices cpu,opencl:7", "no OpenCL device 7"},
      {"infer " + missing_weights, "cannot open weights '/nonexistent/m.tdm'"},
      {"infer " + plain_job + " --answers /nonexistent/a.txt",
       "cannot write the answers to '/nonexistent/a.txt'"},
      {"infer " + plain_job + " --rate -1", "--rate: Value -1 not in range"},
      {"run " + no_device_job,
       "cli_no_device_job.yaml:2:12: node 'local' has no device 'opencl:7' for stage 0 (it has "
       "cpu"},
  };
  for (const Case& c : cases) {
    const CliRun r = run(c.args);
    EXPECT_NE(r.code, 0) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("epoch 1/"), std::string::npos) << c.args << ": trained\n" << r.out;
    EXPECT_EQ(r.out.find("forward ms"), std::string::npos) << c.args << ": profiled\n" << r.out;
    EXPECT_EQ(r.out.find("pid "), std::string::npos) << c.args << ": started workers\n" << r.out;
  }
}

}  // namespace
