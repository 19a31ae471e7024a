#include "runtime/node/node_profile.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "backends/registry.h"
#include "core/error.h"
#include "core/host_limits.h"
#include "core/model_spec.h"
#include "core/profile/measure.h"
#include "runtime/control/cluster_key.h"
#include "runtime/control/files.h"
#include "runtime/node/node_info.h"
#include "transport/local_group.h"
#include "transport/socket_link.h"

namespace tandem::runtime {

namespace {

// Everything a device's measurement depends on, hashed: the cache file's name.
// ("cache 6": message CPU measured over socket links; "cache 5": profiles that time a
// language model's decoding.)
// The CPU the node grants (its quota) is part of it: a node whose quota changed measures
// anew.
std::string cacheKey(const ProfileTask& task, int64_t batch, int64_t least, const ProfileDevice& d,
                     const CpuLimit& cpu) {
  char cores[32];
  std::snprintf(cores, sizeof cores, "%.3f", cpu.cores());
  const std::string what = "tandem profile cache 6\n" + buildName() + "\n" + d.backend + "\n" +
                           std::to_string(d.threads) + "\n" + std::to_string(d.load) + "\n" +
                           cores + "\n" + std::to_string(batch) + " " + std::to_string(least) +
                           " " + std::to_string(task.warmup) + " " + std::to_string(task.repeats) +
                           "\n" + task.model_spec;
  return contentHash(std::span(reinterpret_cast<const uint8_t*>(what.data()), what.size()));
}

// A cached device profile of `model`, or nullopt (absent, or unreadable: then removed).
std::optional<DeviceProfile> cached(const std::string& path, const Model& model) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    const Profile p = parseProfile(text, path);
    TANDEM_CHECK_MSG(p.devices.size() == 1, FormatError, path << " holds no single device");
    return deviceProfile(p, model, p.devices[0].device.name, path);
  } catch (const Error& e) {
    spdlog::warn("discarding the cached profile {}: {}", path, e.what());
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
    return std::nullopt;
  }
}

}  // namespace

int64_t trainingBytes(const Model& model, int64_t batch) {
  int64_t bytes = model.paramBytes() * 3;
  for (size_t l = 0; l < model.size(); ++l)
    bytes += (2 * model.layer(l).outputBytes() + model.layer(l).stashBytes()) * batch;
  return bytes;
}

int64_t profileBatch(int64_t batch, int64_t least, double least_pass_s, int passes, double budget_s,
                     const std::function<bool(int64_t)>& fits) {
  if (least <= 0 || least >= batch) return batch;
  const double per_sample = least_pass_s / static_cast<double>(least) * passes;
  int64_t b = batch;
  while (b > least && (per_sample * static_cast<double>(b) > budget_s || !fits(b)))
    b = std::max(least, b / 2);
  return b;
}

