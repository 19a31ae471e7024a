// tandemd and the commands that talk to it, as processes: `tandem keygen --cluster`, a
// daemon on a free loopback port, `tandem nodes` against it (and against a node that is
// not there, and with the wrong key), and SIGTERM ending the daemon cleanly.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/endpoint.h"
#include "core/generate.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "runtime/control/cluster_key.h"
#include "runtime/control/handshake.h"
#include "runtime/control/messages.h"
#include "tests/process_util.h"
#include "tests/runtime/flood.h"
#include "tests/targets/tandemd_util.h"
#include "tests/test_util.h"

namespace {

using namespace std::chrono_literals;
using namespace tandem::testing::daemons;

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
  EXPECT_NE(
      r.out.find("protocol " + tandem::runtime::kProtocolVersion.str() + ", node name 'alpha'"),
      std::string::npos)
      << r.out;
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
  // Unix sockets link processes on one machine: not a cluster's nodes.
  const std::string ipc = writeJob(dir, "ipc", "epochs: 1\ntrain_limit: 64\ntransport: ipc\n");
  r = run(kCli + " run " + ipc + " --cluster " + dir + "/gone.yaml");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("ipc.yaml:9:12: 'transport: ipc' links processes on one machine, but "
                       "node 'gone' is at 127.0.0.1:1"),
            std::string::npos)
      << r.out;
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

// A job's launch gets through floods on both its daemons from a peer without the key:
// 300 idle connections on one, 100 that each sent a byte and stalled on the other (more
// than the daemon's handshake slots: they are evicted for the job's connections).
TEST(TandemdTest, AJobRunsThroughAFloodOfConnectionsWithoutTheKey) {
  const std::string dir = tandem::testing::freshDir("cluster-flood");
  TwoNodes nodes(dir);
  ASSERT_TRUE(nodes.made);
  const std::string job = writeJob(dir, "job", "epochs: 1\ntrain_limit: 640\ntest_limit: 200\n");
  tandem::testing::IdleFlood idle(tandem::parseEndpoint(nodes.a.address()), 300);
  tandem::testing::IdleFlood stalled(tandem::parseEndpoint(nodes.b.address()), 100,
                                     /*first_byte=*/true);
  const Ran r = run(kCli + " run " + job + " --cluster " + nodes.cluster);
  ASSERT_EQ(r.code, 0) << r.out << "\nnode b:\n" << nodes.b.log();
  EXPECT_NE(r.out.find("test accuracy: "), std::string::npos) << r.out;
  EXPECT_NE(nodes.b.log().find("to make room for one from"), std::string::npos) << nodes.b.log();
}

// `tandem nodes` against a daemon that a peer without the key floods with 200 idle
// connections, reopened as the daemon drops them: at least 19 of 20 tries get the node's
// information within 5 s each.
TEST(TandemdTest, NodesGetsThroughAFloodOfIdleConnections) {
  const std::string dir = tandem::testing::freshDir("nodes-flood");
  ASSERT_EQ(run(kCli + " keygen --cluster --out " + dir + "/c").code, 0);
  DaemonProcess d(dir, dir + "/c.key", "flooded");
  std::ofstream(dir + "/one.yaml") << "key: c.key\nnodes:\n  - {name: flooded, address: '"
                                   << d.address() << "', devices: [{}]}\n";
  int answered = 0;
  std::string last;
  {
    tandem::testing::IdleFlood flood(tandem::parseEndpoint(d.address()), 200);
    for (int i = 0; i < 20; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const Ran r = run(kCli + " nodes --cluster " + dir + "/one.yaml --timeout 5");
      if (r.code == 0 && std::chrono::steady_clock::now() - t0 < 5s &&
          r.out.find("node name 'flooded'") != std::string::npos)
        ++answered;
      else
        last = r.out;
      std::this_thread::sleep_for(250ms);  // over about 7 s: the flood's connections recycle
    }
  }
  std::printf("tandem nodes answered %d of 20 tries through a flood of 200 idle connections\n",
              answered);
  EXPECT_GE(answered, 19) << last;
}

