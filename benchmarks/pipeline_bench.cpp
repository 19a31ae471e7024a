// Pipeline training throughput beside what its stages allow, measured in the same run:
//
//   efficiency = measured samples/s / ideal samples/s, where the ideal step time is
//     (m + p - 1) x the slowest stage's compute time per microbatch (the bubble formula
//     applied to the busy times the stages recorded in this very run);
//   speed-up   = pipeline samples/s / single-process training samples/s, both with one
//     compute thread per process (stage), on the same model and batches.
//
// Model: an MLP of four 1024-wide hidden layers (ReLU) and a 10-way output on synthetic
// samples, 1536 values by default (--input, see mlpSpec). Stages are threads with their own
// backend, model slice and ZeroMQ context (as separate processes would have), joined by fp32 tcp
// loopback links. Rounds alternate between the single-process reference and the pipelines; each
// figure is the best of its rounds (noisy shared machine).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "backends/cpu/blas_core.h"
#include "backends/cpu/cpu_backend.h"
#include "benchmarks/bench_args.h"
#include "core/model_spec.h"
#include "core/pipeline/stage_trainer.h"
#include "transport/zmq_link.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The input width sets the first stage's share: its first layer computes y and dW but
// no dx (2 GEMMs of input x 1024), the other hidden layers 3 GEMMs of 1024 x 1024. At
// 1536 the two halves are equal (6 : 6 GEMM units), as the ideal p*m/(m+p-1) assumes;
// at 1024 they are 5 : 6 and 2 stages can reach at most 88/53 = 1.66 at m = 8.
std::string mlpSpec(int64_t input) {
  return "name: mlp4x1024\ninput: [" + std::to_string(input) + "]\n" + R"(layers:
  - linear: {out: 1024}
  - relu
  - linear: {out: 1024}
  - relu
  - linear: {out: 1024}
  - relu
  - linear: {out: 1024}
  - relu
  - linear: {out: 10}
)";
}

Dataset synthetic(int64_t n, int64_t input) {
  Dataset d;
  d.name = "synthetic";
  d.sample_shape = Shape{input};
  d.classes = 10;
  d.mean = 0.5f;
  d.stddev = 0.3f;
  Rng rng(9);
  d.images.resize(static_cast<size_t>(n * input));
  for (uint8_t& b : d.images) b = static_cast<uint8_t>(rng.below(256));
  for (int64_t i = 0; i < n; ++i) d.labels.push_back(static_cast<int32_t>(rng.below(10)));
  return d;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// `microbatches` > 1: the same gradient accumulation the pipeline does, in one process.
double singleProcess(const std::string& spec, const Dataset& d, int64_t batch,
                     int64_t microbatches) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(spec));
  m.build(be, 1);
  Optimizer opt(be, OptimizerOptions{});
  Trainer t(m, opt, TrainOptions{batch, 1, false, microbatches});
  return t.trainEpoch(d, 0, {}).samples_per_s;
}

// `copies` independent single-process trainings at once, one per thread: what this
// machine's cores deliver together when all compute (shared caches, memory, clocks).
double concurrent(const std::string& spec, const Dataset& d, int64_t batch, int64_t microbatches,
                  int copies) {
  std::vector<double> rate(static_cast<size_t>(copies));
  std::vector<std::thread> threads;
  for (int c = 0; c < copies; ++c)
    threads.emplace_back(
        [&, c] { rate[static_cast<size_t>(c)] = singleProcess(spec, d, batch, microbatches); });
  for (auto& t : threads) t.join();
  double sum = 0;
  for (double r : rate) sum += r;
  return sum;
}

struct PipelineResult {
  double samples_per_s = 0, ideal_samples_per_s = 0;
  std::vector<double> busy_s;  // per stage
};

