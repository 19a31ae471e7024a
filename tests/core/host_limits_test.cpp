// What a process may use of its host: cgroup v2 `cpu.max` and v1 CFS quotas, v2
// `memory.max` and v1 memory limits, found through /proc/self/cgroup and
// /proc/self/mountinfo (here: files written into a test folder), the smallest along the
// path to the root, and the threads worth starting under the CPU quota.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "core/host_limits.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

void write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

// A v2 hierarchy at /sys/fs/cgroup and a v1 cpu hierarchy at /sys/fs/cgroup/cpu,cpuacct,
// under `root`.
const char* kMounts =
    "24 30 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    "31 23 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";

TEST(CpuLimitTest, CpuMaxReadsAQuotaOrNone) {
  const auto q = parseCpuMax("25000 100000\n");
  ASSERT_TRUE(q.has_value());
  EXPECT_DOUBLE_EQ(q->first, 0.25);
  EXPECT_DOUBLE_EQ(q->second, 0.1);
  EXPECT_DOUBLE_EQ(parseCpuMax("150000 50000")->first, 3.0);
  EXPECT_FALSE(parseCpuMax("max 100000").has_value());
  EXPECT_FALSE(parseCpuMax("").has_value());
  EXPECT_FALSE(parseCpuMax("25000").has_value());
  EXPECT_FALSE(parseCpuMax("25000 0").has_value());
  EXPECT_FALSE(parseCpuMax("-5 100000").has_value());
  EXPECT_FALSE(parseCpuMax("25x00 100000").has_value());
}

