#include "core/host_limits.h"

#include <sched.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

namespace tandem {

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream s(text);
  while (std::getline(s, part, sep)) out.push_back(part);
  return out;
}

bool hasToken(const std::string& list, const std::string& token) {
  const auto parts = split(list, ',');
  return std::find(parts.begin(), parts.end(), token) != parts.end();
}

// A hierarchy's mount: where it is mounted and which of its folders is mounted there.
struct Mount {
  std::string root, point;
};

// The mount of the cgroup v2 hierarchy (`controller` empty) or of the v1 hierarchy with
// `controller`, from /proc/self/mountinfo.
std::optional<Mount> findMount(const std::string& mountinfo, const std::string& controller) {
  std::istringstream lines(mountinfo);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    std::vector<std::string> fields;
    for (std::string w; f >> w;) fields.push_back(w);
    const auto dash = std::find(fields.begin(), fields.end(), "-");
    // ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER-OPTIONS
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
    const std::string& type = dash[1];
    const std::string& options = dash[3];
    if (controller.empty() ? type == "cgroup2"
                           : (type == "cgroup" && hasToken(options, controller)))
      return Mount{fields[3], fields[4]};
  }
  return std::nullopt;
}

// The process's group in the v2 hierarchy ("0::/path") or the v1 hierarchy of `controller`.
std::optional<std::string> groupPath(const std::string& proc_cgroup,
                                     const std::string& controller) {
  std::istringstream lines(proc_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    if (controller.empty() ? (id == "0" && controllers.empty()) : hasToken(controllers, controller))
      return line.substr(b + 1);
  }
  return std::nullopt;
}

// The folders from the process's group up to the mount point, innermost first.
std::vector<std::string> groupFolders(const Mount& m, const std::string& path,
                                      const std::string& prefix) {
  std::string rel = path;
  if (m.root != "/" && rel.rfind(m.root, 0) == 0) rel = rel.substr(m.root.size());
  if (rel.find("..") != std::string::npos) rel = "/";  // outside what is mounted
  std::vector<std::string> out;
  std::string point = m.point;
  while (point.size() > 1 && point.back() == '/') point.pop_back();
  for (;;) {
    while (rel.size() > 1 && rel.back() == '/') rel.pop_back();
    out.push_back(prefix + point + (rel == "/" ? "" : rel));
    if (rel.empty() || rel == "/") break;
    const size_t cut = rel.rfind('/');
    rel = cut == 0 || cut == std::string::npos ? "/" : rel.substr(0, cut);
  }
  return out;
}

// Every group folder of the process in the v2 hierarchy (v2: true) and in v1's
// `controller` hierarchy, innermost first.
std::vector<std::pair<bool, std::string>> allFolders(const LimitSources& s,
                                                     const std::string& controller) {
  std::vector<std::pair<bool, std::string>> out;
  for (const bool v2 : {true, false}) {
    const std::string c = v2 ? "" : controller;
    const std::optional<Mount> m = findMount(s.mountinfo, c);
    const std::optional<std::string> path = groupPath(s.proc_cgroup, c);
    if (!m || !path) continue;
    for (std::string& dir : groupFolders(*m, *path, s.root)) out.emplace_back(v2, std::move(dir));
  }
  return out;
}

std::optional<double> readNumber(const std::string& path) {
  std::istringstream s(slurp(path));
  double v = 0;
  if (!(s >> v)) return std::nullopt;
  return v;
}

}  // namespace

double CpuLimit::cores() const {
  const double n = std::max(1, cpus);
  return quota_cores > 0 ? std::min(quota_cores, n) : n;
}

