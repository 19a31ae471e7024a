// The tandem CLI end to end: train on a Fashion-MNIST subset, save, eval, inspect; and bad
// arguments or files exit non-zero with a message that names the problem.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "backends/opencl/devices.h"
#include "core/model_file.h"
#include "tests/process_util.h"
#include "tests/test_util.h"

namespace {

using CliRun = tandem::testing::CommandRun;

CliRun run(const std::string& args) {
  return tandem::testing::runCommand(std::string(TANDEM_CLI) + " " + args);
}

const std::string kModels = std::string(TANDEM_SOURCE_DIR) + "/examples/models/";

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
  EXPECT_NE(r.out.find("a.onnx: starting data-parallel replicas from an ONNX model's weights"),
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
  for (const char* s :
       {"device", "units", "memory", "max alloc", "fp16", "platform", "vendor", "\ncpu ", " host "})
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
  for (const char* s : {"cpu (", "sgemm 1024:", "forward ms", "backward ms", "linear", "wrote"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
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
  for (const char* s : {"plan for cnn on", "local/cpu", "equal-layers", "equal-params",
                        "memory-proportional", "plan's speedup", "a training step", "predicted:",
                        "wrote"})
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
  for (const char* s : {"found no split of the 10 layers over the 2 devices that fits in memory"})
    EXPECT_NE(no_fit.out.find(s), std::string::npos) << s << "\n" << no_fit.out;
  EXPECT_EQ(no_fit.out.find("pid "), std::string::npos) << no_fit.out;
  // A plan's stage on two devices runs as two replicas (a row each in the stage table).
  const std::string replicated = dir + "cli_replicated_plan.yaml";
  std::ofstream(replicated) << "stages:\n"
                            << "  - {layers: [0, 3], devices: [local/cpu0], backend: cpu}\n"
                            << "  - {layers: [3, 10], devices: [local/cpu1, local/cpu2], "
                            << "backend: cpu, compute_s: 0.002, allreduce_s: 0.004}\n";
  const std::string job = dir + "cli_replicated_job.yaml";
  std::ofstream(job) << "model: " << kModels << "cnn.yaml\ntrain_limit: 256\ntest_limit: 64\n"
                     << "batch: 32\nmicrobatches: 4\npartition: " << replicated << "\n";
  const CliRun rep = run("run " + job);
  ASSERT_EQ(rep.code, 0) << rep.out;
  EXPECT_NE(rep.out.find("stage 1 replica 1: layers [3, 10)"), std::string::npos) << rep.out;
  // One replica computes a whole microbatch: (0.002 - 0.004 / 4) x 2 = 2 ms predicted.
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
// (1, 2, 4, 8 for a batch of 8), each profiled by the daemons at its microbatch size, with
// each schedule, and the run trains with the fastest, saying what it priced and chose;
// every device the plan leaves out is named with why.
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
  for (const char* s : {"1 1f1b: ", "1 gpipe: ", "2 1f1b: ", "4 gpipe: ", "8 1f1b: ",
                        "(predicted step per candidate", "step: measured", "test accuracy"})
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

// `partition: auto` plans over `--cluster`'s cluster when the job names none (as
// docs/runtime.md says: the cluster is --cluster's, else the job's `cluster:`), and a run
// with neither says what is missing, naming the job's line.
TEST(CliTest, AutoPlansOverTheClusterGivenOnTheCommandLine) {
  const std::string dir = tandem::testing::freshDir("cli-auto-cluster");
  std::ofstream(dir + "/cluster.yaml") << "nodes:\n"
                                          "  - {name: a, devices: [{name: cpu, backend: cpu}]}\n";
  std::ofstream(dir + "/job.yaml") << "model: " << kModels
                                   << "mlp.yaml\ntrain_limit: 128\ntest_limit: 32\n"
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

// Prediction vs reality: a 3-stage auto plan run by `tandem run` reports, for each stage,
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
    const size_t n = fields.size();
    const double wall = std::stod(fields[n - 4]), cpu = std::stod(fields[n - 3]),
                 all_cpu = std::stod(fields[n - 2]), predicted = std::stod(fields[n - 1]);
    std::printf("stage %s %s %s: cpu/predicted %.2f, wall/predicted %.2f\n", stage.c_str(),
                from.c_str(), to.c_str(), cpu / predicted, wall / predicted);
    EXPECT_EQ(stage, std::to_string(stages)) << line;
    EXPECT_GT(cpu, 0) << line;
    EXPECT_GT(predicted, 0) << line;
    EXPECT_GE(wall, cpu * 0.5) << line;  // compute is part of the stage's wall time
    EXPECT_GE(all_cpu, cpu * 0.99) << line;  // the compute thread is one of the worker's
    ++stages;
  }
  EXPECT_EQ(stages, 3) << r.out;
  // The mean step beside the plan's prediction, and each worker's memory beside its model.
  for (const char* s : {"step: measured ", "measured / predicted ",
                        "memory MiB per worker: tensors at peak / predicted"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

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
    sent.push_back(std::stod(fields[9]));  // stage, layers (2 fields), device, 4 %, stash
  }
  return sent;
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
  EXPECT_NE(exact.out.find("microbatches of a 32-sample batch, fp32 over tcp"), std::string::npos)
      << exact.out;
  const CliRun coded =
      job("coded-job.yaml", "coded.yaml", "codec: {activations: auto, gradients: auto}\n");
  ASSERT_EQ(coded.code, 0) << coded.out;
  EXPECT_NE(coded.out.find("0->1 int8/fp32, 1->2 fp32/fp16 over tcp"), std::string::npos)
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
  EXPECT_NE(fixed.out.find("0->1 fp16/fp32, 1->2 fp16 over tcp"), std::string::npos) << fixed.out;
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
      "/docs/profile.schema.json'))); assert len(p['links']['measured']) == 4\" 2>&1";
  EXPECT_EQ(std::system(check.c_str()), 0) << check;

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
      {"train --model " + model_file,
       "is a tandem model file (written by a save), not a model spec"},
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
