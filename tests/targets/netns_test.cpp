// Real daemons on real (namespaced) hosts: scripts/netns-cluster makes three network
// namespaces joined by tc-shaped links (one at 100 Mbit/s), a tandemd in each, and a
// coordinator namespace. Root only: skipped, with the reason, otherwise. Each test
// removes its namespaces and checks that no process is left in them.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>

#include "core/model_file.h"
#include "tests/process_util.h"
#include "tests/targets/capture.h"
#include "tests/test_util.h"

namespace {

using namespace std::chrono_literals;

using Ran = tandem::testing::CommandRun;

Ran sh(const std::string& cmd) { return tandem::testing::runCommand(cmd); }

const std::string kSource = TANDEM_SOURCE_DIR;
const std::string kCli = TANDEM_CLI;

// A cluster of namespaces for one test, removed at the end.
class NetnsCluster {
 public:
  // `nodes` namespaces, `more` further arguments of scripts/netns-cluster up.
  explicit NetnsCluster(const std::string& prefix, int nodes = 3, const std::string& more = "")
      : prefix_(prefix), dir_(tandem::testing::freshDir("netns-" + prefix)) {
    up_ = sh(kSource + "/scripts/netns-cluster up " + std::to_string(nodes) + " --prefix " +
             prefix + " --dir " + dir_ + " " + more);
  }
  ~NetnsCluster() { sh(kSource + "/scripts/netns-cluster down --prefix " + prefix_); }
  const Ran& up() const { return up_; }
  std::string cluster() const { return dir_ + "/cluster.yaml"; }
  const std::string& dir() const { return dir_; }
  // `tandem ARGS` run in the coordinator's namespace.
  std::string tandem(const std::string& args) const {
    return "ip netns exec " + prefix_ + "-c " + kCli + " " + args;
  }
  // The pids in node I's namespace.
  std::string pids(int i) const {
    return sh("ip netns pids " + prefix_ + "-n" + std::to_string(i)).out;
  }
  // The tandemd of node I (-1 if none): the process of its namespace that listens.
  int daemon(int i) const {
    std::istringstream s(pids(i));
    int p = 0;
    while (s >> p) {
      std::ifstream cmd("/proc/" + std::to_string(p) + "/cmdline");
      std::string args((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
      if (args.find("--listen") != std::string::npos) return p;
    }
    return -1;
  }
  void cut(int i) const {
    sh(kSource + "/scripts/netns-cluster cut " + std::to_string(i) + " --prefix " + prefix_);
  }
  // Node i drops what it sends to the cluster; its link stays up (no reset, no refusal).
  void blackhole(int i) const {
    sh(kSource + "/scripts/netns-cluster blackhole " + std::to_string(i) + " --prefix " + prefix_);
  }

 private:
  std::string prefix_, dir_;
  Ran up_;
};

bool canMakeNamespaces(std::string& why) {
  if (geteuid() != 0) {
    why = "network namespaces need root";
    return false;
  }
  const Ran r = sh("ip netns add tandem-probe-" + std::to_string(getpid()) +
                   " && ip netns delete tandem-probe-" + std::to_string(getpid()));
  if (r.code != 0) why = "ip netns does not work here: " + r.out;
  return r.code == 0;
}

std::string job(const std::string& dir, const std::string& body) {
  const std::string path = dir + "/job.yaml";
  std::ofstream(path) << "model: " << kSource << "/examples/models/cnn.yaml\n"
                      << "batch: 32\nmicrobatches: 4\npartition: [[0, 3], [3, 6], [6, 10]]\n"
                      << "seed: 1\n"
                      << body;
  return path;
}

// `command` run by sh in the background, its output in `log`: its pid.
pid_t inBackground(const std::string& command, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", (command + " >" + log + " 2>&1").c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Waits up to `limit` for `text` in `log`.
bool waitFor(const std::string& log, const std::string& text, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (slurp(log).find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(50ms);
  }
  return true;
}

// Waits up to `limit` for `pid` to exit: its exit code, -1 if it did not or was killed.
int waitExit(pid_t pid, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) return -1;
    std::this_thread::sleep_for(10ms);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(NetnsTest, TheCnnJobAcrossThreeNamespacedDaemonsTrainsAsOnThisMachine) {
  std::string why;
  if (!canMakeNamespaces(why)) GTEST_SKIP() << why;
  NetnsCluster c("tnA");
  ASSERT_EQ(c.up().code, 0) << c.up().out;
  const std::string j =
      job(c.dir(), "epochs: 1\ntrain_limit: 1600\ntest_limit: 400\nsave: m.tdm\n");
  const Ran there = sh(c.tandem("run " + j + " --cluster " + c.cluster()));
  ASSERT_EQ(there.code, 0) << there.out;
  std::filesystem::rename(c.dir() + "/m.tdm", c.dir() + "/there.tdm");
  const Ran here = sh(kCli + " run " + j);
  ASSERT_EQ(here.code, 0) << here.out;
  const auto acc = [](const std::string& out) { return out.substr(out.rfind("test accuracy: ")); };
  EXPECT_EQ(acc(there.out).substr(0, 21), acc(here.out).substr(0, 21)) << there.out << here.out;
  const tandem::ModelFile a = tandem::readModelFile(c.dir() + "/there.tdm");
  const tandem::ModelFile b = tandem::readModelFile(c.dir() + "/m.tdm");
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) EXPECT_EQ(a.params[i].data, b.params[i].data);

  // partition: auto without a profile across the hosts: each namespace's daemon profiles
  // the model, the daemons measure every link over the shaped veths, and the plan runs.
  const std::string auto_job = c.dir() + "/auto.yaml";
  std::ofstream(auto_job) << "model: " << kSource << "/examples/models/cnn.yaml\n"
                          << "batch: 32\nmicrobatches: 4\npartition: auto\ncluster: " << c.cluster()
                          << "\nepochs: 1\ntrain_limit: 640\ntest_limit: 200\n";
  const Ran planned = sh(c.tandem("run " + auto_job + " --cluster " + c.cluster()));
  ASSERT_EQ(planned.code, 0) << planned.out;
  for (const char* s : {"3 device profiles measured by the nodes' daemons", "9 links measured",
                        "link n0 -> n2:", "partition: auto: ", "test accuracy: "})
    EXPECT_NE(planned.out.find(s), std::string::npos) << s << "\n" << planned.out;
}

// What crosses the wire of a cluster run: every frame through the hub's bridge, captured
// while the CNN job trains across the three namespaced daemons and saves. The capture
// sees the run (megabytes of it, and the plaintext of the handshakes' hellos, which name
// the build), yet no 32 bytes of the trained weights appear in it, and every connection
// that carried 64 KiB or more — activations and gradients between the stages, the
// trained slices to the coordinator — is as dense as random bytes (at least 7.9 bits a
// byte; measured 7.998-8.000, where the trained weights' own bytes, plaintext floats,
// have 7.33).
TEST(NetnsTest, ACapturedClusterRunCarriesNoPlaintextWeightsOrActivations) {
  std::string why;
  if (!canMakeNamespaces(why)) GTEST_SKIP() << why;
  NetnsCluster c("tnW");
  ASSERT_EQ(c.up().code, 0) << c.up().out;
  const std::string capture = c.dir() + "/wire.frames";
  tandem::testing::PacketCapture wire("tnW-hub", capture);
  const std::string j = job(c.dir(), "epochs: 1\ntrain_limit: 640\ntest_limit: 200\nsave: m.tdm\n");
  const Ran ran = sh(c.tandem("run " + j + " --cluster " + c.cluster()));
  ASSERT_TRUE(wire.stop()) << "the capture did not run (root, a packet socket in tnW-hub)";
  ASSERT_EQ(ran.code, 0) << ran.out;
  const std::map<std::string, std::string> streams = tandem::testing::tcpStreams(capture);
  size_t total = 0;
  bool hello = false;
  for (const auto& [flow, bytes] : streams) {
    total += bytes.size();
    hello = hello || bytes.find("tandem " TANDEM_VERSION_TEXT) != std::string::npos;
  }
  EXPECT_GT(total, size_t{1} << 20) << streams.size() << " connections";
  EXPECT_TRUE(hello) << "no hello in the capture: it did not see the run";
  constexpr double kDense = 7.9;
  int dense = 0;
  for (const auto& [flow, bytes] : streams) {
    if (bytes.size() < 65536) continue;
    const double bits = tandem::testing::entropyBits(bytes);
    std::printf("  %s: %zu bytes, %.4f bits a byte\n", flow.c_str(), bytes.size(), bits);
    EXPECT_GE(bits, kDense) << flow << ": " << bytes.size() << " bytes";
    ++dense;
  }
  EXPECT_GE(dense, 4) << "the stages' links and the slices to the coordinator";
  const tandem::ModelFile trained = tandem::readModelFile(c.dir() + "/m.tdm");
  std::string weights;
  std::vector<std::string> windows;
  for (const tandem::HostTensor& t : trained.params) {
    const std::string bytes(reinterpret_cast<const char*>(t.data.data()), t.data.size() * 4);
    weights += bytes;
    for (size_t at = 0; at + 32 <= bytes.size() && windows.size() < 64; at += 4096)
      windows.push_back(bytes.substr(at, 32));
  }
  ASSERT_GE(windows.size(), 16u);
  const double plain = tandem::testing::entropyBits(weights);
  std::printf("  the trained weights in the clear: %zu bytes, %.4f bits a byte\n", weights.size(),
              plain);
  EXPECT_LT(plain, kDense);  // what plaintext would show
  for (const auto& [flow, bytes] : streams)
    for (const std::string& w : windows)
      EXPECT_EQ(bytes.find(w), std::string::npos) << flow << " carries trained weights";
  std::filesystem::remove(capture);  // tens of megabytes
}

// A GPT across the namespaced hosts: `partition: auto` plans its blocks over the three
// daemons from their own profiles (each sees the layers and their activation sizes) and
// trains it on text; then `tandem generate` serves prompts from its weights on stages of
// a split of its own across the three daemons — each stage's KV cache on its host, the
// tokens back across the shaped links — and from the training job itself, whose
// `partition: auto` plans generation per token (for so small a model one device); each
// answers every prompt with the text one process generates from the saved model.
TEST(NetnsTest, AGptPlannedAcrossNamespacedDaemonsTrainsThenGeneratesAsOneProcess) {
  std::string why;
  if (!canMakeNamespaces(why)) GTEST_SKIP() << why;
  NetnsCluster c("tnG");
  ASSERT_EQ(c.up().code, 0) << c.up().out;
  {
    std::ofstream text(c.dir() + "/corpus.txt");
    for (int i = 0; i < 300; ++i) text << "line " << i % 9 << ": the cat sat on the mat.\n";
  }
  std::ofstream(c.dir() + "/gpt.yaml")
      << "name: netns-gpt\ninput: [24]\nlayers:\n  - embedding: {vocab: 256, dim: 32}\n"
      << "  - positional: {context: 24}\n  - transformer: {heads: 4}\n"
      << "  - transformer: {heads: 4}\n  - transformer: {heads: 4}\n  - layernorm\n"
      << "  - linear: {out: 256}\n";
  const std::string j = c.dir() + "/gpt-job.yaml";
  std::ofstream(j) << "model: gpt.yaml\ndata: text:" << c.dir() << "/corpus.txt\n"
                   << "batch: 16\nmicrobatches: 4\nepochs: 1\ntrain_limit: 320\n"
                   << "optimizer: {kind: adamw, lr: 0.01}\npartition: auto\ncluster: "
                   << c.cluster() << "\nsave: gpt.tdm\n";
  const Ran trained = sh(c.tandem("run " + j + " --cluster " + c.cluster()));
  ASSERT_EQ(trained.code, 0) << trained.out;
  for (const char* s :
       {"3 device profiles measured by the nodes' daemons", "partition: auto: ", "test perplexity"})
    EXPECT_NE(trained.out.find(s), std::string::npos) << s << "\n" << trained.out;

  const std::string prompts = "printf 'line 3: the\\nline 7\\n' | ";
  const Ran here = sh(prompts + kCli + " generate " + c.dir() + "/gpt.tdm --serve --tokens 10");
  ASSERT_EQ(here.code, 0) << here.out;
  const std::string split = c.dir() + "/gpt-split.yaml";
  std::ofstream(split)
      << "model: gpt.yaml\nweights: gpt.tdm\npartition: [[0, 3], [3, 4], [4, 7]]\n";
  const Ran across =
      sh(prompts + c.tandem("generate " + split + " --serve --tokens 10 --cluster " + c.cluster()));
  ASSERT_EQ(across.code, 0) << across.out;
  EXPECT_NE(across.out.find("served 2 prompts across 3 stages"), std::string::npos) << across.out;
  const Ran planned =
      sh(prompts + c.tandem("generate " + j + " --serve --tokens 10 --cluster " + c.cluster()));
  ASSERT_EQ(planned.code, 0) << planned.out;
  EXPECT_NE(planned.out.find("partition: auto: generation over "), std::string::npos)
      << planned.out;
  for (const Ran* there : {&across, &planned})
    for (const std::string p : {"line 3: the", "line 7"}) {
      const std::string text = tandem::testing::servedText(here.out, p);
      ASSERT_FALSE(text.empty()) << p << "\n" << here.out;
      EXPECT_NE(there->out.find(text), std::string::npos) << text << "\n" << there->out;
    }
}

// A node lost mid-run — its daemon killed, its link cut, or blackholed (it drops what it
// sends while its link stays up) — ends the run naming it, and no worker is left in any
// namespace.
TEST(NetnsTest, ALostNodeEndsTheRunNamedWithNoWorkerLeft) {
  std::string why;
  if (!canMakeNamespaces(why)) GTEST_SKIP() << why;
  for (const std::string kind : {"kill", "cut", "blackhole"}) {
    NetnsCluster c(kind == "kill" ? "tnK" : kind == "cut" ? "tnC" : "tnB");
    ASSERT_EQ(c.up().code, 0) << c.up().out;
    const std::string j = job(c.dir(), "epochs: 100\ntimeout_s: 20\n");
    const std::string log = c.dir() + "/run.log";
    const pid_t pid = inBackground(c.tandem("run " + j + " --cluster " + c.cluster()), log);
    ASSERT_TRUE(waitFor(log, "epoch 1/100 step", 60s)) << slurp(log);
    if (kind == "kill")
      kill(c.daemon(1), SIGKILL);
    else if (kind == "cut")
      c.cut(1);
    else
      c.blackhole(1);
    EXPECT_EQ(waitExit(pid, 30s), 1) << kind << ": the run did not end with 1:\n" << slurp(log);
    const std::string out = slurp(log);
    EXPECT_TRUE(out.find("node 'n1'") != std::string::npos ||
                out.find("10.77.0.2") != std::string::npos)
        << kind << ": the run does not name the lost node:\n"
        << out;
    // Every node's namespace holds its daemon at most: the workers are gone (the cut
    // node's daemon stops its worker when its coordinator falls silent).
    for (int i = 0; i < 3; ++i) {
      std::string left;
      for (int k = 0; k < 300; ++k) {
        left = c.pids(i);
        const int daemon = c.daemon(i);
        std::istringstream s(left);
        int p = 0, others = 0;
        while (s >> p) others += p != daemon;
        if (others == 0) break;
        std::this_thread::sleep_for(20ms);
      }
      const int daemon = c.daemon(i);
      std::istringstream s(left);
      int p = 0;
      while (s >> p) EXPECT_EQ(p, daemon) << kind << ": a process is left in node " << i;
    }
  }
}

// A checkpointed run that loses a node across the namespaces — its daemon killed, or its
// link cut — recovers on the two nodes left (its layer ranges planned over them by the
// partitioner, from their daemons' profiles) and saves bitwise what a run on this machine
// saves.
TEST(NetnsTest, ACheckpointedRunRecoversFromALostNodeBitwise) {
  std::string why;
  if (!canMakeNamespaces(why)) GTEST_SKIP() << why;
  const std::string ref_dir = tandem::testing::freshDir("netns-ref");
  const Ran ref = sh(kCli + " run " +
                     job(ref_dir,
                         "epochs: 1\ntrain_limit: 1600\ntest_limit: 200\n"
                         "save: m.tdm\n"));
  ASSERT_EQ(ref.code, 0) << ref.out;
  const std::string want = slurp(ref_dir + "/m.tdm");
  for (const std::string kind : {"kill", "cut"}) {
    NetnsCluster c(kind == "kill" ? "tnRK" : "tnRC");
    ASSERT_EQ(c.up().code, 0) << c.up().out;
    const std::string j = job(c.dir(),
                              "epochs: 1\ntrain_limit: 1600\ntest_limit: 200\nsave: m.tdm\n"
                              "timeout_s: 20\ncheckpoint: {every_steps: 5}\n");
    const std::string log = c.dir() + "/run.log";
    const pid_t pid = inBackground(c.tandem("run " + j + " --cluster " + c.cluster()), log);
    ASSERT_TRUE(waitFor(log, "checkpoint at step 10:", 60s)) << slurp(log);
    if (kind == "kill")
      kill(c.daemon(1), SIGKILL);
    else
      c.cut(1);
    EXPECT_EQ(waitExit(pid, 120s), 0) << kind << ":\n" << slurp(log);
    const std::string output = slurp(log);
    for (const char* s : {"recovering (1 of 3 restarts): node 'n1' is left out",
                          "partition: the job's layer ranges re-planned by the partitioner "
                          "over the 2 nodes left (n0, n2): ",
                          "stages on n0, n2", "training again "})
      EXPECT_NE(output.find(s), std::string::npos) << kind << ": " << s << "\n" << output;
    EXPECT_TRUE(slurp(c.dir() + "/m.tdm") == want)
        << kind << ": the recovered run's model is not bitwise this machine's";
  }
}

// A mixed cluster: an x86 node and an ARM board — the aarch64 cross build of tandemd under
// qemu-aarch64 — behind a 100 Mbit/s link. With partition: auto each daemon profiles its
// own device; the emulated board is about 200x slower, so any split through it gains less
// than the selection margin and the plan leaves it out, saying why. A split through it
// (the board holding the classifier) trains as this machine does. Not bitwise: the
// board's OpenBLAS (NEON kernels, another summation order) rounds its products
// differently from the x86 one; the bound below is what we observe, checked.
TEST(NetnsTest, AMixedX86AndArmClusterPlansAroundTheSlowBoardAndTrainsAsHere) {
  std::string why;
  if (!canMakeNamespaces(why)) GTEST_SKIP() << why;
  const std::string arm = kSource + "/build/aarch64/targets/tandemd/tandemd";
  if (!std::filesystem::exists(arm))
    GTEST_SKIP() << "no aarch64 build of tandemd (scripts/setup --preset aarch64 --target "
                    "tandemd; scripts/test makes it)";
  NetnsCluster c("tnM", 2, "--emulate aarch64");
  ASSERT_EQ(c.up().code, 0) << c.up().out;
  const Ran nodes = sh(c.tandem("nodes --cluster " + c.cluster()));
  ASSERT_EQ(nodes.code, 0) << nodes.out;
  EXPECT_NE(nodes.out.find("aarch64"), std::string::npos) << nodes.out;
  EXPECT_NE(nodes.out.find("x86_64"), std::string::npos) << nodes.out;

  const std::string body = "model: " + kSource +
                           "/examples/models/cnn.yaml\nbatch: 32\nmicrobatches: 4\nseed: 1\n"
                           "epochs: 1\ntrain_limit: 640\ntest_limit: 200\nsave: m.tdm\n";
  const std::string auto_job = c.dir() + "/auto.yaml";
  std::ofstream(auto_job) << body << "partition: auto\ncluster: " << c.cluster() << "\n";
  const Ran planned = sh(c.tandem("run " + auto_job + " --cluster " + c.cluster()));
  ASSERT_EQ(planned.code, 0) << planned.out;
  EXPECT_NE(planned.out.find("1 stages by the exact search ([0, 10) n0/cpu)"), std::string::npos)
      << planned.out;
  EXPECT_NE(planned.out.find("n1/cpu: left out: "), std::string::npos) << planned.out;
  EXPECT_NE(planned.out.find("beside it: equal-layers [0, 5) n0/cpu, [5, 10) n1/cpu"),
            std::string::npos)
      << planned.out;
  const std::string split_job = c.dir() + "/split.yaml";
  std::ofstream(split_job) << body << "partition: [[0, 8], [8, 10]]\ncluster: " << c.cluster()
                           << "\n";
  const Ran there = sh(c.tandem("run " + split_job + " --cluster " + c.cluster()));
  ASSERT_EQ(there.code, 0) << there.out;
  EXPECT_NE(there.out.find("2 stages (2 workers) up"), std::string::npos) << there.out;
  std::filesystem::rename(c.dir() + "/m.tdm", c.dir() + "/there.tdm");

  const std::string here_job = c.dir() + "/here.yaml";
  std::ofstream(here_job) << body << "partition: equal\nstages: 1\n";
  const Ran here = sh(kCli + " run " + here_job);
  ASSERT_EQ(here.code, 0) << here.out;
  const auto accuracy = [](const std::string& out) {
    return std::stod(out.substr(out.rfind("test accuracy: ") + 15));
  };
  EXPECT_NEAR(accuracy(there.out), accuracy(here.out), 0.02) << there.out << here.out;
  const tandem::ModelFile a = tandem::readModelFile(c.dir() + "/there.tdm");
  const tandem::ModelFile b = tandem::readModelFile(c.dir() + "/m.tdm");
  ASSERT_EQ(a.params.size(), b.params.size());
  double worst = 0;
  for (size_t i = 0; i < a.params.size(); ++i) {
    ASSERT_EQ(a.params[i].data.size(), b.params[i].data.size());
    for (size_t k = 0; k < a.params[i].data.size(); ++k) {
      const double x = a.params[i].data[k], y = b.params[i].data[k];
      worst = std::max(worst, std::fabs(x - y) / std::max(1e-3, std::fabs(y)));
    }
  }
  std::printf("largest relative difference of a parameter, board vs here: %.3g\n", worst);
  EXPECT_LT(worst, 1e-4);
}

}  // namespace
