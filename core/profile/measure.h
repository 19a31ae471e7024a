// Measurement shared by `tandem profile` and benchmarks/device_bench: what is run (a
// layer's forward or backward on a prepared input, a square GEMM) and how a time is
// taken (warm-up, repeats, median and spread). Every run ends with
// Backend::synchronize(), so a time covers the device's work, not only its enqueueing.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "core/host_limits.h"
#include "core/model.h"
#include "core/model_spec.h"

namespace tandem {

// Seconds over repeated runs.
struct Spread {
  double median = 0, min = 0, max = 0;
  int repeats = 0;
};

// Runs f `warmup` times untimed, then `repeats` times timed.
Spread timeRepeated(const std::function<void()>& f, int warmup, int repeats);
// Median, min and max of timed runs (at least one).
Spread spreadOf(std::vector<double> seconds);
// Seconds f takes.
double timeOnce(const std::function<void()>& f);

// What a device keeps up: `pass` run back to back until `window` seconds and at least two
// passes have gone by. Timing short runs and keeping their median hides a CPU quota (a
// quarter-core node runs 25 ms of each 100 ms period at full speed and then waits), so
// what must hold over time is measured over many periods.
struct SustainedRun {
  double pass_s = 0;  // wall seconds per pass: the median over the window's parts
  int passes = 0;
  double window_s = 0;
  double cpu_s = 0;  // CPU seconds the process spent over the window, every thread
};
inline constexpr int kSustainedParts = 5;
inline constexpr int kSustainedPeriods = 40;
SustainedRun runSustained(const std::function<void()>& pass, double window);
// Passes that ended at `ends` (seconds from the window's start, ascending) cut into
// `parts` consecutive runs of whole passes by time: the median of the parts' time per
// pass — a burst of noise from another process spoils one part, not the figure (each part
// still crosses kSustainedPeriods / kSustainedParts quota periods).
double medianPartPass(const std::vector<double>& ends, int parts);
// The window that crosses enough of `limit`'s quota periods: at least `least` seconds;
// under a quota kSustainedPeriods periods (8 in each of the 5 parts: the phase of the last
// one moves a part by at most 12%, and the median steadies it), at most 4 s.
double sustainWindow(double least, const CpuLimit& limit);

// Every layer of a built model with its own input: one forward pass from a random
// batch (fixed seed) stores each layer's input, stash and an output-shaped gradient,
// so any layer can then be run alone, any number of times. Run in order they chain as a
// stage's pass does: a forward's output becomes the next layer's input and its stash the
// one its backward reads, a backward's input gradient the gradient the layer before reads
// — each layer finds what its neighbour just wrote in the caches (reading the stored
// copies instead, a pass of mlp-deep at batch 16 took 0.92-1.35x, mean 1.13x, the CPU of
// a one-stage run's microbatch; chained 0.95-1.15x, mean 1.04x: docs/profile.md). The
// weights do not change, so every pass computes the same values.
class LayerRunner {
 public:
  LayerRunner(Model& model, int64_t batch, uint64_t seed = 1);

  size_t size() const { return inputs_.size(); }
  // Whether the backend runs layer i (Backend::supports for its Layer::ops, training). One
  // it cannot run is not run: it passes zeros of its output's shape on, and its forward
  // and backward do nothing.
  bool runs(size_t i) const { return runs_.at(i); }
  // Layer i's forward on its stored input (training mode: dropout draws its mask).
  void forward(size_t i);
  // Layer i's backward from its stored stash, with the input gradient unless it is the
  // first layer or `input_grad` is false (as the first stage runs the model's first layer
  // with parameters: nothing wants its input's gradient); gradients accumulate into the
  // parameters' grad buffers.
  void backward(size_t i, bool input_grad = true);
  // Bytes of layer i's output (the activation it passes on) and of its parameters.
  int64_t activationBytes(size_t i) const;
  int64_t paramBytes(size_t i) const;
  // What layer i reads: its input, and the gradient of its output.
  const Tensor& input(size_t i) const { return inputs_.at(i); }
  const Tensor& outputGrad(size_t i) const { return grads_.at(i); }

 private:
  Model& model_;
  std::vector<Tensor> inputs_, grads_;
  std::vector<Stash> stashes_;
  std::vector<bool> runs_;
};

// Load beside a measurement: `copies` threads, each with its own backend (from `make`)
// and its own copy of the model, running whole training passes (every layer forward,
// then backward) over a `batch` until destroyed — as the other stages of a node keep its
// cores, caches and memory busy while one stage computes.
class BackgroundLoad {
 public:
  BackgroundLoad(const ModelSpec& spec, const std::function<std::unique_ptr<Backend>()>& make,
                 int copies, int64_t batch, uint64_t seed = 1);
  ~BackgroundLoad();
  BackgroundLoad(const BackgroundLoad&) = delete;
  BackgroundLoad& operator=(const BackgroundLoad&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// A language model's decoding timed layer by layer: one new token (Layer::decodeEach) for
// `sequences` sequences at once, each with `context` tokens already in its key/value
// cache, every layer in order (each reads the output the layer before it just wrote), the
// caches rewound to `context` before each pass so that every pass decodes the same
// position. Seconds per layer and pass (`warmup` passes untimed, then `repeats`), and
// per layer the bytes one sequence's decoding state holds there (its key/value cache,
// allocated for the whole context). nullopt when the model does not decode token by token
// (its input is not token ids, or a layer cannot: Layer::decode throws Unsupported) or
// the context holds no second token.
struct DecodeTimes {
  std::vector<std::vector<double>> seconds;
  std::vector<int64_t> cache_bytes;
};
std::optional<DecodeTimes> timeDecode(Model& model, int64_t context, int64_t sequences, int warmup,
                                      int repeats);

// A square n x n x n sgemm with its operands, on one backend.
class GemmRunner {
 public:
  GemmRunner(Backend& backend, int64_t n);
  void run();  // c = a * b, then synchronize
  double flops() const { return 2.0 * static_cast<double>(n_) * n_ * n_; }

 private:
  Backend& backend_;
  int64_t n_;
  Tensor a_, b_, c_;
};

}  // namespace tandem