// The host's busy time: user, nice, system, irq, softirq and steal ticks, not idle or
// iowait; per-CPU lines and a missing or short first line are not read as the total.
TEST(CpuLimitTest, TheHostsBusyTimeCountsEveryTickButIdleAndWaiting) {
  const auto busy =
      hostBusyFromStat("cpu  100 20 30 5000 70 4 6 2 0 0\ncpu0 50 10 15 2500 35 2 3 1 0 0\n", 100);
  ASSERT_TRUE(busy.has_value());
  EXPECT_DOUBLE_EQ(*busy, (100 + 20 + 30 + 4 + 6 + 2) / 100.0);
  EXPECT_DOUBLE_EQ(*hostBusyFromStat("cpu 1 2 3 4 5 6 7", 10), (1 + 2 + 3 + 6 + 7) / 10.0);
  EXPECT_FALSE(hostBusyFromStat("cpu0 50 10 15 2500 35 2 3 1 0 0\n", 100).has_value());
  EXPECT_FALSE(hostBusyFromStat("cpu  1 2 3\n", 100).has_value());
  EXPECT_FALSE(hostBusyFromStat("", 100).has_value());
  EXPECT_FALSE(hostBusyFromStat("cpu  1 2 3 4 5 6 7", 0).has_value());
  // This host's: counting up while this test spins (at most 5 s).
  const double before = hostBusyCpuSeconds();
  EXPECT_GT(before, 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  volatile double spin = 0;
  while (hostBusyCpuSeconds() <= before && std::chrono::steady_clock::now() < until)
    for (int i = 0; i < 100000; ++i) spin = spin + i;
  EXPECT_GT(hostBusyCpuSeconds(), before);
  EXPECT_FALSE(hostBootId().empty());
  EXPECT_EQ(hostBootId(), hostBootId());
}

TEST(CpuLimitTest, TheSmallestQuotaOnTheWayToTheRootCounts) {
  const std::string root = testing::freshDir("cpu-limit-v2");
  write(root + "/sys/fs/cgroup/cpu.max", "max 100000\n");
  write(root + "/sys/fs/cgroup/cluster/cpu.max", "50000 100000\n");
  write(root + "/sys/fs/cgroup/cluster/edge/cpu.max", "max 100000\n");
  write(root + "/sys/fs/cgroup/cluster/edge/board/cpu.max", "30000 200000\n");
  LimitSources s{"0::/cluster/edge/board\n", kMounts, root, 4};
  CpuLimit l = cpuLimitFrom(s);
  EXPECT_DOUBLE_EQ(l.quota_cores, 0.15);
  EXPECT_DOUBLE_EQ(l.period_s, 0.2);
  EXPECT_EQ(l.quota_from, root + "/sys/fs/cgroup/cluster/edge/board/cpu.max");
  EXPECT_EQ(l.cpus, 4);
  EXPECT_DOUBLE_EQ(l.cores(), 0.15);
  // One level up, the parent's half core.
  s.proc_cgroup = "0::/cluster/edge\n";
  l = cpuLimitFrom(s);
  EXPECT_DOUBLE_EQ(l.quota_cores, 0.5);
  EXPECT_EQ(l.quota_from, root + "/sys/fs/cgroup/cluster/cpu.max");
  // A quota above the CPUs leaves the CPUs as the limit.
  write(root + "/sys/fs/cgroup/cluster/cpu.max", "800000 100000\n");
  s.cpus = 2;
  l = cpuLimitFrom(s);
  EXPECT_DOUBLE_EQ(l.quota_cores, 8.0);
  EXPECT_DOUBLE_EQ(l.cores(), 2.0);
}

TEST(CpuLimitTest, VersionOneQuotasAreReadUnderTheirMount) {
  const std::string root = testing::freshDir("cpu-limit-v1");
  const std::string cpu = root + "/sys/fs/cgroup/cpu,cpuacct";
  write(cpu + "/cpu.cfs_quota_us", "-1\n");
  write(cpu + "/cpu.cfs_period_us", "100000\n");
  write(cpu + "/tdm-n3/cpu.cfs_quota_us", "25000\n");
  write(cpu + "/tdm-n3/cpu.cfs_period_us", "100000\n");
  const std::string groups = "12:memory:/x\n4:cpu,cpuacct:/tdm-n3\n0::/\n";
  const CpuLimit l = cpuLimitFrom({groups, kMounts, root, 2});
  EXPECT_DOUBLE_EQ(l.quota_cores, 0.25);
  EXPECT_DOUBLE_EQ(l.period_s, 0.1);
  EXPECT_EQ(l.quota_from, cpu + "/tdm-n3/cpu.cfs_quota_us");
  // A mount of a sub-folder (a container's view): paths are taken below its root.
  const std::string mounted =
      "31 23 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpuacct,cpu\n";
  write(cpu + "/inner/cpu.cfs_quota_us", "150000\n");
  write(cpu + "/inner/cpu.cfs_period_us", "100000\n");
  const CpuLimit c = cpuLimitFrom({"4:cpu,cpuacct:/docker/abc/inner\n", mounted, root, 2});
  EXPECT_DOUBLE_EQ(c.quota_cores, 1.5);
}

TEST(CpuLimitTest, NothingReadableMeansNoQuota) {
  const std::string root = testing::freshDir("cpu-limit-none");
  for (const LimitSources& s :
       {LimitSources{"", "", root, 3}, LimitSources{"0::/a\n", kMounts, root, 3},
        LimitSources{"garbage\n::\n", "garbage - \n", root, 3},
        LimitSources{"0::/../../etc\n", kMounts, root, 3}}) {
    const CpuLimit l = cpuLimitFrom(s);
    EXPECT_EQ(l.quota_cores, 0);
    EXPECT_EQ(l.period_s, 0);
    EXPECT_TRUE(l.quota_from.empty());
    EXPECT_DOUBLE_EQ(l.cores(), 3.0);
  }
  write(root + "/sys/fs/cgroup/cpu.max", "not a quota\n");
  EXPECT_EQ(cpuLimitFrom({"0::/\n", kMounts, root, 1}).quota_cores, 0);
}

TEST(CpuLimitTest, ThreadsStopAtTheQuotaRoundedUp) {
  CpuLimit none;
  none.cpus = 2;
  EXPECT_EQ(usableThreads(4, none), 4);  // no quota: as asked (the CPUs are the user's call)
  EXPECT_EQ(usableThreads(0, none), 1);
  CpuLimit quarter = none;
  quarter.quota_cores = 0.25;
  EXPECT_EQ(usableThreads(4, quarter), 1);
  CpuLimit one_and_half = none;
  one_and_half.quota_cores = 1.5;
  EXPECT_EQ(usableThreads(4, one_and_half), 2);
  EXPECT_EQ(usableThreads(1, one_and_half), 1);
  CpuLimit two = none;
  two.quota_cores = 2.0;
  EXPECT_EQ(usableThreads(8, two), 2);
}

TEST(MemoryLimitTest, TheSmallestLimitAndTheLeastRoomCount) {
  const std::string root = testing::freshDir("memory-limit");
  const std::string v1 = root + "/sys/fs/cgroup/memory";
  write(v1 + "/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "no limit"
  write(v1 + "/memory.usage_in_bytes", "5000000000\n");
  write(v1 + "/box/memory.limit_in_bytes", "4294967296\n");
  write(v1 + "/box/memory.usage_in_bytes", "4000000000\n");
  write(v1 + "/box/node/memory.limit_in_bytes", "1073741824\n");
  write(v1 + "/box/node/memory.usage_in_bytes", "73741824\n");
  const std::string groups = "4:memory:/box/node\n1:cpu:/\n0::/\n";
  const MemoryLimit m = memoryLimitFrom({groups, kMounts, root, 2});
  EXPECT_EQ(m.limit_bytes, int64_t{1} << 30);
  EXPECT_EQ(m.limit_from, v1 + "/box/node/memory.limit_in_bytes");
  // The node may hold 1 GiB but its parent has only 294967296 bytes left.
  EXPECT_EQ(m.free_bytes, 294967296);
  // v2: "max" is no limit.
  write(root + "/sys/fs/cgroup/memory.max", "max\n");
  write(root + "/sys/fs/cgroup/a/memory.max", "536870912\n");
  write(root + "/sys/fs/cgroup/a/memory.current", "36870912\n");
  const MemoryLimit v2 = memoryLimitFrom({"0::/a\n", kMounts, root, 2});
  EXPECT_EQ(v2.limit_bytes, 536870912);
  EXPECT_EQ(v2.free_bytes, 500000000);
  const MemoryLimit none = memoryLimitFrom({"0::/\n", kMounts, root, 2});
  EXPECT_EQ(none.limit_bytes, 0);
  EXPECT_EQ(none.free_bytes, -1);
  EXPECT_TRUE(none.limit_from.empty());
  // A limit without a usage file still limits; usage over the limit leaves no room.
  write(root + "/sys/fs/cgroup/b/memory.max", "100000000\n");
  EXPECT_EQ(memoryLimitFrom({"0::/b\n", kMounts, root, 2}).free_bytes, -1);
  write(root + "/sys/fs/cgroup/b/memory.current", "200000000\n");
  EXPECT_EQ(memoryLimitFrom({"0::/b\n", kMounts, root, 2}).free_bytes, 0);
}

TEST(CpuLimitTest, ThisProcessHasALimit) {
  const CpuLimit l = cpuLimit();
  EXPECT_GE(l.cpus, 1);
  EXPECT_GT(l.cores(), 0);
  EXPECT_LE(l.cores(), l.cpus);
  const MemoryLimit m = memoryLimit();
  EXPECT_GE(m.limit_bytes, 0);
  EXPECT_LE(m.free_bytes, m.limit_bytes);
}

}  // namespace
}  // namespace tandem