std::optional<std::pair<double, double>> parseCpuMax(const std::string& text) {
  std::istringstream s(text);
  std::string quota;
  double period = 0;
  if (!(s >> quota >> period) || quota == "max" || !(period > 0)) return std::nullopt;
  try {
    size_t used = 0;
    const double q = std::stod(quota, &used);
    if (used != quota.size() || !(q > 0)) return std::nullopt;
    return std::make_pair(q / period, period * 1e-6);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

CpuLimit cpuLimitFrom(const LimitSources& s) {
  CpuLimit limit;
  limit.cpus = std::max(1, s.cpus);
  auto take = [&](double cores, double period, const std::string& file) {
    if (!(cores > 0) || !(period > 0)) return;
    if (limit.quota_cores == 0 || cores < limit.quota_cores) {
      limit.quota_cores = cores;
      limit.period_s = period;
      limit.quota_from = file;
    }
  };
  for (const auto& [v2, dir] : allFolders(s, "cpu")) {
    if (v2) {
      if (auto q = parseCpuMax(slurp(dir + "/cpu.max")))
        take(q->first, q->second, dir + "/cpu.max");
      continue;
    }
    const std::optional<double> quota = readNumber(dir + "/cpu.cfs_quota_us");
    const std::optional<double> period = readNumber(dir + "/cpu.cfs_period_us");
    if (quota && period && *quota > 0)
      take(*quota / *period, *period * 1e-6, dir + "/cpu.cfs_quota_us");
  }
  return limit;
}

MemoryLimit memoryLimitFrom(const LimitSources& s) {
  MemoryLimit limit;
  // v1 says "no limit" with a number near 2^63 (rounded to pages), v2 with "max".
  constexpr double kNone = 0x1p62;
  for (const auto& [v2, dir] : allFolders(s, "memory")) {
    const std::string file = dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes");
    const std::optional<double> bytes = readNumber(file);
    if (!bytes || !(*bytes > 0) || *bytes >= kNone) continue;
    const auto cap = static_cast<int64_t>(*bytes);
    if (limit.limit_bytes == 0 || cap < limit.limit_bytes) {
      limit.limit_bytes = cap;
      limit.limit_from = file;
    }
    const std::optional<double> used =
        readNumber(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
    if (!used) continue;
    const int64_t room = std::max<int64_t>(0, cap - static_cast<int64_t>(*used));
    if (limit.free_bytes < 0 || room < limit.free_bytes) limit.free_bytes = room;
  }
  return limit;
}

namespace {

LimitSources thisProcess() {
  LimitSources s;
  s.proc_cgroup = slurp("/proc/self/cgroup");
  s.mountinfo = slurp("/proc/self/mountinfo");
  cpu_set_t set;
  CPU_ZERO(&set);
  s.cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return s;
}

}  // namespace

CpuLimit cpuLimit() { return cpuLimitFrom(thisProcess()); }

MemoryLimit memoryLimit() { return memoryLimitFrom(thisProcess()); }

double processCpuSeconds() {
  timespec t{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t) != 0) return 0;
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

int64_t peakRssBytes() {
  rusage u{};
  return getrusage(RUSAGE_SELF, &u) == 0 ? static_cast<int64_t>(u.ru_maxrss) * 1024 : 0;
}

double threadCpuSeconds() {
  timespec t{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return 0;
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

std::optional<double> hostBusyFromStat(const std::string& text, double ticks_per_second) {
  // cpu  user nice system idle iowait irq softirq steal guest guest_nice
  std::istringstream first(text.substr(0, text.find('\n')));
  std::string label;
  if (!(first >> label) || label != "cpu" || !(ticks_per_second > 0)) return std::nullopt;
  std::vector<double> v;
  for (double x; first >> x;) v.push_back(x);
  if (v.size() < 7) return std::nullopt;
  const double busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v.size() > 7 ? v[7] : 0);
  return busy / ticks_per_second;
}

double hostBusyCpuSeconds() {
  std::ifstream in("/proc/stat");
  std::string line;
  if (!std::getline(in, line)) return 0;
  return hostBusyFromStat(line, static_cast<double>(sysconf(_SC_CLK_TCK))).value_or(0);
}

std::string hostBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!std::getline(in, id)) return "";
  return id.size() <= 64 ? id : "";
}

int usableThreads(int requested, const CpuLimit& limit) {
  const int want = std::max(1, requested);
  if (limit.quota_cores <= 0) return want;
  return std::clamp(static_cast<int>(std::ceil(limit.quota_cores - 1e-9)), 1, want);
}

}  // namespace tandem