namespace {

// How far a cached profile's pass may be from a check's before it is measured again, and
// the shortest pass (seconds) that is checked.
constexpr double kStaleProfile = 1.3;
constexpr double kCheckedPass = 1e-3;

// The median of whole training passes (every layer forward, then backward) of `spec` on
// `d` over a short window (0.3 s, at least 3 passes), with its load beside it: what the
// device does now, to hold a cached profile's sum of medians against.
double quickPass(const ModelSpec& spec, const ProfileDevice& d, const BackendOptions& bo,
                 int64_t batch) {
  auto backend = makeBackend(d.backend, bo);
  Model model(spec);
  model.build(*backend, 1);
  LayerRunner runner(model, batch, 1);
  const BackgroundLoad load(
      spec, [&] { return makeBackend(d.backend, bo); }, d.load, batch);
  std::vector<double> passes;
  const auto t0 = std::chrono::steady_clock::now();
  while (passes.size() < 3 ||
         std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(300)) {
    passes.push_back(timeOnce([&] {
      for (size_t i = 0; i < runner.size(); ++i) runner.forward(i);
      for (size_t i = runner.size(); i-- > 0;) runner.backward(i);
    }));
  }
  return spreadOf(passes).median;
}

// The message sizes whose CPU is measured (the partitioner draws the line through them)
// and the round trips timed at each, after a few untimed.
constexpr int64_t kMessageSizes[] = {int64_t{4} << 10, int64_t{256} << 10};
constexpr int kMessageWarmup = 10, kMessageRounds = 100;

// A node's CPU per message (core/profile/profile.h, MessageCpu): two links over this
// node's loopback, encrypted as a cluster run's stages' are (with a throwaway key), a
// tensor sent one way and the same size answered, one at a time; the process's CPU over
// the timed round trips, per message; and the wall time of the send call on the sending
// thread, per message (what a stage's thread spends sending instead of computing).
std::vector<MessageCpu> measureMessageCpu() {
  transport::LinkOptions o;
  o.bind = "tcp://127.0.0.1:*";
  o.timeout = std::chrono::seconds(30);
  const transport::LinkKey key = dataPlaneLinkKey(generateClusterKey());
  transport::SocketLink near(o, key), far(o, key);
  near.connect(far.endpoint());
  far.connect(near.endpoint());
  auto backend = makeBackend("cpu");
  std::vector<MessageCpu> out;
  int64_t tag = 0;
  for (const int64_t bytes : kMessageSizes) {
    const Tensor t = backend->zeros(Shape{bytes / 4});
    const int64_t first = tag, rounds = kMessageWarmup + kMessageRounds;
    double cpu0 = 0, sending = 0;
    bothEnds(
        [&] {
          auto b = makeBackend("cpu");
          for (int64_t k = first; k < first + rounds; ++k)
            far.send({MessageKind::kGradient, k}, far.recv({MessageKind::kActivation, k}, *b));
        },
        [&] {
          for (; tag < first + rounds; ++tag) {
            if (tag == first + kMessageWarmup) cpu0 = processCpuSeconds();
            const auto s0 = std::chrono::steady_clock::now();
            near.send({MessageKind::kActivation, tag}, t);
            if (tag >= first + kMessageWarmup)
              sending +=
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
            near.recv({MessageKind::kGradient, tag}, *backend);
          }
        });
    out.push_back(
        {bytes, (processCpuSeconds() - cpu0) / (2.0 * kMessageRounds), sending / kMessageRounds});
  }
  return out;
}

}  // namespace

void bothEnds(const std::function<void()>& far, const std::function<void()>& near) {
  std::exception_ptr far_error, near_error;
  std::thread other([&] {
    try {
      far();
    } catch (...) {
      far_error = std::current_exception();
    }
  });
  try {
    near();
  } catch (...) {
    near_error = std::current_exception();
  }
  other.join();
  if (near_error) std::rethrow_exception(near_error);
  if (far_error) std::rethrow_exception(far_error);
}

