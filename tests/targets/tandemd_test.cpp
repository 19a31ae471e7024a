// tandemd and the commands that talk to it, as processes: `tandem keygen --cluster`, a
// daemon on a free loopback port, `tandem nodes` against it (and against a node that is
// not there, and with the wrong key), and SIGTERM ending the daemon cleanly.
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
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "tests/process_util.h"
#include "tests/test_util.h"

namespace {

using namespace std::chrono_literals;

using Ran = tandem::testing::CommandRun;

Ran run(const std::string& cmd) { return tandem::testing::runCommand(cmd); }

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A tandemd child process on a free loopback port, its log in a file; stopped (SIGKILL
// if still running) when destroyed.
class DaemonProcess {
 public:
  DaemonProcess(const std::string& dir, const std::string& key, const std::string& name,
                const std::string& listen = "127.0.0.1:0")
      : log_(dir + "/" + name + ".log") {
    int out[2];
    EXPECT_EQ(pipe(out), 0);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      const int err = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(err, STDERR_FILENO);
      const std::string cache = dir + "/" + name + "-cache";
      execl(TANDEMD, TANDEMD, "--listen", listen.c_str(), "--key", key.c_str(), "--name",
            name.c_str(), "--cache-dir", cache.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    // Its first stdout line: "listening HOST:PORT".
    std::string line;
    char c;
    while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
    close(out[0]);
    const auto colon = line.rfind(':');
    if (line.rfind("listening ", 0) == 0 && colon != std::string::npos) address_ = line.substr(10);
    EXPECT_FALSE(address_.empty()) << "tandemd said '" << line << "'; its log:\n" << slurp(log_);
  }
  ~DaemonProcess() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  const std::string& address() const { return address_; }
  std::string log() const { return slurp(log_); }
  void kill9() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }
  // SIGTERM, then its exit code (-1 if it had to be killed after 10 s).
  int terminate() {
    kill(pid_, SIGTERM);
    for (int i = 0; i < 1000; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }

 private:
  std::string log_, address_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// A command running in the background, its output (stdout and stderr) in a file.
class Background {
 public:
  Background(const std::string& cmd, const std::string& log) : log_(log) {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~Background() {
    if (!reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  std::string output() const { return slurp(log_); }
  void signal(int s) const { kill(pid_, s); }
  // Whether its output holds `text` `times` times within `limit`.
  bool waitFor(const std::string& text, std::chrono::seconds limit, size_t times = 1) const {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      const std::string out = output();
      size_t n = 0;
      for (size_t at = out.find(text); at != std::string::npos && n < times;
           at = out.find(text, at + 1))
        ++n;
      if (n >= times) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
  // Its exit code, -1 if it did not end within `limit` or was killed.
  int wait(std::chrono::seconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// The pids `tandem run` printed for its stages ("stage 1: layers [3, 6) on cpu (1
// threads), pid 42").
std::vector<pid_t> stagePids(const std::string& out) {
  std::vector<pid_t> pids;
  for (size_t at = out.find(" threads), pid "); at != std::string::npos;
       at = out.find(" threads), pid ", at + 1))
    pids.push_back(static_cast<pid_t>(std::stol(out.substr(at + 15))));
  return pids;
}

const std::string kCli = TANDEM_CLI;

TEST(TandemdTest, KeygenMakesAClusterKeyOnlyItsOwnerReads) {
  const std::string dir = tandem::testing::freshDir("keygen");
  const Ran r = run(kCli + " keygen --cluster --out " + dir + "/c");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("cluster key, mode 0600"), std::string::npos) << r.out;
  struct stat st {};
  ASSERT_EQ(stat((dir + "/c.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string text = slurp(dir + "/c.key");
  EXPECT_EQ(text.size(), 65u);
  EXPECT_EQ(text.find_first_not_of("0123456789abcdef\n"), std::string::npos) << text;
}

TEST(TandemdTest, BadStartsExitWithTheirCode) {
  const std::string dir = tandem::testing::freshDir("tandemd");
  ASSERT_EQ(run(kCli + " keygen --cluster --out " + dir + "/c").code, 0);
  Ran r = run(std::string(TANDEMD) + " --listen 127.0.0.1:0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--key is required"), std::string::npos) << r.out;
  r = run(std::string(TANDEMD) + " --key " + dir + "/c.key --emulator " + dir + "/no-qemu");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--emulator: File does not exist: " + dir + "/no-qemu"), std::string::npos)
      << r.out;
  r = run(std::string(TANDEMD) + " --listen nowhere --key " + dir + "/c.key");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("'nowhere' is not an address HOST:PORT"), std::string::npos) << r.out;
  chmod((dir + "/c.key").c_str(), 0644);
  r = run(std::string(TANDEMD) + " --listen 127.0.0.1:0 --key " + dir + "/c.key");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("chmod 600"), std::string::npos) << r.out;
}

TEST(TandemdTest, NodesAsksEachDaemonAndNamesTheOnesItCannotReach) {
  const std::string dir = tandem::testing::freshDir("nodes");
  ASSERT_EQ(run(kCli + " keygen --cluster --out " + dir + "/c").code, 0);
  ASSERT_EQ(run(kCli + " keygen --cluster --out " + dir + "/other").code, 0);
  DaemonProcess alpha(dir, dir + "/c.key", "alpha");
  ASSERT_FALSE(alpha.address().empty());
  std::ofstream(dir + "/cluster.yaml") << "key: c.key\n"
                                       << "nodes:\n"
                                       << "  - name: alpha\n"
                                       << "    address: " << alpha.address() << "\n"
                                       << "    devices: [{backend: cpu}]\n"
                                       << "  - name: gone\n"
                                       << "    address: 127.0.0.1:1\n"
                                       << "    devices: [{backend: cpu}]\n";
  Ran r = run(kCli + " nodes --cluster " + dir + "/cluster.yaml --timeout 5");
  EXPECT_EQ(r.code, 1) << r.out;  // one node could not be asked
  EXPECT_NE(r.out.find("alpha        " + alpha.address()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tandem 0.1.0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("protocol 2.3.0, node name 'alpha'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("device cpu"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gone         127.0.0.1:1            unreachable: cannot reach the node "
                       "at 127.0.0.1:1"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("1 of the cluster's nodes could not be asked"), std::string::npos) << r.out;

  // The wrong key: refused, and the daemon logs it and serves on.
  r = run(kCli + " nodes --cluster " + dir + "/cluster.yaml --key " + dir + "/other.key");
  EXPECT_NE(r.out.find("alpha        " + alpha.address() + "        unreachable: the node at " +
                       alpha.address() + " refused us (authentication failed)"),
            std::string::npos)
      << r.out;
  // The daemon logs the refusal after sending it: the line may come a moment after our exit.
  for (int i = 0; i < 250 && alpha.log().find("authentication failed") == std::string::npos; ++i)
    std::this_thread::sleep_for(20ms);
  EXPECT_NE(alpha.log().find("authentication failed: the proof does not match"), std::string::npos)
      << alpha.log();
  std::ofstream(dir + "/one.yaml")
      << "key: c.key\nnodes:\n  - name: alpha\n    address: " << alpha.address()
      << "\n    devices: [{backend: cpu}]\n";
  r = run(kCli + " nodes --cluster " + dir + "/one.yaml");
  EXPECT_EQ(r.code, 0) << r.out;

  EXPECT_EQ(alpha.terminate(), 0) << alpha.log();
  EXPECT_NE(alpha.log().find("SIGTERM: stopping"), std::string::npos) << alpha.log();
  EXPECT_NE(alpha.log().find("stopped"), std::string::npos) << alpha.log();
}

// A cluster without addresses is this machine: each node is asked through a tandemd
// started for it, as a run would be; a cluster with an address and no key is refused.
TEST(TandemdTest, NodesAsksLocalDaemonsAndSaysWhatItLacks) {
  const std::string dir = tandem::testing::freshDir("nodes");
  std::ofstream(dir + "/local.yaml")
      << "nodes: [{name: a, devices: [{backend: cpu}]}, {name: b, devices: [{backend: cpu}]}]\n";
  Ran r = run(kCli + " nodes --cluster " + dir + "/local.yaml");
  EXPECT_EQ(r.code, 0) << r.out;
  for (const char* s : {"\na            127.0.0.1:", "\nb            127.0.0.1:", "(started here)",
                        "node name 'a'", "node name 'b'", "device cpu"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  // Some nodes with an address and some without: which machine is which is unclear.
  std::ofstream(dir + "/mixed.yaml")
      << "nodes: [{name: a, address: 'h:1', devices: [{}]}, {name: b, devices: [{}]}]\n";
  r = run(kCli + " nodes --cluster " + dir + "/mixed.yaml");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("node 'b' has no 'address' (HOST:PORT of its tandemd) while node 'a' has "
                       "one"),
            std::string::npos)
      << r.out;
  std::ofstream(dir + "/nokey.yaml") << "nodes: [{name: a, address: 'h:1', devices: [{}]}]\n";
  r = run(kCli + " nodes --cluster " + dir + "/nokey.yaml");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("no cluster key: give --key FILE, or `key: FILE`"), std::string::npos)
      << r.out;
}

// Two daemons (two nodes on loopback) and a cluster file naming them.
struct TwoNodes {
  explicit TwoNodes(const std::string& dir)
      : key(dir + "/c.key"),
        made(run(kCli + " keygen --cluster --out " + dir + "/c").code == 0),
        a(dir, key, "a"),
        b(dir, key, "b"),
        cluster(dir + "/two.yaml") {
    std::ofstream(cluster) << "key: c.key\nnodes:\n"
                           << "  - {name: a, address: '" << a.address()
                           << "', devices: [{backend: cpu}]}\n"
                           << "  - {name: b, address: '" << b.address()
                           << "', devices: [{backend: cpu}]}\n";
  }
  std::string key;
  bool made;
  DaemonProcess a, b;
  std::string cluster;
};

std::string writeJob(const std::string& dir, const std::string& name, const std::string& body) {
  const std::string path = dir + "/" + name + ".yaml";
  std::ofstream(path) << "model: " << TANDEM_SOURCE_DIR << "/examples/models/mlp.yaml\n"
                      << "batch: 32\nmicrobatches: 4\npartition: equal\nstages: 2\nseed: 3\n"
                      << body;
  return path;
}

// The pids of the processes whose command line holds `marker` (zombies left out).
std::vector<pid_t> processesWith(const std::string& marker) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = slurp("/proc/" + name + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    const auto pid = static_cast<pid_t>(std::stol(name));
    if (cmd.find(marker) != std::string::npos && !tandem::testing::processGone(pid))
      out.push_back(pid);
  }
  return out;
}

// SIGKILLs the one process whose command line holds `marker` (a node's tandemd); false
// when there is not exactly one.
bool killTheOneProcessWith(const std::string& marker) {
  const std::vector<pid_t> pids = processesWith(marker);
  return pids.size() == 1 && kill(pids[0], SIGKILL) == 0;
}

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

// Losing a node mid-run: the run leaves it out, places its stages on the nodes left,
// resumes from the newest checkpoint and saves bitwise the model of a run that lost
// nothing. Without restarts left it ends naming the node, as before.
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

// What `job` saves at `saved` when nothing goes wrong ("" if the run failed).
std::string uninterrupted(const std::string& job, const std::string& saved) {
  const Ran r = run(kCli + " run " + job);
  EXPECT_EQ(r.code, 0) << r.out;
  return r.code == 0 ? slurp(saved) : "";
}

TEST(TandemdTest, ARunThatLosesANodeRecoversOnTheOthersBitwise) {
  const std::string dir = tandem::testing::freshDir("recover");
  const std::string tag = std::to_string(getpid());
  std::ofstream(dir + "/c.yaml") << "nodes:\n  - {name: a-" << tag << ", devices: [{}]}\n"
                                 << "  - {name: b-" << tag << ", devices: [{}]}\n"
                                 << "  - {name: c-" << tag << ", devices: [{}]}\n";
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
          "3 stages on a-" + tag + ", c-" + tag, std::string("training again ")})
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

TEST(TandemdTest, ALostNodeThatComesBackRejoinsAtACheckpointAndAgainLaterBitwise) {
  const std::string dir = tandem::testing::freshDir("rejoin");
  ASSERT_EQ(run(kCli + " keygen --cluster --out " + dir + "/c").code, 0);
  const std::string key = dir + "/c.key";
  DaemonProcess a(dir, key, "a"), c(dir, key, "c");
  auto b = std::make_unique<DaemonProcess>(dir, key, "b");
  const std::string b_address = b->address();
  std::ofstream(dir + "/abc.yaml")
      << "key: c.key\nnodes:\n"
      << "  - {name: a, address: '" << a.address() << "', devices: [{}]}\n"
      << "  - {name: b, address: '" << b_address << "', devices: [{}]}\n"
      << "  - {name: c, address: '" << c.address() << "', devices: [{}]}\n";
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
       {std::string("3 stages on a, c"), std::string("stages on a, b, c"),
        std::string("after node 'b' rejoined"),
        std::string("membership: node 'b' left (lost 2 times); tried again at a checkpoint "
                    "after 1.0 s")})
    EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out;
  EXPECT_TRUE(slurp(dir + "/out/lossy.tdm") == want) << "run with a rejoin: not bitwise";
}

TEST(TandemdTest, AStreamThatLosesAStageAnswersEveryRequestOnceAsWithoutTheLoss) {
  const std::string dir = tandem::testing::freshDir("recover-infer");
  const std::string tag = std::to_string(getpid());
  std::ofstream(dir + "/c.yaml") << "nodes:\n  - {name: a-" << tag << ", devices: [{}]}\n"
                                 << "  - {name: b-" << tag << ", devices: [{}]}\n"
                                 << "  - {name: c-" << tag << ", devices: [{}]}\n";
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

TEST(TandemdTest, AClusterRunNamesTheNodeItCannotUse) {
  const std::string dir = tandem::testing::freshDir("cluster-bad");
  ASSERT_EQ(run(kCli + " keygen --cluster --out " + dir + "/c").code, 0);
  const std::string job = writeJob(dir, "job", "epochs: 1\ntrain_limit: 64\n");
  std::ofstream(dir + "/gone.yaml") << "key: c.key\nnodes:\n"
                                    << "  - {name: gone, address: '127.0.0.1:1', devices: [{}]}\n";
  const auto t0 = std::chrono::steady_clock::now();
  Ran r = run(kCli + " run " + job + " --cluster " + dir + "/gone.yaml");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
  EXPECT_NE(r.out.find("node 'gone' (127.0.0.1:1): cannot reach the node at 127.0.0.1:1"),
            std::string::npos)
      << r.out;
  std::ofstream(dir + "/half.yaml") << "key: c.key\nnodes:\n"
                                    << "  - {name: far, address: '127.0.0.1:1', devices: [{}]}\n"
                                    << "  - {name: near, devices: [{}]}\n";
  r = run(kCli + " run " + job + " --cluster " + dir + "/half.yaml");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("half.yaml:4:5: node 'near' has no 'address'"), std::string::npos) << r.out;
}

// A node reads a job's data only under its --data-root folders (default: the Debian
// datasets, the fortunes, its data folder): a coordinator that names a secret, a device or
// another folder is refused before the file is opened, and the node serves the next job.
TEST(TandemdTest, ADaemonReadsAJobsDataOnlyUnderItsRoots) {
  const std::string dir = tandem::testing::freshDir("cluster-data");
  TwoNodes nodes(dir);
  ASSERT_TRUE(nodes.made);
  std::ofstream(dir + "/gpt.yaml") << "name: t\ninput: [8]\nlayers:\n"
                                   << "  - embedding: {vocab: 256, dim: 8}\n"
                                   << "  - positional: {context: 8}\n"
                                   << "  - linear: {out: 256}\n";
  for (const std::string data : {"text:/etc/shadow", "text:/proc/self/environ", "text:/dev/zero"}) {
    const std::string job = dir + "/text.yaml";
    std::ofstream(job) << "model: gpt.yaml\ndata: " << data << "\nbatch: 8\nmicrobatches: 2\n"
                       << "partition: equal\nstages: 2\ntrain_limit: 16\n";
    const Ran r = run(kCli + " run " + job + " --cluster " + nodes.cluster);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("text data '" + data.substr(5) +
                         "' is not readable under this node's data rules (regular files of at "
                         "most 1073741824 bytes under /usr/share/datasets"),
              std::string::npos)
        << r.out;
  }
  const Ran etc = run(kCli + " run " + writeJob(dir, "etc", "train_limit: 64\ndata_dir: /etc\n") +
                      " --cluster " + nodes.cluster);
  EXPECT_EQ(etc.code, 1) << etc.out;
  EXPECT_NE(etc.out.find("Fashion-MNIST file '/etc/train-images-idx3-ubyte.gz' is not readable "
                         "under this node's data rules"),
            std::string::npos)
      << etc.out;
  const Ran fine = run(kCli + " run " + writeJob(dir, "fine", "train_limit: 64\ntest_limit: 32\n") +
                       " --cluster " + nodes.cluster);
  EXPECT_EQ(fine.code, 0) << fine.out;
  EXPECT_NE(nodes.a.log().find("jobs' data is read from /usr/share/datasets"), std::string::npos)
      << nodes.a.log();
}

TEST(TandemdTest, TheLinksBetweenDaemonsAreMeasuredThroughThem) {
  const std::string dir = tandem::testing::freshDir("cluster-links");
  TwoNodes nodes(dir);
  ASSERT_TRUE(nodes.made);
  const Ran r = run(kCli + " profile --links --cluster " + nodes.cluster +
                    " --link-bytes 65536 --link-repeats 2 --out " + dir + "/links.json");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"a -> b", "b -> a", "a -> a", "b -> b", "links over tcp"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  // A daemon that cannot bind where it is told answers with an error, named.
  std::ofstream(dir + "/bad.yaml")
      << "key: c.key\nnodes:\n  - {name: a, address: '" << nodes.a.address()
      << "', host: 192.0.2.1, devices: [{backend: cpu}]}\n";
  const Ran bad = run(kCli + " profile --links --cluster " + dir + "/bad.yaml");
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("node 'a': link task: "), std::string::npos) << bad.out;
  // Both daemons serve on.
  EXPECT_EQ(run(kCli + " nodes --cluster " + nodes.cluster).code, 0);
}

TEST(TandemdTest, AJobOnTwoDaemonsTrainsBitwiseAsOnThisMachine) {
  const std::string dir = tandem::testing::freshDir("cluster-run");
  TwoNodes nodes(dir);
  ASSERT_TRUE(nodes.made);
  const std::string job =
      writeJob(dir, "job", "epochs: 1\ntrain_limit: 640\ntest_limit: 200\nsave: out/m.tdm\n");
  Ran r = run(kCli + " run " + job + " --cluster " + nodes.cluster);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("test accuracy: "), std::string::npos) << r.out;
  EXPECT_NE(nodes.a.log().find("started worker 0"), std::string::npos) << nodes.a.log();
  EXPECT_NE(nodes.b.log().find("started worker 1"), std::string::npos) << nodes.b.log();
  std::filesystem::rename(dir + "/out/m.tdm", dir + "/cluster.tdm");
  r = run(kCli + " run " + job);  // this machine's own daemon
  ASSERT_EQ(r.code, 0) << r.out;
  const tandem::ModelFile there = tandem::readModelFile(dir + "/cluster.tdm");
  const tandem::ModelFile here = tandem::readModelFile(dir + "/out/m.tdm");
  ASSERT_EQ(there.params.size(), here.params.size());
  for (size_t i = 0; i < here.params.size(); ++i) {
    EXPECT_EQ(there.params[i].name, here.params[i].name);
    EXPECT_EQ(there.params[i].data, here.params[i].data) << here.params[i].name;  // bitwise
  }
}

// Generation from a job's stages on two daemons: each prompt of a stream (greedy and
// sampled) gets the text one process makes from the same model file; a prompt that does
// not fit is answered with an error and the stream goes on; a replicated stage is refused.
TEST(TandemdTest, AJobOnTwoDaemonsGeneratesTheTextOneProcessDoes) {
  const std::string dir = tandem::testing::freshDir("cluster-generate");
  TwoNodes nodes(dir);
  ASSERT_TRUE(nodes.made);
  std::ofstream(dir + "/gpt.yaml") << "name: gen\ninput: [24]\nlayers:\n"
                                   << "  - embedding: {vocab: 256, dim: 16}\n"
                                   << "  - positional: {context: 24}\n"
                                   << "  - transformer: {heads: 2}\n"
                                   << "  - transformer: {heads: 4, mlp: 32}\n"
                                   << "  - layernorm\n  - linear: {out: 256}\n";
  {
    tandem::cpu::CpuBackend be;
    tandem::Model m(tandem::loadModelSpec(dir + "/gpt.yaml"));
    m.build(be, 11);
    tandem::saveModel(dir + "/gpt.tdm", m, nullptr, {});
  }
  const std::string job = dir + "/gen.yaml";
  std::ofstream(job) << "model: gpt.yaml\nweights: gpt.tdm\npartition: [[0, 3], [3, 6]]\n";
  const std::string prompts = "printf 'the cat\\nonce upon a time, far away\\nq\\n' | ";
  for (const std::string sampling : {"", " --temperature 0.9 --top-k 30 --seed 4"}) {
    const std::string opts = " --serve --tokens 8" + sampling;
    const Ran here = run(prompts + kCli + " generate " + dir + "/gpt.tdm" + opts);
    ASSERT_EQ(here.code, 0) << here.out;
    const Ran there = run(prompts + kCli + " generate " + job + opts + " --in-flight 2 --cluster " +
                          nodes.cluster);
    ASSERT_EQ(there.code, 0) << there.out;
    EXPECT_NE(there.out.find("served 2 prompts across 2 stages: 16 tokens"), std::string::npos)
        << there.out;
    // Each answer line, whatever the order: the same text as the one process's.
    for (const std::string p : {"the cat", "q"}) {
      const std::string text = tandem::testing::servedText(here.out, p);
      ASSERT_FALSE(text.empty()) << p << "\n" << here.out;
      EXPECT_NE(there.out.find(text), std::string::npos) << text << "\n" << there.out;
    }
    EXPECT_NE(there.out.find("\"error\":\"a prompt of 26 tokens and 8 new ones exceed the context "
                             "of 24"),
              std::string::npos)
        << there.out;
  }
  EXPECT_NE(nodes.a.log().find("started worker 0"), std::string::npos) << nodes.a.log();
  EXPECT_NE(nodes.b.log().find("started worker 1"), std::string::npos) << nodes.b.log();
  std::ofstream(dir + "/replicated.yaml")
      << "model: gpt.yaml\nweights: gpt.tdm\npartition: [[0, 3], {layers: [3, 6], replicas: 2}]\n";
  const Ran replicated = run(kCli + " generate " + dir + "/replicated.yaml --prompt hi");
  EXPECT_EQ(replicated.code, 1) << replicated.out;
  EXPECT_NE(replicated.out.find("generation runs one worker per stage, but layers [3, 6) have 2 "
                                "replicas"),
            std::string::npos)
      << replicated.out;
  std::ofstream(dir + "/untrained.yaml") << "model: gpt.yaml\npartition: equal\nstages: 2\n";
  const Ran untrained = run(kCli + " generate " + dir + "/untrained.yaml --prompt hi");
  EXPECT_EQ(untrained.code, 1) << untrained.out;
  EXPECT_NE(untrained.out.find("names no trained weights to generate with"), std::string::npos)
      << untrained.out;
}

TEST(TandemdTest, ADaemonKilledMidRunEndsTheRunNamingTheNode) {
  const std::string dir = tandem::testing::freshDir("cluster-kill");
  TwoNodes nodes(dir);
  ASSERT_TRUE(nodes.made);
  const std::string job = writeJob(dir, "long", "epochs: 100\ntimeout_s: 10\n");
  Background run_job(kCli + " run " + job + " --cluster " + nodes.cluster, dir + "/run.log");
  ASSERT_TRUE(run_job.waitFor("epoch 1/100 step", 60s)) << run_job.output();
  const std::vector<pid_t> workers = stagePids(run_job.output());
  ASSERT_EQ(workers.size(), 2u) << run_job.output();
  nodes.b.kill9();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(run_job.wait(30s), 1) << run_job.output();
  // The bound only keeps a broken build from hanging; the detection time is measured by
  // scripts/failure-detection.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
  EXPECT_NE(run_job.output().find("was lost with node 'b' (" + nodes.b.address() + ")"),
            std::string::npos)
      << run_job.output();
  for (pid_t pid : workers) {
    for (int i = 0; i < 200 && !tandem::testing::processGone(pid); ++i)
      std::this_thread::sleep_for(20ms);
    EXPECT_TRUE(tandem::testing::processGone(pid)) << "worker " << pid << " is still running";
  }
  // The surviving daemon stopped its worker and serves the next client.
  std::ofstream(dir + "/a.yaml") << "key: c.key\nnodes:\n  - {name: a, address: '"
                                 << nodes.a.address() << "', devices: [{backend: cpu}]}\n";
  const Ran r = run(kCli + " nodes --cluster " + dir + "/a.yaml");
  EXPECT_EQ(r.code, 0) << r.out;
}

// Serving weights: the first run ships them to each node, the second finds them in the
// nodes' caches and ships nothing; a corrupted cache file is found, discarded and
// fetched again.
TEST(TandemdTest, WeightsAreShippedOnceAndThenFoundInTheNodesCaches) {
  const std::string dir = tandem::testing::freshDir("cluster-weights");
  TwoNodes nodes(dir);
  ASSERT_TRUE(nodes.made);
  Ran r =
      run(kCli + " run " +
          writeJob(dir, "train", "epochs: 1\ntrain_limit: 320\ntest_limit: 100\nsave: m.tdm\n"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto size = std::filesystem::file_size(dir + "/m.tdm");
  const std::string serve = writeJob(dir, "serve", "test_limit: 200\nweights: m.tdm\n");
  const std::string infer = kCli + " infer " + serve + " --cluster " + nodes.cluster;
  r = run(infer);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("weights: " + std::to_string(2 * size) + " bytes shipped to 2 of 2 workers"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("found cached by 0"), std::string::npos) << r.out;
  const std::string accuracy = r.out.substr(r.out.rfind("test accuracy: "), 21);
  r = run(infer);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("weights: 0 bytes shipped to 0 of 2 workers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("found cached by 2"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.substr(r.out.rfind("test accuracy: "), 21), accuracy);
  // The nodes say they hold it.
  const Ran asked = run(kCli + " nodes --cluster " + nodes.cluster);
  EXPECT_NE(asked.out.find("cached models: 1"), std::string::npos) << asked.out;
  // One byte of node b's copy changes: it is found out and fetched again.
  for (const auto& e : std::filesystem::directory_iterator(dir + "/b-cache")) {
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2));
    f.put('\x7f');
  }
  r = run(infer);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("weights: " + std::to_string(size) + " bytes shipped to 1 of 2 workers"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("failed verification and were fetched again"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.substr(r.out.rfind("test accuracy: "), 21), accuracy);
}

// Three workers of one node start from the same weights: the first fetches them into the
// node's cache, the others wait their turn and find them there.
TEST(TandemdTest, TheWorkersOfOneNodeFetchTheirWeightsOnce) {
  const std::string dir = tandem::testing::freshDir("one-fetch");
  ASSERT_EQ(
      run(kCli + " train --model " + TANDEM_SOURCE_DIR +
          "/examples/models/mlp.yaml --train-limit 64 --test-limit 16 --save " + dir + "/w.tdm")
          .code,
      0);
  const auto size = std::filesystem::file_size(dir + "/w.tdm");
  std::ofstream(dir + "/serve.yaml")
      << "model: " << TANDEM_SOURCE_DIR << "/examples/models/mlp.yaml\nbatch: 32\n"
      << "partition: equal\nstages: 3\ntest_limit: 100\n"
      << "weights: w.tdm\n";
  // A cache of its own for this run's local daemon.
  const Ran r = run("XDG_CACHE_HOME=" + dir + "/xdg " + kCli + " infer " + dir + "/serve.yaml");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("weights: " + std::to_string(size) + " bytes shipped to 1 of 3 workers"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("found cached by 2"), std::string::npos) << r.out;
}

}  // namespace