PipelineResult pipelined(const std::string& spec, const Dataset& d, int p, int64_t batch, int64_t m,
                         bool verbose) {
  // Whole hidden layers (linear + relu) per stage, the 10-way output with the last:
  // equal compute, as equal layer counts would not give.
  std::vector<std::pair<size_t, size_t>> ranges;
  for (int s = 0; s < p; ++s) {
    const auto per = static_cast<size_t>(8 / p);
    ranges.push_back({s * per, s == p - 1 ? size_t{9} : (s + 1) * per});
  }
  std::vector<std::unique_ptr<transport::Context>> contexts;
  for (int s = 0; s < p; ++s) contexts.push_back(std::make_unique<transport::Context>());
  std::vector<std::unique_ptr<transport::ZmqLink>> next(static_cast<size_t>(p)),
      prev(static_cast<size_t>(p));
  for (int s = 0; s + 1 < p; ++s) {
    transport::LinkOptions o;
    o.bind = "tcp://127.0.0.1:*";
    o.timeout = 60s;
    next[static_cast<size_t>(s)] = std::make_unique<transport::ZmqLink>(*contexts[s], o);
    prev[static_cast<size_t>(s + 1)] = std::make_unique<transport::ZmqLink>(*contexts[s + 1], o);
    next[static_cast<size_t>(s)]->connect(prev[static_cast<size_t>(s + 1)]->endpoint());
    prev[static_cast<size_t>(s + 1)]->connect(next[static_cast<size_t>(s)]->endpoint());
  }
  PipelineOptions po;
  po.schedule = ScheduleKind::k1F1B;
  po.microbatches = m;
  po.batch = batch;
  po.shuffle = false;
  PipelineResult r;
  r.busy_s.resize(static_cast<size_t>(p));
  std::vector<double> wall(static_cast<size_t>(p));
  std::vector<std::thread> threads;
  for (int s = 0; s < p; ++s) {
    threads.emplace_back([&, s] {
      const auto i = static_cast<size_t>(s);
      cpu::CpuBackend be(cpu::CpuOptions{1});
      Model model(parseModelSpec(spec));
      model.build(be, 1, ranges[i].first, ranges[i].second);
      Optimizer opt(be, OptimizerOptions{});
      StageTrainer st(model, StageRange{s, p, ranges[i].first, ranges[i].second}, prev[i].get(),
                      next[i].get(), &opt, po);
      const auto t0 = Clock::now();
      st.trainEpoch(s == 0 ? &d : nullptr, d.size(), 0, {});
      wall[i] = seconds(Clock::now() - t0);
      r.busy_s[i] = st.executor().counters().busy_s;
      const auto& c = st.executor().counters();
      if (verbose)
        std::fprintf(stderr, "p=%d m=%lld stage %d: wall %.3f busy %.3f wait %.3f send %.3f\n", p,
                     static_cast<long long>(m), s, wall[i], c.busy_s, c.recv_wait_s, c.send_s);
    });
  }
  for (auto& t : threads) t.join();
  double longest = 0, slowest = 0;
  for (int s = 0; s < p; ++s) {
    longest = std::max(longest, wall[static_cast<size_t>(s)]);
    slowest = std::max(slowest, r.busy_s[static_cast<size_t>(s)]);
  }
  const double steps = static_cast<double>((d.size() + batch - 1) / batch);
  const double mb_time =
      slowest / (steps * static_cast<double>(m));  // slowest stage, per microbatch
  const double ideal_step = static_cast<double>(m + p - 1) * mb_time;
  r.samples_per_s = static_cast<double>(d.size()) / longest;
  r.ideal_samples_per_s = static_cast<double>(d.size()) / (steps * ideal_step);
  return r;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  using namespace tandem;
  cpu::useFasterBlasCore(argv);  // the kernels tandem's programs run
  transport::keepFreedMemory();  // as the stage workers do
  int rounds = 3;
  int64_t steps = 4, batch = 2048, input = 1536;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    auto number = [&](size_t prefix, long long max) {
      return bench::wholeNumber("pipeline_bench", std::string_view(argv[i], prefix - 1),
                                argv[i] + prefix, 1, max);
    };
    if (std::strncmp(argv[i], "--rounds=", 9) == 0)
      rounds = static_cast<int>(number(9, 1000));
    else if (std::strncmp(argv[i], "--steps=", 8) == 0)
      steps = number(8, 1'000'000);
    else if (std::strncmp(argv[i], "--batch=", 8) == 0)
      batch = number(8, 1 << 20);
    else if (std::strncmp(argv[i], "--input=", 8) == 0)
      input = number(8, 1 << 20);
    else if (std::strcmp(argv[i], "--verbose") == 0)
      verbose = true;
    else {
      std::fprintf(stderr,
                   "usage: pipeline_bench [--rounds=N] [--steps=N] [--batch=N] [--input=N] "
                   "[--verbose]\n");
      return 2;
    }
  }
  const std::string spec = mlpSpec(input);
  const Dataset d = synthetic(steps * batch, input);
  struct Config {
    int p;
    int64_t m;
  };
  const Config configs[] = {{2, 8}, {2, 16}, {4, 16}};
  double single = 0, accumulating = 0, two = 0;
  std::vector<PipelineResult> best(std::size(configs));
  for (int r = 0; r < rounds; ++r) {
    single = std::max(single, singleProcess(spec, d, batch, 1));
    accumulating = std::max(accumulating, singleProcess(spec, d, batch, 8));
    two = std::max(two, concurrent(spec, d, batch, 8, 2));
    for (size_t c = 0; c < std::size(configs); ++c) {
      const PipelineResult got = pipelined(spec, d, configs[c].p, batch, configs[c].m, verbose);
      if (got.samples_per_s > best[c].samples_per_s) best[c] = got;
    }
  }
  std::printf(
      "MLP %lld-1024-1024-1024-1024-10, batch %lld, %lld steps, 1 thread per stage, fp32 "
      "tcp loopback, 1F1B; best of %d rounds (%u hardware threads)\n\n",
      static_cast<long long>(input), static_cast<long long>(batch), static_cast<long long>(steps),
      rounds, std::thread::hardware_concurrency());
  std::printf("%-22s %12s %12s %10s %10s %9s\n", "run", "samples/s", "ideal", "efficiency",
              "speed-up", "(ideal)");
  std::printf("%-22s %12.0f %12s %10s %10s %9s\n", "single process", single, "-", "-", "1.00", "-");
  std::printf("%-22s %12.0f %12s %10s %10.2f %9s\n", "single process m=8", accumulating, "-", "-",
              accumulating / single, "-");
  std::printf("%-22s %12.0f %12s %10s %10.2f %9s\n", "2 at once m=8", two, "-", "-", two / single,
              "-");
  for (size_t c = 0; c < std::size(configs); ++c) {
    const auto& cf = configs[c];
    const PipelineResult& r = best[c];
    char name[64];
    std::snprintf(name, sizeof name, "pipeline p=%d m=%lld", cf.p, static_cast<long long>(cf.m));
    const double ideal_speedup = cf.p * static_cast<double>(cf.m) / (cf.m + cf.p - 1);
    std::printf("%-22s %12.0f %12.0f %10.2f %10.2f %9.2f\n", name, r.samples_per_s,
                r.ideal_samples_per_s, r.samples_per_s / r.ideal_samples_per_s,
                r.samples_per_s / single, ideal_speedup);
  }
  std::printf(
      "\nefficiency: measured / ideal, ideal = (m+p-1) x slowest stage's busy time per "
      "microbatch;\nspeed-up: over the single process; (ideal): p x m/(m+p-1) for "
      "equal stages and free links;\n'single process m=8' accumulates gradients over 8 "
      "microbatches as the pipelines do: what microbatching alone costs.\n");
  return 0;
}