namespace {

// One batch of a task: the batch asked and the least it may be measured at (0: as asked).
struct TaskBatch {
  int64_t batch = 0, least = 0;
};

// The task's batches, its own first: each of the others may shrink down to the task's
// least batch too, where that is below it.
std::vector<TaskBatch> taskBatches(const ProfileTask& task) {
  std::vector<TaskBatch> out{{task.batch, task.least_batch}};
  for (const int64_t b : task.more_batches)
    out.push_back({b, task.least_batch > 0 && task.least_batch < b ? task.least_batch : 0});
  return out;
}

// What a measurement at another batch takes from the task's first one: the sustained
// window's ratio to the layers' medians (a CPU quota's or throttling's, which do not
// depend on the batch) and the optimizers' update (which does not either).
void shareFirst(const DeviceProfile& first, DeviceProfile& other) {
  const double burst = other.sustained.burst_pass_s;  // its own medians
  other.sustained = first.sustained;
  other.sustained.burst_pass_s = burst;
  other.sustained.pass_s = first.sustained.pass_s > 0 ? burst * first.sustained.scale() : 0;
  const Sustained& su = first.sustained;
  other.sustained.cpu_pass_s = su.burst_pass_s > 0 ? su.cpu_pass_s * burst / su.burst_pass_s : 0;
  other.update = first.update;
  other.gemm = first.gemm;
}

// What one profile task measures against, read once for all its devices and batches.
struct TaskContext {
  const ProfileTask& task;
  const ModelSpec& spec;
  const Model& model;
  CpuLimit cpu;      // this node's CPUs and quota
  int64_t free = 0;  // this node's free memory (0: not known)
  std::string dir;   // the profile cache's folder ("": none)
};

// Device `d`'s profile of the task's model at one of its batches, for `p` (its batch):
// from the cache when it holds one that agrees with a few passes now (`hit` set), else
// measured and cached. `first`: the device's profile at the task's first batch, whose
// sustained window, update and GEMM rate a later batch takes.
DeviceProfile deviceAt(const TaskContext& ctx, const Profile& p, const ProfileDevice& d,
                       const TaskBatch& tb, const DeviceProfile* first, bool& hit) {
  const ProfileTask& task = ctx.task;
  const ModelSpec& spec = ctx.spec;
  const Model& model = ctx.model;
  const CpuLimit& cpu = ctx.cpu;
  const std::string path =
      ctx.dir.empty() ? "" : ctx.dir + "/" + cacheKey(task, tb.batch, tb.least, d, cpu) + ".json";
  // As a stage worker here would start it: no more threads than the quota grants.
  const BackendOptions bo{usableThreads(d.threads, cpu)};
  if (!path.empty())
    if (std::optional<DeviceProfile> cached_one = cached(path, model)) {
      // The machine's speed drifts (other tenants, clocks): a cached profile is checked
      // against a few whole passes now — the cached window's pass, or under a quota its
      // medians' sum (short passes mostly miss the stalls) — and measured again when it
      // is far off. Passes under a millisecond are timer and launch noise: kept.
      const Sustained& su = cached_one->sustained;
      const double then = su.quota_cores > 0 ? su.burst_pass_s : su.pass_s;
      const double now =
          then >= kCheckedPass ? quickPass(spec, d, bo, cached_one->batchIn(p)) : then;
      if (then <= 0 || (now <= kStaleProfile * then && now * kStaleProfile >= then)) {
        hit = true;
        return std::move(*cached_one);
      }
      spdlog::info(
          "the cached profile of '{}' on {} said {:.3f} ms a pass, a check now {:.3f}: "
          "measuring again",
          spec.name, d.backend, then * 1e3, now * 1e3);
    }
  const int64_t free = ctx.free;
  ProfileOptions o;
  o.batch = tb.batch;
  if (tb.least > 0 && tb.least < tb.batch)
    o.batch = profileBatch(tb.batch, tb.least, quickPass(spec, d, bo, tb.least),
                           task.warmup + task.repeats, kProfileBudgetSeconds, [&](int64_t b) {
                             return free <= 0 || trainingBytes(model, b) * (1 + d.load) <= free / 2;
                           });
  o.warmup = task.warmup;
  o.repeats = task.repeats;
  // The first batch's sustained window, update and GEMM rate serve the others.
  o.gemm_sizes = first ? std::vector<int64_t>{} : std::vector<int64_t>{256};
  o.sustain_s = first ? 0 : o.sustain_s;
  o.update = first == nullptr;
  auto backend = makeBackend(d.backend, bo);
  DeviceProfile measured;
  {
    const BackgroundLoad load(
        spec, [&] { return makeBackend(d.backend, bo); }, d.load, o.batch);
    measured = profileDevice(spec, *backend, o);
  }
  if (first) shareFirst(*first, measured);
  if (o.batch != p.batch) measured.batch = o.batch;
  spdlog::info(
      "profiled model '{}' on {} ({} threads, load {}) at batch {}: {} layers; sustained "
      "x{:.2f} of the layers' medians over {:.2f} s{}, {:.2f} cores",
      spec.name, d.backend, bo.threads, d.load, o.batch, measured.layers.size(),
      measured.sustained.scale(), measured.sustained.window_s, first ? " (the first batch's)" : "",
      cpu.cores());
  if (!path.empty()) {
    Profile one = p;
    one.load = d.load;
    one.devices = {measured};
    const std::string json = profileToJson(one);
    try {
      writeFileAtomically(path,
                          std::span(reinterpret_cast<const uint8_t*>(json.data()), json.size()));
    } catch (const Error& e) {
      spdlog::warn("cannot cache the profile: {}", e.what());
    }
  }
  return measured;
}

}  // namespace