// The daemon's resident memory (VmRSS, bytes), from /proc.
int64_t residentBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // kB
  return -1;
}

// A client with the key keeps the daemon's thread for its connection busy (a link task
// echoing a peer that never speaks), then pushes 64 frames of 3 MiB at it: the daemon
// reads as far as its queue's bytes allow and lets TCP push back on the rest, growing by
// less than 100 MiB (it grew by 1,069 MB for 64 frames of 16 MiB when its queue counted
// frames), and serves the next client meanwhile.
TEST(TandemdTest, FramesSentWhileTheDaemonIsBusyCostItNoMoreThanItsQueue) {
  const std::string dir = tandem::testing::freshDir("queued-frames");
  ASSERT_EQ(run(kCli + " keygen --cluster --out " + dir + "/c").code, 0);
  DaemonProcess d(dir, dir + "/c.key", "busy");
  const tandem::Endpoint at = tandem::parseEndpoint(d.address());
  const tandem::runtime::ClusterKey key = tandem::runtime::readClusterKey(dir + "/c.key");
  tandem::runtime::HandshakeOptions options;
  options.build = "test client";
  std::unique_ptr<tandem::runtime::Channel> c = tandem::runtime::connectChannel(at, key, options);
  ASSERT_TRUE(c->recv(5s).has_value());  // node info
  // A peer that accepts the connection (the kernel does) and never says a word.
  const int silent = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(bind(silent, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(listen(silent, 4), 0);
  ASSERT_EQ(getsockname(silent, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  using tandem::runtime::LinkTask;
  using tandem::runtime::LinkTaskKind;
  c->send(LinkTask{1, LinkTaskKind::kOpen, "127.0.0.1", "", 65536, 1, 0, 1});
  const std::optional<tandem::runtime::Message> opened = c->recv(10s);
  ASSERT_TRUE(opened && std::holds_alternative<tandem::runtime::LinkResult>(*opened));
  c->send(LinkTask{1, LinkTaskKind::kServe, "127.0.0.1",
                   "tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)), 65536, 1, 0, 1});
  std::this_thread::sleep_for(300ms);  // the task has begun
  const int64_t before = residentBytes(d.pid());
  ASSERT_GT(before, 0);
  constexpr int kFrames = 64;
  std::atomic<int> sent{0};
  std::thread pusher([&] {
    try {
      for (int i = 0; i < kFrames; ++i) {
        c->send(tandem::runtime::WeightsChunk{std::string(64, 'a'), i * (int64_t{3} << 20),
                                              kFrames * (int64_t{3} << 20),
                                              std::vector<uint8_t>(size_t{3} << 20, 7)},
                4s);
        ++sent;
      }
    } catch (const tandem::Error&) {  // the daemon's TCP pushed back until the send gave up
    }
  });
  int64_t most = before;
  for (int i = 0; i < 30; ++i) {
    std::this_thread::sleep_for(100ms);
    most = std::max(most, residentBytes(d.pid()));
  }
  // Meanwhile another client is served.
  const std::string nodes_yaml = dir + "/one.yaml";
  std::ofstream(nodes_yaml) << "key: c.key\nnodes:\n  - {name: busy, address: '" << d.address()
                            << "', devices: [{}]}\n";
  const Ran served = run(kCli + " nodes --cluster " + nodes_yaml);
  pusher.join();
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(100ms);
    most = std::max(most, residentBytes(d.pid()));
  }
  close(silent);
  std::printf("the daemon grew by %.1f MiB while %d of %d frames of 3 MiB got sent\n",
              static_cast<double>(most - before) / (1 << 20), sent.load(), kFrames);
  EXPECT_EQ(served.code, 0) << served.out;
  EXPECT_LT(sent.load(), kFrames) << "nothing pushed back: the frames were all taken in";
  EXPECT_LT(most - before, int64_t{100} << 20);
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
  // Each answer line, whatever the order: the same text as the one process's.
  auto sameText = [](const Ran& here, const Ran& there) {
    for (const std::string p : {"the cat", "q"}) {
      const std::string text = tandem::testing::servedText(here.out, p);
      ASSERT_FALSE(text.empty()) << p << "\n" << here.out;
      EXPECT_NE(there.out.find(text), std::string::npos) << text << "\n" << there.out;
    }
  };
  for (const std::string sampling :
       {"", " --temperature 0.9 --top-k 30 --seed 4", " --temperature 1.2 --top-p 0.8 --seed 6"}) {
    const std::string opts = " --serve --tokens 8" + sampling;
    const Ran here = run(prompts + kCli + " generate " + dir + "/gpt.tdm" + opts);
    ASSERT_EQ(here.code, 0) << here.out;
    const Ran there = run(prompts + kCli + " generate " + job + opts + " --in-flight 2 --cluster " +
                          nodes.cluster);
    ASSERT_EQ(there.code, 0) << there.out;
    EXPECT_NE(there.out.find("served 2 prompts across 2 stages: 16 tokens"), std::string::npos)
        << there.out;
    sameText(here, there);
    EXPECT_NE(there.out.find("\"error\":\"a prompt of 26 tokens and 8 new ones exceed the context "
                             "of 24"),
              std::string::npos)
        << there.out;
  }
  // The job's own split is priced per token beside the best single device (and warned
  // about when slower); `partition: auto` plans generation per token: whichever number of
  // stages it takes, the same text.
  const Ran priced =
      run(prompts + kCli + " generate " + job + " --serve --tokens 8 --cluster " + nodes.cluster);
  ASSERT_EQ(priced.code, 0) << priced.out;
  EXPECT_NE(priced.out.find("partition: the job's 2 stages predicted "), std::string::npos)
      << priced.out;
  std::ofstream(dir + "/auto.yaml") << "model: gpt.yaml\nweights: gpt.tdm\npartition: auto\n";
  const Ran here = run(prompts + kCli + " generate " + dir + "/gpt.tdm --serve --tokens 8");
  const Ran planned = run(prompts + kCli + " generate " + dir +
                          "/auto.yaml --serve --tokens 8 --in-flight 2 --cluster " + nodes.cluster);
  ASSERT_EQ(planned.code, 0) << planned.out;
  EXPECT_NE(planned.out.find("partition: auto: generation over "), std::string::npos)
      << planned.out;
  EXPECT_NE(planned.out.find("tokens/s with 2 sequences in flight (paced by "), std::string::npos)
      << planned.out;
  sameText(here, planned);
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

  // The model's end-of-text token (metadata eos_token_ids, as an import from a Hugging Face
  // folder keeps it), chosen as the first greedy token of "the cat" from its third on that
  // did not come before: one process and the job's stages both stop after it.
  size_t last = 0;
  {
    tandem::cpu::CpuBackend be;
    const tandem::ModelFile file = tandem::readModelFile(dir + "/gpt.tdm");
    const auto m = tandem::loadModel(file, be);
    const std::string cat = "the cat";
    const tandem::Generation g =
        tandem::generate(*m, std::vector<int32_t>(cat.begin(), cat.end()), 8, {});
    // (Before the eighth: a stop at the last token would look like no stop at all.)
    last = 2;
    while (last < 7 && std::find(g.tokens.begin(), g.tokens.begin() + static_cast<long>(last),
                                 g.tokens[last]) != g.tokens.begin() + static_cast<long>(last))
      ++last;
    if (last == 7) last = 0;
    tandem::saveModel(dir + "/gpt-eos.tdm", *m, nullptr,
                      {{"eos_token_ids", std::vector<int64_t>{g.tokens[last]}}});
  }
  std::ofstream(dir + "/eos.yaml")
      << "model: gpt.yaml\nweights: gpt-eos.tdm\npartition: [[0, 3], [3, 6]]\n";
  const std::string ended = "7 prompt tokens, " + std::to_string(last + 1) + " new";
  const Ran alone = run(kCli + " generate " + dir + "/gpt-eos.tdm --prompt 'the cat' --tokens 8");
  ASSERT_EQ(alone.code, 0) << alone.out;
  EXPECT_NE(alone.out.find(ended + ":"), std::string::npos) << ended << "\n" << alone.out;
  const Ran staged = run(kCli + " generate " + dir + "/eos.yaml --prompt 'the cat' --tokens 8" +
                         " --cluster " + nodes.cluster);
  ASSERT_EQ(staged.code, 0) << staged.out;
  EXPECT_NE(staged.out.find(ended + " across 2 stages"), std::string::npos) << staged.out;
}

// A Hugging Face Llama folder (tests/data/llama/llama-gqa: grouped-query attention, rotary
// embedding, SwiGLU) as a job's model, split over three daemons: each prompt gets the text
// one process generates from the same folder.
// `model` (a Hugging Face folder, a model file) split [0, 2) | [2, 3) | [3, 5) over three
// daemons generates, for two prompts, the text one process generates from it.
void expectThreeDaemonsGenerateAsOneProcess(const std::string& dir, const std::string& model) {
  TwoNodes nodes(dir);
  ASSERT_TRUE(nodes.made);
  DaemonProcess c(dir, nodes.key, "c");
  const std::string cluster = dir + "/three.yaml";
  std::ofstream(cluster) << "key: c.key\nnodes:\n"
                         << "  - {name: a, address: '" << nodes.a.address()
                         << "', devices: [{backend: cpu}]}\n"
                         << "  - {name: b, address: '" << nodes.b.address()
                         << "', devices: [{backend: cpu}]}\n"
                         << "  - {name: c, address: '" << c.address()
                         << "', devices: [{backend: cpu}]}\n";
  const std::string job = dir + "/split.yaml";
  std::ofstream(job) << "model: " << model << "\npartition: [[0, 2], [2, 3], [3, 5]]\n";
  const std::string prompts = "printf 'the cat\\nonce upon a time\\n' | ";
  const std::string opts = " --serve --tokens 12";
  const Ran here = run(prompts + kCli + " generate " + model + opts);
  ASSERT_EQ(here.code, 0) << here.out;
  const Ran there = run(prompts + kCli + " generate " + job + opts + " --cluster " + cluster);
  ASSERT_EQ(there.code, 0) << there.out;
  EXPECT_NE(there.out.find("served 2 prompts across 3 stages: 24 tokens"), std::string::npos)
      << there.out;
  for (const std::string p : {"the cat", "once upon a time"}) {
    const std::string text = tandem::testing::servedText(here.out, p);
    ASSERT_FALSE(text.empty()) << p << "\n" << here.out;
    EXPECT_NE(there.out.find(text), std::string::npos) << text << "\n" << there.out;
  }
  for (const DaemonProcess* d : {&nodes.a, &nodes.b, &c})
    EXPECT_NE(d->log().find("started worker"), std::string::npos) << d->log();
}

TEST(TandemdTest, AHuggingFaceLlamaOnThreeDaemonsGeneratesTheTextOneProcessDoes) {
  expectThreeDaemonsGenerateAsOneProcess(tandem::testing::freshDir("cluster-llama"),
                                         TANDEM_SOURCE_DIR "/tests/data/llama/llama-gqa");
}

// The same model with int8 weights (`tandem quantize`), given to the job as its model file.
TEST(TandemdTest, AnInt8ModelOnThreeDaemonsGeneratesTheTextOneProcessDoes) {
  const std::string dir = tandem::testing::freshDir("cluster-int8");
  const Ran imported =
      run(kCli + " import " TANDEM_SOURCE_DIR "/tests/data/llama/llama-gqa --out " + dir +
          "/llama.tdm");
  ASSERT_EQ(imported.code, 0) << imported.out;
  const Ran quantized = run(kCli + " quantize " + dir + "/llama.tdm " + dir + "/int8.tdm --int8");
  ASSERT_EQ(quantized.code, 0) << quantized.out;
  EXPECT_NE(quantized.out.find("int8 with a scale per output row; wrote"), std::string::npos)
      << quantized.out;
  expectThreeDaemonsGenerateAsOneProcess(dir, dir + "/int8.tdm");
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

// The regular files in `dir`.
std::vector<std::string> filesIn(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path().string());
  return out;
}

// Serving weights: the first run ships each node only its stage's part of them, the
// second finds them in the nodes' caches and ships nothing; a corrupted cache file is
// found, discarded and fetched again.
TEST(TandemdTest, EachNodeIsShippedItsStagesWeightsOnceAndThenFindsThemInItsCache) {
  const std::string dir = tandem::testing::freshDir("cluster-weights");
  TwoNodes nodes(dir);
  ASSERT_TRUE(nodes.made);
  Ran r =
      run(kCli + " run " +
          writeJob(dir, "train", "epochs: 1\ntrain_limit: 320\ntest_limit: 100\nsave: m.tdm\n"));
  ASSERT_EQ(r.code, 0) << r.out;
  const tandem::ModelFile whole = tandem::readModelFile(dir + "/m.tdm");
  const std::string serve = writeJob(dir, "serve", "test_limit: 200\nweights: m.tdm\n");
  const std::string infer = kCli + " infer " + serve + " --cluster " + nodes.cluster;
  r = run(infer);
  ASSERT_EQ(r.code, 0) << r.out;
  // Each node holds a part: the two hold every tensor of the file once, bitwise, and are
  // what was shipped.
  const std::vector<std::string> a_files = filesIn(dir + "/a-cache"),
                                 b_files = filesIn(dir + "/b-cache");
  ASSERT_EQ(a_files.size(), 1u);
  ASSERT_EQ(b_files.size(), 1u);
  std::map<std::string, std::vector<float>> held;
  for (const std::string& f : {a_files[0], b_files[0]})
    for (const tandem::HostTensor& t : tandem::readModelFile(f).params)
      EXPECT_TRUE(held.emplace(t.name, t.data).second) << t.name << " is on both nodes";
  ASSERT_EQ(held.size(), whole.params.size());
  for (const tandem::HostTensor& t : whole.params) EXPECT_EQ(held[t.name], t.data) << t.name;
  const auto a_size = std::filesystem::file_size(a_files[0]),
             b_size = std::filesystem::file_size(b_files[0]);
  EXPECT_LT(std::max(a_size, b_size), std::filesystem::file_size(dir + "/m.tdm"));
  EXPECT_NE(r.out.find("weights: " + std::to_string(a_size + b_size) +
                       " bytes shipped to 2 of 2 workers"),
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
  {
    std::fstream f(b_files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(b_size / 2));
    f.put('\x7f');
  }
  r = run(infer);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("weights: " + std::to_string(b_size) + " bytes shipped to 1 of 2 workers"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("failed verification and were fetched again"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.substr(r.out.rfind("test accuracy: "), 21), accuracy);
}

// Three workers of one node start from weights: stage 1's two replicas from the same
// part of them, which the first fetches into the node's cache while the other waits its
// turn and finds it there; stage 0 fetches its own part.
TEST(TandemdTest, TheWorkersOfOneNodeFetchEachPartOfTheWeightsOnce) {
  const std::string dir = tandem::testing::freshDir("one-fetch");
  ASSERT_EQ(
      run(kCli + " train --model " + TANDEM_SOURCE_DIR +
          "/examples/models/mlp.yaml --train-limit 64 --test-limit 16 --save " + dir + "/w.tdm")
          .code,
      0);
  std::ofstream(dir + "/train.yaml")
      << "model: " << TANDEM_SOURCE_DIR << "/examples/models/mlp.yaml\nbatch: 32\n"
      << "partition: [[0, 2], {layers: [2, 6], replicas: 2}]\nepochs: 1\ntrain_limit: 64\n"
      << "test_limit: 32\nweights: w.tdm\n";
  // A cache of its own for this run's local daemon.
  const Ran r = run("XDG_CACHE_HOME=" + dir + "/xdg " + kCli + " run " + dir + "/train.yaml");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<std::string> parts = filesIn(dir + "/xdg/tandem/weights");
  ASSERT_EQ(parts.size(), 2u) << r.out;
  const auto shipped = std::filesystem::file_size(parts[0]) + std::filesystem::file_size(parts[1]);
  EXPECT_NE(r.out.find("weights: " + std::to_string(shipped) + " bytes shipped to 2 of 3 workers"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("found cached by 1"), std::string::npos) << r.out;
}

}  // namespace
