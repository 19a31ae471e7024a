// What this process may use of its host, beyond what the machine has: the CPUs it may run
// on (its affinity mask), the CPU bandwidth its control groups grant (cgroup v2 `cpu.max`,
// v1 `cpu.cfs_quota_us` over `cpu.cfs_period_us`) and the memory they allow (v2
// `memory.max`, v1 `memory.limit_in_bytes`), the smallest along the path from its group to
// the hierarchy's root. A node capped at a quarter of a core runs a quarter of each period
// and waits out the rest: timed in runs shorter than a period it looks as fast as an
// uncapped one, so measurements that must hold over time (profiles, thread counts) ask
// here; a node in a 1 GiB group has 1 GiB, whatever /proc/meminfo says.
//
// Nothing here throws: a file that is missing or unreadable (no cgroup mounted — as under
// `ip netns exec`, which mounts a sysfs of its own — or another layout) means no limit
// known from it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tandem {

struct CpuLimit {
  int cpus = 1;            // CPUs in the affinity mask (at least 1)
  double quota_cores = 0;  // cores granted by the control groups; 0: no quota
  double period_s = 0;     // the quota's period (seconds); 0: no quota
  std::string quota_from;  // the file the smallest quota was read from (empty: none)

  // What the process can keep busy on average: the quota when it is below the CPUs.
  double cores() const;
};

struct MemoryLimit {
  int64_t limit_bytes = 0;  // the smallest limit; 0: none
  int64_t free_bytes = -1;  // the least room left under a limit (limit - usage); -1: none
  std::string limit_from;   // the file the smallest limit was read from (empty: none)
};

// Where to read: the contents of /proc/self/cgroup and /proc/self/mountinfo, and a prefix
// put before every cgroup file path (empty for the real files; a test folder in tests).
struct LimitSources {
  std::string proc_cgroup, mountinfo, root;
  int cpus = 1;  // the affinity mask's CPUs
};

// This process's limits, from /proc/self and sched_getaffinity.
CpuLimit cpuLimit();
MemoryLimit memoryLimit();
// The limits the sources describe.
CpuLimit cpuLimitFrom(const LimitSources& s);
MemoryLimit memoryLimitFrom(const LimitSources& s);

// Cores granted by a cgroup v2 `cpu.max` ("25000 100000"; "max 100000": none), with the
// period in seconds; nullopt when it grants no limit or cannot be read.
std::optional<std::pair<double, double>> parseCpuMax(const std::string& text);

// CPU seconds this process has used so far, every thread, user and system.
double processCpuSeconds();
// CPU seconds the calling thread has used so far.
double threadCpuSeconds();
// The most resident memory this process has held so far (getrusage), bytes; 0 unknown.
int64_t peakRssBytes();

// CPU seconds the whole host has spent busy since it booted, every CPU: user, system,
// interrupts and softirqs (the kernel's packet processing, which lands on whatever task
// runs or on no task at all), from the first line of /proc/stat; 0 when it cannot be read.
// Every container and network namespace on a host reads the same counters. Resolution:
// the kernel's USER_HZ ticks (10 ms).
double hostBusyCpuSeconds();
// The same from the text of /proc/stat and its ticks per second; nullopt when the text
// has no "cpu " line of numbers.
std::optional<double> hostBusyFromStat(const std::string& text, double ticks_per_second);
// What tells one running kernel from another (/proc/sys/kernel/random/boot_id): the same
// for every container and namespace on a host, so nodes that share a machine say so;
// empty when it cannot be read.
std::string hostBootId();

// Threads worth starting for `requested` under `limit`: at most the cores the quota
// grants, rounded up, and at least one. Threads beyond the quota only take turns at it.
int usableThreads(int requested, const CpuLimit& limit);

}  // namespace tandem