ProfileResult profileHere(const ProfileTask& task, const std::string& cache_dir) {
  const ModelSpec spec = parseModelSpec(task.model_spec, "the model to profile");
  const Model model(spec);
  const CpuLimit cpu = cpuLimit();
  // What a task may start here: per device, no more threads than the node's CPUs, and no
  // more copies of the model training beside the measurement than that either (each a
  // thread with a backend of as many threads); every copy it builds (the measured one and
  // the load's) must fit in half the node's free memory.
  std::vector<ProfileDevice> devices = task.devices;
  int most_copies = 1;
  for (ProfileDevice& d : devices) {
    if (d.threads > cpu.cpus || d.load > cpu.cpus)
      spdlog::info(
          "profiling {} with {} threads and a load of {} (asked {} and {}): this node "
          "has {} CPUs",
          d.backend, std::min(d.threads, cpu.cpus), std::min(d.load, cpu.cpus), d.threads, d.load,
          cpu.cpus);
    d.threads = std::clamp(d.threads, 1, cpu.cpus);
    d.load = std::clamp(d.load, 0, cpu.cpus);
    most_copies = std::max(most_copies, 1 + d.load);
  }
  const std::vector<TaskBatch> batches = taskBatches(task);
  int64_t least = 0;  // the largest batch any of them must be measured at
  for (const TaskBatch& tb : batches) least = std::max(least, tb.least > 0 ? tb.least : tb.batch);
  const int64_t need = trainingBytes(model, least) * most_copies;
  const int64_t free = localNodeInfo("").free_memory_bytes;
  TANDEM_CHECK_MSG(free <= 0 || need <= free / 2, InvalidArgument,
                   "model '" << spec.name << "' at batch " << least << ", " << most_copies
                             << (most_copies == 1 ? " copy" : " copies (the load's too)")
                             << ", needs about " << (need >> 20)
                             << " MiB, over half of this node's free " << (free >> 20) << " MiB");
  std::string dir;
  if (!cache_dir.empty()) {
    dir = cache_dir + "/profiles";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      spdlog::warn("cannot make the profile cache {}: {}; measuring without it", dir, ec.message());
      dir.clear();
    }
  }
  std::vector<Profile> profiles(batches.size());
  for (size_t k = 0; k < batches.size(); ++k) {
    Profile& p = profiles[k];
    p.model = spec.name;
    p.input = spec.input;
    p.batch = batches[k].batch;
    p.warmup = task.warmup;
    p.repeats = task.repeats;
  }
  const TaskContext ctx{task, spec, model, cpu, free, dir};
  ProfileResult result;
  for (const ProfileDevice& d : devices)
    for (size_t k = 0; k < batches.size(); ++k) {
      Profile& p = profiles[k];
      p.load = std::max(p.load, d.load);
      const DeviceProfile* first = k == 0 ? nullptr : &profiles[0].devices.back();
      bool hit = false;
      p.devices.push_back(deviceAt(ctx, p, d, batches[k], first, hit));
      result.cached += hit;
    }
  const std::vector<MessageCpu> message_cpu = measureMessageCpu();
  spdlog::info(
      "a message costs this node {:.1f} us of CPU at {} KiB, {:.1f} us at {} KiB; the sending "
      "thread {:.1f} and {:.1f} us",
      message_cpu.front().cpu_s * 1e6, message_cpu.front().bytes >> 10,
      message_cpu.back().cpu_s * 1e6, message_cpu.back().bytes >> 10,
      message_cpu.front().send_s * 1e6, message_cpu.back().send_s * 1e6);
  const std::vector<GroupAllreduce> group = measureGroupAllreduce();
  spdlog::info(
      "an all-reduce of 2 ranks in one process takes {:.1f} us at {} KiB, {:.1f} us at {} KiB",
      group.front().seconds * 1e6, group.front().bytes >> 10, group.back().seconds * 1e6,
      group.back().bytes >> 10);
  for (Profile& p : profiles) {
    p.message_cpu = message_cpu;
    p.group_allreduce = group;
  }
  result.profile = profileToJson(profiles[0]);
  for (size_t k = 1; k < profiles.size(); ++k) result.more.push_back(profileToJson(profiles[k]));
  return result;
}

namespace {
constexpr int64_t kGroupSizes[] = {int64_t{4} << 10, int64_t{64} << 10, int64_t{1} << 20};
constexpr int kGroupWarmup = 5, kGroupRounds = 30;
}  // namespace

