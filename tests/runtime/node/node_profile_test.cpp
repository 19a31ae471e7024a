// A model profiled on a node by its daemon (runtime/node/node_profile.h): measured once
// and then cached, every batch of a task in one, a device too slow for the batch measured
// at a smaller one, a cached profile far from the device now measured again, and the
// coordinator's side of it (profileOnNodes) against daemons before protocol 3.1.
#include "runtime/node/node_profile.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "core/error.h"
#include "core/model_spec.h"
#include "runtime/control/listener.h"
#include "runtime/node/node_info.h"
#include "tests/runtime/daemon/daemon_fixture.h"
#include "tests/test_util.h"

namespace tandem::runtime {
namespace {

using namespace std::chrono_literals;
using testing::expectThrowWith;

// A profile task: measured on the node's devices, cached by model and device so that the
// same task again measures nothing; a corrupted cache file is discarded and measured
// again; a device the node lacks and a model it cannot hold get error replies, and the
// daemon serves on.
TEST_F(DaemonTest, AProfileTaskIsMeasuredOnceAndThenComesFromTheCache) {
  const std::string cache_dir = testing::freshDir("daemon-profile-cache");
  std::unique_ptr<Channel> c = restartWithCache(cache_dir);
  const std::string spec =
      "name: tiny\ninput: [4]\nlayers:\n  - linear: {out: 8}\n  - relu\n  - linear: {out: 3}\n";
  const ProfileTask task{spec, 4, 0, 2, {{"cpu", 1, 0}, {"cpu", 2, 0}}};
  auto ask = [&](const ProfileTask& t) {
    std::vector<int> cached;
    Channel* ch = c.get();
    const std::vector<Profile> p = profileOnNodes({ch}, {"alpha"}, {t}, 30s, &cached);
    return std::pair{p.at(0), cached.at(0)};
  };
  auto [first, cached_first] = ask(task);
  EXPECT_EQ(cached_first, 0);
  ASSERT_EQ(first.devices.size(), 2u);
  EXPECT_EQ(first.model, "tiny");
  EXPECT_EQ(first.batch, 4);
  ASSERT_EQ(first.devices[0].layers.size(), 3u);
  EXPECT_GT(first.devices[0].layers[0].forward.median, 0);
  // What a message costs the node, at a small size and a large one, measured each time.
  ASSERT_EQ(first.message_cpu.size(), 2u);
  EXPECT_LT(first.message_cpu[0].bytes, first.message_cpu[1].bytes);
  EXPECT_GT(first.message_cpu[0].cpu_s, 0);
  EXPECT_GT(first.message_cpu[1].cpu_s, 0);
  // The sending thread's time in the send call: something, and less than the round trip's
  // CPU of both ends it is part of.
  for (const MessageCpu& m : first.message_cpu) {
    EXPECT_GT(m.send_s, 0) << m.bytes;
    EXPECT_LT(m.send_s, 2 * m.cpu_s) << m.bytes;
  }
  auto [again, cached_again] = ask(task);
  EXPECT_EQ(again.message_cpu.size(), 2u);
  EXPECT_EQ(cached_again, 2);
  EXPECT_EQ(again.devices[1].layers[2].forward.median, first.devices[1].layers[2].forward.median);
  // Another batch is another measurement.
  ProfileTask other = task;
  other.batch = 2;
  EXPECT_EQ(ask(other).second, 0);
  // A cache file spoiled on disk is discarded, and measured again.
  int spoiled = 0;
  for (const auto& e : std::filesystem::directory_iterator(cache_dir + "/profiles")) {
    std::ofstream(e.path()) << "{\"schema\": ";
    ++spoiled;
  }
  EXPECT_EQ(spoiled, 4);  // two devices at two batches
  EXPECT_EQ(ask(task).second, 0);
  EXPECT_EQ(ask(task).second, 2);

  ProfileTask missing = task;
  missing.devices = {{"opencl:99", 1, 0}};
  expectThrowWith<Error>([&] { ask(missing); },
                         {"profiling on node 'alpha'", "no OpenCL device 99"});
  ProfileTask huge = task;
  huge.model_spec = "name: huge\ninput: [100000]\nlayers:\n  - linear: {out: 100000000}\n";
  expectThrowWith<Error>([&] { ask(huge); },
                         {"profiling on node 'alpha'", "over half of this node"});
  // Every copy a task builds counts: a model of about a third of the free memory fits
  // once, not with a copy training beside it (a load of 1).
  const int64_t free = localNodeInfo("").free_memory_bytes;
  ASSERT_GT(free, 0);
  auto wide = [](int64_t w) {
    return "name: wide\ninput: [" + std::to_string(w) +
           "]\nlayers:\n  - linear: {out: " + std::to_string(w) + "}\n";
  };
  int64_t lo = 16, hi = int64_t{1} << 22;  // the narrowest model of at least 0.3 x free
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (trainingBytes(Model(parseModelSpec(wide(mid))), 4) >= free * 3 / 10)
      hi = mid;
    else
      lo = mid + 1;
  }
  ProfileTask loaded = task;
  loaded.model_spec = wide(lo);
  loaded.devices = {{"cpu", 1, 1}};
  expectThrowWith<Error>(
      [&] { ask(loaded); },
      {"profiling on node 'alpha'", "2 copies (the load's too)", "over half of this node"});
  // Threads and load beyond this node's CPUs are measured with as many as it has.
  ProfileTask greedy = task;
  greedy.devices = {{"cpu", 1024, 256}};
  EXPECT_EQ(ask(greedy).first.devices.size(), 1u);
  EXPECT_EQ(ask(task).second, 2);  // still serving
}

// One task at several batches (a plan pricing several microbatch counts): a profile per
// batch, each with its own layers, sharing the first batch's sustained window (its ratio
// to the layers' medians), update and message CPU; each batch cached on its own, so a
// later task at one of them alone measures nothing.
TEST_F(DaemonTest, OneTaskMeasuresEveryBatchAndSharesWhatTheBatchDoesNotChange) {
  const std::string cache_dir = testing::freshDir("daemon-profile-batches");
  std::unique_ptr<Channel> c = restartWithCache(cache_dir);
  // Passes well under a millisecond, even emulated, so that a cached profile is used
  // without the check of a few passes now (which a noisy machine may fail).
  const std::string spec =
      "name: small\ninput: [16]\nlayers:\n  - linear: {out: 16}\n  - relu\n"
      "  - linear: {out: 4}\n";
  const ProfileTask task{spec, 16, 0, 2, {{"cpu", 1, 0}}, 0, {8, 2}};
  auto ask = [&](const ProfileTask& t, std::vector<std::vector<Profile>>* more) {
    std::vector<int> cached;
    Channel* ch = c.get();
    const std::vector<Profile> p = profileOnNodes({ch}, {"alpha"}, {t}, 30s, &cached, more);
    return std::pair{p.at(0), cached.at(0)};
  };
  std::vector<std::vector<Profile>> more;
  auto [first, hits] = ask(task, &more);
  EXPECT_EQ(hits, 0);
  ASSERT_EQ(more.size(), 1u);
  ASSERT_EQ(more[0].size(), 2u);
  const DeviceProfile& f = first.devices.at(0);
  EXPECT_EQ(first.batch, 16);
  EXPECT_GT(f.sustained.passes, 0);
  for (size_t k = 0; k < 2; ++k) {
    const Profile& p = more[0][k];
    const int64_t b = task.more_batches[k];
    EXPECT_EQ(p.batch, b);
    ASSERT_EQ(p.devices.size(), 1u);
    const DeviceProfile& d = p.devices[0];
    EXPECT_EQ(d.layers.at(0).activation_bytes, b * 16 * 4);
    EXPECT_GT(d.layers[0].forward.median, 0);
    EXPECT_EQ(d.sustained.passes, f.sustained.passes);
    EXPECT_EQ(d.sustained.window_s, f.sustained.window_s);
    EXPECT_NEAR(d.sustained.scale(), f.sustained.scale(), 1e-9 * f.sustained.scale());
    EXPECT_NE(d.sustained.burst_pass_s, f.sustained.burst_pass_s);  // its own medians
    EXPECT_EQ(d.update.at("sgd").median, f.update.at("sgd").median);
    EXPECT_EQ(p.message_cpu.size(), 2u);
    EXPECT_EQ(p.message_cpu[1].cpu_s, first.message_cpu[1].cpu_s);
  }
  std::vector<std::vector<Profile>> again;
  EXPECT_EQ(ask(task, &again).second, 3);
  EXPECT_EQ(again[0][1].devices[0].layers[2].forward.median,
            more[0][1].devices[0].layers[2].forward.median);
  ProfileTask alone = task;
  alone.batch = 8;
  alone.more_batches.clear();
  EXPECT_EQ(ask(alone, nullptr).second, 1);
}

// A peer accepted on `listener` that answers each profile task with `answer(task)` until
// its client closes the channel.
std::thread answerProfileTasks(Listener& listener,
                               std::function<ProfileResult(const ProfileTask&)> answer) {
  return std::thread([&listener, answer = std::move(answer)] {
    std::unique_ptr<Channel> c = listener.accept(10s);
    ASSERT_TRUE(c);
    try {
      for (std::optional<Message> m = c->recv(10s); m; m = c->recv(2s))
        c->send(answer(std::get<ProfileTask>(*m)));
    } catch (const IoError&) {  // the client closed the channel
    }
  });
}

// A daemon before protocol 3.1 ignores more_batches and answers the task's own batch:
// the coordinator asks it for each other batch in a task of its own.
TEST(ProfileOnNodesTest, ADaemonThatMeasuresOneBatchIsAskedForEachOther) {
  const ClusterKey key = generateClusterKey();
  Listener listener("127.0.0.1:0", key, HandshakeOptions{});
  const std::string spec = "name: tiny\ninput: [4]\nlayers:\n  - linear: {out: 3}\n";
  // What such a daemon answers at each batch, measured here (on this thread: under ASan a
  // thread that measured and then ends aborts in the sanitizer's own unmapping).
  std::map<int64_t, ProfileResult> at;
  for (const int64_t b : {8, 4, 1})
    at[b] = profileHere(ProfileTask{spec, b, 0, 1, {{"cpu", 1, 0}}, 0, {}}, "");
  std::vector<int64_t> asked;
  std::thread old_daemon = answerProfileTasks(listener, [&](const ProfileTask& t) {
    asked.push_back(t.batch);
    return at.at(t.batch);  // its own batch only
  });
  {
    std::unique_ptr<Channel> c = connectChannel(listener.endpoint(), key, HandshakeOptions{});
    std::vector<int> cached;
    std::vector<std::vector<Profile>> more;
    Channel* ch = c.get();
    const std::vector<Profile> first =
        profileOnNodes({ch}, {"old"}, {ProfileTask{spec, 8, 0, 1, {{"cpu", 1, 0}}, 0, {4, 1}}}, 30s,
                       &cached, &more);
    EXPECT_EQ(first.at(0).batch, 8);
    ASSERT_EQ(more.at(0).size(), 2u);
    EXPECT_EQ(more[0][0].batch, 4);
    EXPECT_EQ(more[0][1].batch, 1);
    EXPECT_EQ(more[0][1].devices.at(0).layers.at(0).activation_bytes, 1 * 3 * 4);
    c->close();
  }
  old_daemon.join();
  EXPECT_EQ(asked, (std::vector<int64_t>{8, 4, 1}));
}

// A daemon that answers another batch than asked, or fewer of them, is named.
TEST(ProfileOnNodesTest, AnAnswerAtOtherBatchesIsRefused) {
  const ClusterKey key = generateClusterKey();
  Listener listener("127.0.0.1:0", key, HandshakeOptions{});
  const std::string spec = "name: tiny\ninput: [4]\nlayers:\n  - linear: {out: 3}\n";
  // (Measured on this thread: see ADaemonThatMeasuresOneBatchIsAskedForEachOther.)
  const ProfileResult at_2 = profileHere(ProfileTask{spec, 2, 0, 1, {{"cpu", 1, 0}}, 0, {}}, "");
  std::thread liar = answerProfileTasks(listener, [&](const ProfileTask& t) {
    ProfileResult r = at_2;
    if (t.more_batches.size() == 2) r.more = {r.profile};  // one of two
    return r;
  });
  {
    std::unique_ptr<Channel> c = connectChannel(listener.endpoint(), key, HandshakeOptions{});
    Channel* ch = c.get();
    expectThrowWith<Error>(
        [&] {
          profileOnNodes({ch}, {"liar"}, {ProfileTask{spec, 8, 0, 1, {{"cpu", 1, 0}}, 0, {}}}, 30s);
        },
        {"profiling on node 'liar'", "its profile is at batch 2, not the 8 asked for"});
    expectThrowWith<Error>(
        [&] {
          profileOnNodes({ch}, {"liar"}, {ProfileTask{spec, 2, 0, 1, {{"cpu", 1, 0}}, 0, {4, 1}}},
                         30s);
        },
        {"profiling on node 'liar'", "it answered 1 more batches, not the 2 asked for"});
    c->close();
  }
  liar.join();
}

// The batch a device is measured at: the one asked where its passes fit the budget and
// memory, else halved, never below the least.
TEST(ProfileBatchTest, HalvesTheBatchUntilTheMeasurementFitsItsBudget) {
  const auto any = [](int64_t) { return true; };
  EXPECT_EQ(profileBatch(1024, 0, 10, 13, 1.5, any), 1024);  // no least: as asked
  EXPECT_EQ(profileBatch(64, 64, 10, 13, 1.5, any), 64);
  // 10 ms a pass at 64, 10 passes: 1.56 ms a sample, 960 samples in 1.5 s.
  EXPECT_EQ(profileBatch(1024, 64, 0.01, 10, 1.5, any), 512);
  EXPECT_EQ(profileBatch(256, 64, 0.01, 10, 1.5, any), 256);
  EXPECT_EQ(profileBatch(4096, 64, 1e-3, 10, 1.5, any), 4096);  // a launch-bound GPU
  EXPECT_EQ(profileBatch(4096, 64, 1e-3, 10, 1.5, [](int64_t b) { return b <= 128; }), 128);
  EXPECT_EQ(profileBatch(1024, 64, 10.0, 10, 1.5, any), 64);  // over budget even at the least
  EXPECT_EQ(profileBatch(100, 64, 10.0, 10, 1.5, any), 64);   // halving stops at the least
}

// A task that lets a device measure at a smaller batch (least_batch): a cheap model is
// measured at the batch asked; a costly one at a smaller batch, which its profile names
// and its layers' sizes follow.
TEST_F(DaemonTest, ADeviceTooSlowForTheBatchIsMeasuredAtASmallerOne) {
  std::unique_ptr<Channel> c = connectChannel(daemon_->endpoint(), key_, options());
  next(*c);  // node info
  auto ask = [&](const ProfileTask& t) {
    Channel* ch = c.get();
    return profileOnNodes({ch}, {"alpha"}, {t}, 60s).at(0);
  };
  const std::string tiny = "name: tiny\ninput: [4]\nlayers:\n  - linear: {out: 8}\n";
  const Profile cheap = ask(ProfileTask{tiny, 256, 0, 2, {{"cpu", 1, 0}}, 4, {}});
  EXPECT_EQ(cheap.batch, 256);
  ASSERT_EQ(cheap.devices.size(), 1u);
  EXPECT_EQ(cheap.devices[0].batchIn(cheap), 256);
  EXPECT_EQ(cheap.devices[0].layers[0].activation_bytes, 256 * 8 * 4);
  // About a GFLOP a pass at 64: far over the budget at 65536.
  const std::string wide =
      "name: wide\ninput: [1024]\nlayers:\n  - linear: {out: 1024}\n  - relu\n"
      "  - linear: {out: 1024}\n";
  const Profile costly = ask(ProfileTask{wide, 65536, 1, 3, {{"cpu", 1, 0}}, 64, {}});
  EXPECT_EQ(costly.batch, 65536);
  ASSERT_EQ(costly.devices.size(), 1u);
  const int64_t b = costly.devices[0].batch;
  EXPECT_GE(b, 64);
  EXPECT_LT(b, 65536);
  EXPECT_EQ(costly.devices[0].batchIn(costly), b);
  EXPECT_EQ(costly.devices[0].layers[0].activation_bytes, b * 1024 * 4);
}

// A cached profile far from what the device does now (a profile taken in a slow minute
// of a shared machine) is measured again; one that agrees is used.
TEST_F(DaemonTest, ACachedProfileFarFromTheDeviceNowIsMeasuredAgain) {
  const std::string cache_dir = testing::freshDir("daemon-stale-profile");
  std::unique_ptr<Channel> c = restartWithCache(cache_dir);
  // Passes of a few milliseconds: long enough to be checked.
  const std::string spec =
      "name: mid\ninput: [512]\nlayers:\n  - linear: {out: 512}\n  - relu\n"
      "  - linear: {out: 512}\n";
  const ProfileTask task{spec, 64, 1, 3, {{"cpu", 1, 0}}};
  auto cachedCount = [&] {
    std::vector<int> cached;
    Channel* ch = c.get();
    profileOnNodes({ch}, {"alpha"}, {task}, 30s, &cached);
    return cached.at(0);
  };
  EXPECT_EQ(cachedCount(), 0);
  // The cached profile says the device is ten times slower than it is.
  const auto file = std::filesystem::directory_iterator(cache_dir + "/profiles")->path();
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find("\"pass_s\": ");
  ASSERT_NE(at, std::string::npos) << text;
  const size_t value = at + 10, end = text.find_first_of(",\n}", value);
  const double pass = std::stod(text.substr(value, end - value));
  ASSERT_GT(pass * 10, 1e-3) << "the check needs passes of a millisecond at least";
  const std::string spoiled = text.replace(value, end - value, std::to_string(pass * 10));
  std::ofstream(file, std::ios::trunc) << spoiled;
  EXPECT_EQ(cachedCount(), 0);  // measured again, and the cache holds the new measurement
  std::ifstream again(file);
  EXPECT_NE(std::string((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>()),
            spoiled);
}

}  // namespace
}  // namespace tandem::runtime
