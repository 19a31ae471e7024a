// A Google Benchmark reporter that, after the usual console output, prints each of our
// results next to its reference from the same run and their ratio. Rules map a prefix of
// our benchmark names to the reference's prefix; the rest of the name (the size
// arguments) must match. Ratios compare rates (bytes or items per second), so > 1 means
// we are faster than the reference.
#pragma once

#include <benchmark/benchmark.h>

#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace tandem::bench {

struct RatioRule {
  std::string ours, reference, label;
};

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  // Colours only on a terminal: a reporter given to RunSpecifiedBenchmarks ignores
  // --benchmark_color, and ConsoleReporter's default writes ANSI codes into files.
  explicit RatioReporter(std::vector<RatioRule> rules)
      : benchmark::ConsoleReporter(isatty(STDOUT_FILENO) ? OO_Defaults : OO_Tabular),
        rules_(std::move(rules)) {}

  bool ReportContext(const Context& context) override {
    const bool ok = ConsoleReporter::ReportContext(context);
    // Debian's libbenchmark is built without NDEBUG and says so above; it concerns the
    // harness's own checks around each timed loop, not the code measured.
    std::printf(
        "note: if Google Benchmark warned above that it was built as DEBUG, that is Debian's "
        "libbenchmark package (its own assertions on); tandem's code here is built -O3 "
        "-DNDEBUG, and every ratio below compares two benchmarks timed by the same harness "
        "in the same run.\n");
    return ok;
  }

  // With --benchmark_repetitions the ratio uses each benchmark's median (noisy shared
  // machines); otherwise its single run.
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      const bool median = r.run_type == Run::RT_Aggregate && r.aggregate_name == "median";
      if (r.run_type == Run::RT_Aggregate && !median) continue;
      for (const char* key : {"bytes_per_second", "items_per_second"}) {
        auto it = r.counters.find(key);
        if (it == r.counters.end()) continue;
        Rate& rate = rates_[r.run_name.str()];
        if (median || !rate.median) rate = {it->second, key[0] == 'b', median};
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }

  void printRatios() const {
    std::printf("\n%-34s %-12s %16s %16s %8s\n", "ours vs reference", "args", "ours", "reference",
                "ratio");
    for (const RatioRule& rule : rules_) {
      for (const auto& [name, rate] : rates_) {
        if (name.rfind(rule.ours, 0) != 0) continue;
        const std::string args = name.substr(rule.ours.size());
        const auto ref = rates_.find(rule.reference + args);
        if (ref == rates_.end()) continue;
        std::printf("%-34s %-12s %16s %16s %8.2f\n", rule.label.c_str(), args.c_str(),
                    format(rate).c_str(), format(ref->second).c_str(),
                    rate.value / ref->second.value);
      }
    }
  }

 private:
  struct Rate {
    double value = 0;
    bool bytes = false;
    bool median = false;
  };

  static std::string format(const Rate& r) {
    char text[32];
    if (r.bytes) {
      std::snprintf(text, sizeof text, "%.2f GB/s", r.value / 1e9);
    } else if (r.value >= 1e9) {  // GEMMs count FLOPs as items
      std::snprintf(text, sizeof text, "%.2f G/s", r.value / 1e9);
    } else if (r.value >= 1e3) {
      std::snprintf(text, sizeof text, "%.2f k/s", r.value / 1e3);
    } else {
      std::snprintf(text, sizeof text, "%.2f /s", r.value);
    }
    return text;
  }
  std::vector<RatioRule> rules_;
  std::map<std::string, Rate> rates_;
};

// Runs the registered benchmarks with a RatioReporter and prints the table.
inline int runWithRatios(int argc, char** argv, std::vector<RatioRule> rules) {
  benchmark::Initialize(&argc, argv);
  RatioReporter reporter(std::move(rules));
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.printRatios();
  benchmark::Shutdown();
  return 0;
}

}  // namespace tandem::bench