std::vector<GroupAllreduce> measureGroupAllreduce() {
  std::vector<GroupAllreduce> out;
  for (const int64_t bytes : kGroupSizes) {
    auto groups = transport::makeLocalGroup(2);
    std::vector<double> times;
    auto rank = [&](int r) {
      std::vector<float> data(static_cast<size_t>(bytes / 4), 1.0f);
      AllreduceOptions o;
      o.timeout = std::chrono::seconds(30);
      for (int k = 0; k < kGroupWarmup + kGroupRounds; ++k) {
        o.tag = static_cast<uint64_t>(2 * k);
        groups[static_cast<size_t>(r)]->barrier(o);
        const auto t0 = std::chrono::steady_clock::now();
        o.tag = static_cast<uint64_t>(2 * k + 1);
        groups[static_cast<size_t>(r)]->allreduce(data, o);
        if (r == 0 && k >= kGroupWarmup)
          times.push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    };
    bothEnds([&] { rank(1); }, [&] { rank(0); });
    std::nth_element(times.begin(), times.begin() + kGroupRounds / 2, times.end());
    out.push_back({2, bytes, times[kGroupRounds / 2]});
  }
  return out;
}

ProfileTask nodeProfileTask(const partitioner::ClusterNode& node, const std::string& model_spec,
                            int64_t batch,
                            const std::function<bool(const partitioner::ClusterDevice&)>& measure) {
  ProfileTask t;
  t.model_spec = model_spec;
  t.batch = batch;
  for (const partitioner::ClusterDevice& d : node.devices) {
    if (!measure(d)) continue;
    const ProfileDevice want{d.backend, d.threads, 0};
    if (std::find(t.devices.begin(), t.devices.end(), want) == t.devices.end())
      t.devices.push_back(want);
  }
  return t;
}

namespace {

// Sends `task` on `channel` and waits for its answer (node info between is skipped).
ProfileResult askProfile(Channel& channel, const ProfileTask& task, std::chrono::seconds timeout) {
  channel.send(task);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Message m = [&] {
    for (;;) {
      const auto left = deadline - std::chrono::steady_clock::now();
      if (left <= std::chrono::seconds(0))
        throw Timeout("no profile within " + std::to_string(timeout.count()) + " s");
      std::optional<Message> got =
          channel.recv(std::chrono::duration_cast<std::chrono::milliseconds>(left));
      if (got && !std::holds_alternative<NodeInfo>(*got)) return std::move(*got);
    }
  }();
  if (const auto* e = std::get_if<ErrorReply>(&m)) throw Error(e->message);
  auto* r = std::get_if<ProfileResult>(&m);
  if (!r)
    throw FormatError(std::string("sent '") + messageName(m) + "' where a profile result was due");
  return std::move(*r);
}

// A profile the node answered for `task` at `batch`, checked to hold its devices.
Profile parseAnswer(const std::string& json, const ProfileTask& task, int64_t batch) {
  Profile p = parseProfile(json, "its profile");
  TANDEM_CHECK_MSG(p.devices.size() == task.devices.size(), FormatError,
                   "its profile holds " << p.devices.size() << " devices, not the "
                                        << task.devices.size() << " asked for");
  TANDEM_CHECK_MSG(p.batch == batch, FormatError,
                   "its profile is at batch " << p.batch << ", not the " << batch << " asked for");
  return p;
}

}  // namespace

std::vector<Profile> profileOnNodes(const std::vector<Channel*>& channels,
                                    const std::vector<std::string>& names,
                                    const std::vector<ProfileTask>& tasks,
                                    std::chrono::seconds timeout, std::vector<int>* cached_out,
                                    std::vector<std::vector<Profile>>* more_out) {
  TANDEM_CHECK(channels.size() == tasks.size() && names.size() == tasks.size());
  std::vector<Profile> out;
  // One node after another: nodes that share a machine (a test cluster, namespaces)
  // would otherwise slow each other's measurements down.
  for (size_t i = 0; i < tasks.size(); ++i) {
    try {
      const ProfileTask& task = tasks[i];
      ProfileResult r = askProfile(*channels[i], task, timeout);
      out.push_back(parseAnswer(r.profile, task, task.batch));
      int cached = r.cached;
      std::vector<Profile> more;
      if (r.more.empty() && !task.more_batches.empty()) {
        // A daemon before protocol 3.1 measures the task's own batch only: the others
        // one task each.
        for (const int64_t b : task.more_batches) {
          ProfileTask one = task;
          one.batch = b;
          one.more_batches.clear();
          if (one.least_batch > b) one.least_batch = 0;
          const ProfileResult o = askProfile(*channels[i], one, timeout);
          more.push_back(parseAnswer(o.profile, one, b));
          cached += o.cached;
        }
      } else {
        TANDEM_CHECK_MSG(r.more.size() == task.more_batches.size(), FormatError,
                         "it answered " << r.more.size() << " more batches, not the "
                                        << task.more_batches.size() << " asked for");
        for (size_t k = 0; k < r.more.size(); ++k)
          more.push_back(parseAnswer(r.more[k], task, task.more_batches[k]));
      }
      if (cached_out) cached_out->push_back(cached);
      if (more_out) more_out->push_back(std::move(more));
    } catch (const Error& e) {
      throw Error("profiling on node '" + names[i] + "': " + e.what());
    }
  }
  return out;
}

}  // namespace tandem::runtime
