// Every Backend op on the OpenCL device against the CPU reference: one table of cases,
// each run on both backends from the same inputs at sizes 1, 7, 13 and 127 (vector
// tails, partial work-groups), every output compared within the case's tolerance.
// Skips, with the reason, when the machine has no OpenCL device.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>

#include "backends/cpu/cpu_backend.h"
#include "backends/opencl/opencl_backend.h"
#include "core/quantize.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::randomVector;

// Runs one op on a backend at size n and returns every output it wrote, as floats.
using Outputs = std::vector<std::vector<float>>;
struct OpCase {
  const char* name;
  std::function<Outputs(Backend&, int64_t n)> run;
  double tolerance = 1e-6;  // |got - want| <= tolerance * (1 + |want|)
};

// gtest prints a case by its name rather than its bytes.
void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

std::vector<float> i32AsFloat(const Tensor& t) {
  std::vector<float> out;
  for (int32_t v : toHostI32(t)) out.push_back(static_cast<float>(v));
  return out;
}

// Ids in [0, limit), repeating (so scatters accumulate onto the same rows).
std::vector<int32_t> ids(int64_t n, int64_t limit, uint64_t seed) {
  std::vector<int32_t> out;
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) out.push_back(static_cast<int32_t>(rng.next() % limit));
  return out;
}

OpCase gemmCase(const char* name, bool ta, bool tb) {
  return {name,
          [=](Backend& be, int64_t n) {
            const int64_t m = n + 2, k = 2 * n + 1;
            Tensor a = toDevice(be, ta ? Shape{k, m} : Shape{m, k}, randomVector(1, m * k));
            Tensor b = toDevice(be, tb ? Shape{n, k} : Shape{k, n}, randomVector(2, k * n));
            Tensor c = toDevice(be, {m, n}, randomVector(3, m * n));
            be.gemm(ta, tb, 0.5f, a, b, 2.0f, c);
            return Outputs{toHost(c)};
          },
          1e-5};
}

// Over [-range, range]: the hard ones' bounds (-3, 3, 6) crossed.
OpCase activationCase(const char* name, Activation kind, float range = 4) {
  return {name,
          [=](Backend& be, int64_t n) {
            const int64_t count = n * 37;
            Tensor x = toDevice(be, {count}, randomVector(4, count, -range, range));
            Tensor y = be.empty({count}), dx = be.empty({count});
            be.activation(kind, x, y);
            be.activationBackward(kind, x, y, toDevice(be, {count}, randomVector(5, count)), dx);
            return Outputs{toHost(y), toHost(dx)};
          },
          2e-6};
}

// A window over [2, 3, n + 2, n + 4] input.
Window2d window(int64_t n, int64_t k, int64_t stride, int64_t pad) {
  Window2d g;
  g.channels = 3;
  g.height = n + 2;
  g.width = n + 4;
  g.kernel_h = g.kernel_w = k;
  g.stride_h = g.stride_w = stride;
  g.pad_h = g.pad_w = pad;
  return g;
}

OpCase convCase(const char* name, int64_t k, int64_t stride, int64_t pad) {
  return {name,
          [=](Backend& be, int64_t n) {
            const Window2d g = window(n, k, stride, pad);
            const Shape xs{2, g.channels, g.height, g.width};
            Tensor x = toDevice(be, xs, randomVector(6, xs.numel()));
            const int64_t rows = g.channels * k * k, cols = 2 * g.outHeight() * g.outWidth();
            Tensor col = be.empty({rows, cols});
            be.im2col(x, g, col);
            Tensor dx = be.empty(xs);
            be.col2im(toDevice(be, {rows, cols}, randomVector(7, rows * cols)), g, dx);
            return Outputs{toHost(col), toHost(dx)};
          },
          1e-6};
}

// conv2d and its gradients: OpenCL's composed path against the CPU's kernels.
OpCase conv2dCase(const char* name, int64_t k, int64_t stride, int64_t pad) {
  return {name,
          [=](Backend& be, int64_t n) {
            const Window2d g = window(n, k, stride, pad);
            const Shape xs{2, g.channels, g.height, g.width}, ws{5, g.channels, k, k};
            const Shape ys{2, 5, g.outHeight(), g.outWidth()};
            Tensor x = toDevice(be, xs, randomVector(6, xs.numel()));
            Tensor w = toDevice(be, ws, randomVector(7, ws.numel()));
            Tensor b = toDevice(be, {5}, randomVector(8, 5));
            Tensor dy = toDevice(be, ys, randomVector(9, ys.numel()));
            Tensor y = be.empty(ys), dx = be.empty(xs);
            Tensor dw = toDevice(be, ws, randomVector(10, ws.numel()));
            Tensor db = toDevice(be, {5}, randomVector(11, 5));
            be.conv2d(x, w, b, g, y);
            be.conv2dBackwardData(dy, w, g, dx);
            be.conv2dBackwardWeight(x, dy, g, dw, db);
            return Outputs{toHost(y), toHost(dx), toHost(dw), toHost(db)};
          },
          // dw sums up to 2 x 129 x 131 products in another order (per-sample partial
          // products summed, or one product over the chunk's pixels)
          1e-4};
}

// With `ceil`, max pooling alone (ceil mode is max pooling's): partial last windows.
OpCase poolCase(const char* name, int64_t k, int64_t stride, int64_t pad, bool ceil = false) {
  return {name,
          [=](Backend& be, int64_t n) {
            Window2d g = window(n, k, stride, pad);
            g.ceil = ceil;
            const Shape xs{2, g.channels, g.height, g.width};
            const Shape ys{2, g.channels, g.outHeight(), g.outWidth()};
            Tensor x = toDevice(be, xs, randomVector(8, xs.numel()));
            Tensor y = be.empty(ys), arg = be.empty(ys, DType::kI32), avg = be.empty(ys);
            be.maxPool(x, g, y, arg);
            Tensor dy = toDevice(be, ys, randomVector(9, ys.numel()));
            Tensor dmax = be.empty(xs), davg = be.empty(xs);
            be.maxPoolBackward(dy, arg, g, dmax);
            if (ceil) return Outputs{toHost(y), i32AsFloat(arg), toHost(dmax)};
            be.avgPool(x, g, avg);
            be.avgPoolBackward(dy, g, davg);
            return Outputs{toHost(y), i32AsFloat(arg), toHost(avg), toHost(dmax), toHost(davg)};
          },
          1e-6};
}

// Depthwise convolution and both gradients; the kernels sum in the reference's order, so
// only the devices' own rounding may differ.
OpCase depthwiseCase(const char* name, int64_t k, int64_t stride, int64_t pad) {
  return {name,
          [=](Backend& be, int64_t n) {
            const Window2d g = window(n, k, stride, pad);
            const Shape xs{2, g.channels, g.height, g.width};
            const Shape ys{2, g.channels, g.outHeight(), g.outWidth()}, ws{g.channels, 1, k, k};
            Tensor x = toDevice(be, xs, randomVector(8, xs.numel()));
            Tensor w = toDevice(be, ws, randomVector(9, ws.numel()));
            Tensor dy = toDevice(be, ys, randomVector(10, ys.numel()));
            Tensor y = be.empty(ys), dx = be.empty(xs);
            Tensor dw = toDevice(be, ws, randomVector(11, ws.numel()));  // (accumulated into)
            be.depthwiseConv2d(x, w, g, y);
            be.depthwiseConv2dBackwardData(dy, w, g, dx);
            be.depthwiseConv2dBackwardWeight(x, dy, g, dw);
            return Outputs{toHost(y), toHost(dx), toHost(dw)};
          },
          1e-5};
}

OpCase sgdCase(const char* name, float momentum, bool nesterov) {
  return {name,
          [=](Backend& be, int64_t n) {
            Tensor w = toDevice(be, {n}, randomVector(10, n));
            Tensor g = toDevice(be, {n}, randomVector(11, n));
            Tensor v = toDevice(be, {n}, randomVector(12, n));
            for (int i = 0; i < 3; ++i)
              be.sgdStep(w, g, v, SgdStep{0.1f, momentum, 0.01f, nesterov});
            return Outputs{toHost(w), toHost(v)};
          },
          1e-6};
}

std::vector<OpCase> cases() {
  return {
      gemmCase("gemm_nn", false, false),
      gemmCase("gemm_nt", false, true),
      gemmCase("gemm_tn", true, false),
      gemmCase("gemm_tt", true, true),
      {"gemm_empty_k_scales_c",
       [](Backend& be, int64_t n) {
         Tensor c = toDevice(be, {n, 3}, randomVector(3, 3 * n));
         be.gemm(false, false, 1.0f, be.empty({n, 0}), be.empty({0, 3}), 0.5f, c);
         return Outputs{toHost(c)};
       }},
      {"gemm_on_views",  // row slices start inside their buffers: offsets reach CLBlast
       [](Backend& be, int64_t n) {
         Tensor a = toDevice(be, {n + 3, n}, randomVector(1, (n + 3) * n)).slice(2, n);
         Tensor b = toDevice(be, {n + 1, n}, randomVector(2, (n + 1) * n)).slice(1, n);
         Tensor c = toDevice(be, {n + 5, n}, randomVector(3, (n + 5) * n)).slice(5, n);
         be.gemm(false, true, 1.0f, a, b, 0.0f, c);
         return Outputs{toHost(c)};
       },
       1e-5},
      {"axpby",
       [](Backend& be, int64_t n) {
         const int64_t count = n * 1001;
         Tensor x = toDevice(be, {count}, randomVector(4, count));
         Outputs out;
         for (float beta : {-0.5f, 0.0f, 1.0f}) {
           Tensor y = toDevice(be, {count}, randomVector(5, count));
           be.axpby(2.0f, x, beta, y);
           out.push_back(toHost(y));
         }
         return out;
       }},
      {"mul_and_dot",
       [](Backend& be, int64_t n) {
         const int64_t count = n * 1001;
         Tensor a = toDevice(be, {count}, randomVector(4, count));
         Tensor b = toDevice(be, {count}, randomVector(5, count));
         Tensor out = be.empty({count});
         be.mul(a, b, out);
         be.mul(a, b, a);  // out aliasing an input
         return Outputs{toHost(out), toHost(a), {static_cast<float>(be.dot(b, b))}};
       },
       1e-6},
      {"fill_and_copy",
       [](Backend& be, int64_t n) {
         Tensor f = be.empty({n + 4});
         be.fill(f, 1.5f);
         Tensor i = be.empty({n}, DType::kI32);
         be.fill(i, -3.0f);
         Tensor src = toDevice(be, {n + 4}, randomVector(4, n + 4));
         be.copy(src.slice(0, n), f.slice(4, n));  // copy between views
         be.copy(f.slice(0, n), f.slice(2, n));    // overlapping, inside one buffer
         return Outputs{toHost(f), i32AsFloat(i)};
       }},
      {"convert",
       [](Backend& be, int64_t n) {
         const int64_t count = n * 31;
         auto values = randomVector(4, count, -70000, 70000);
         values[0] = 1e-6f;  // an f16 subnormal
         Tensor x = toDevice(be, {count}, values);
         Outputs out;
         for (DType dt : {DType::kF16, DType::kBF16, DType::kI32}) {
           Tensor narrow = be.empty({count}, dt), back = be.empty({count});
           be.convert(x, narrow);
           be.convert(narrow, back);
           out.push_back(toHost(back));
         }
         return out;
       },
       0},
      {"bias",
       [](Backend& be, int64_t n) {
         Outputs out;
         for (const Shape& s : {Shape{3, n, 5}, Shape{4, n}}) {
           Tensor y = toDevice(be, s, randomVector(6, s.numel()));
           Tensor b = toDevice(be, {n}, randomVector(7, n));
           be.addBias(y, b);
           be.biasGrad(y, b);
           out.push_back(toHost(y));
           out.push_back(toHost(b));
         }
         return out;
       },
       1e-6},
      activationCase("relu", Activation::kReLU),
      activationCase("gelu", Activation::kGELU),
      activationCase("tanh", Activation::kTanh),
      activationCase("sigmoid", Activation::kSigmoid),
      activationCase("silu", Activation::kSiLU),
      activationCase("relu6", Activation::kReLU6, 8),
      activationCase("hardsigmoid", Activation::kHardSigmoid, 8),
      activationCase("hardswish", Activation::kHardSwish, 8),
      {"dropout",  // the mask comes from the shared counter hash: equal bit for bit
       [](Backend& be, int64_t n) {
         const int64_t count = n * 101;
         Tensor x = toDevice(be, {count}, randomVector(4, count));
         Tensor mask = be.empty({count}), y = be.empty({count});
         be.dropout(x, 0.3f, 0x1234567890ull, mask, y);
         return Outputs{toHost(mask), toHost(y)};
       },
       0},
      convCase("im2col_col2im_3x3", 3, 1, 1),
      convCase("im2col_col2im_3x3_stride2", 3, 2, 1),
      convCase("im2col_col2im_1x1", 1, 1, 0),
      conv2dCase("conv2d_3x3", 3, 1, 1),
      conv2dCase("conv2d_3x3_stride2", 3, 2, 1),
      conv2dCase("conv2d_1x1", 1, 1, 0),
      {"transpose01",
       [](Backend& be, int64_t n) {
         Tensor src = toDevice(be, {3, n, 5}, randomVector(4, 15 * n));
         Tensor dst = be.empty({n, 3, 5});
         be.transpose01(src, dst);
         return Outputs{toHost(dst)};
       },
       0},
      poolCase("pool_2x2", 2, 2, 0),
      poolCase("pool_3x3_stride2_pad1", 3, 2, 1),
      poolCase("maxpool_3x3_stride2_ceil", 3, 2, 0, true),
      depthwiseCase("depthwise_3x3_pad1", 3, 1, 1),
      depthwiseCase("depthwise_3x3_stride2", 3, 2, 1),
      depthwiseCase("depthwise_5x5_stride3", 5, 3, 2),
      poolCase("maxpool_2x2_ceil", 2, 2, 0, true),
      {"layer_norm",
       [](Backend& be, int64_t n) {
         const int64_t m = 5, d = n;
         Tensor x = toDevice(be, {m, d}, randomVector(4, m * d, -2, 3));
         Tensor gamma = toDevice(be, {d}, randomVector(5, d));
         Tensor beta = toDevice(be, {d}, randomVector(6, d));
         Tensor y = be.empty({m, d}), mean = be.empty({m}), rstd = be.empty({m});
         be.layerNorm(x, gamma, beta, 1e-5f, y, mean, rstd);
         Tensor dx = be.empty({m, d});
         Tensor dg = toDevice(be, {d}, randomVector(7, d)), db = be.zeros({d});
         be.layerNormBackward(toDevice(be, {m, d}, randomVector(8, m * d)), x, gamma, mean, rstd,
                              dx, dg, db);
         return Outputs{toHost(y), toHost(mean), toHost(rstd), toHost(dx), toHost(dg), toHost(db)};
       },
       1e-5},
      // Batch statistics over [3, 4, n] (per channel across samples), the normalised
      // output, the train-mode backward; then the running-statistics form.
      {"batch_norm",
       [](Backend& be, int64_t n) {
         const int64_t s = 3, c = 4;
         Tensor x = toDevice(be, {s, c, n}, randomVector(4, s * c * n, -2, 3));
         Tensor gamma = toDevice(be, {c}, randomVector(5, c));
         Tensor beta = toDevice(be, {c}, randomVector(6, c));
         Tensor y = be.empty({s, c, n}), mean = be.empty({c}), var = be.empty({c});
         be.batchNorm(x, gamma, beta, 1e-5f, true, mean, var, y);
         Tensor dx = be.empty({s, c, n});
         Tensor dg = toDevice(be, {c}, randomVector(7, c)), db = be.zeros({c});
         be.batchNormBackward(toDevice(be, {s, c, n}, randomVector(8, s * c * n)), x, gamma, mean,
                              var, 1e-5f, dx, dg, db);
         Outputs out = {toHost(y), toHost(mean), toHost(var), toHost(dx), toHost(dg), toHost(db)};
         Tensor rm = toDevice(be, {c}, randomVector(9, c)), rv = toDevice(be, {c}, {1, 2, 0.5, 3});
         be.batchNorm(x, gamma, beta, 1e-5f, false, rm, rv, y);
         out.push_back(toHost(y));
         return out;
       },
       1e-5},
      {"rms_norm",
       [](Backend& be, int64_t n) {
         const int64_t m = 5, d = n;
         Tensor x = toDevice(be, {m, d}, randomVector(4, m * d, -2, 3));
         Tensor gamma = toDevice(be, {d}, randomVector(5, d));
         Tensor y = be.empty({m, d}), rstd = be.empty({m});
         be.rmsNorm(x, gamma, 1e-6f, y, rstd);
         Tensor dx = be.empty({m, d});
         Tensor dg = toDevice(be, {d}, randomVector(7, d));
         be.rmsNormBackward(toDevice(be, {m, d}, randomVector(8, m * d)), x, gamma, rstd, dx, dg);
         return Outputs{toHost(y), toHost(rstd), toHost(dx), toHost(dg)};
       },
       1e-5},
      // Heads of 2n, positions up to 1000 (angles far from 0), forward, back, and the
      // first two of three heads in place.
      {"rope",
       [](Backend& be, int64_t n) {
         const int64_t rows = 6, heads = 3, size = 2 * n;
         Tensor x = toDevice(be, {rows, heads, size}, randomVector(4, rows * heads * size));
         Tensor pos = toDeviceI32(be, {rows}, {0, 1, 2, 17, 255, 1000});
         std::vector<float> freq(static_cast<size_t>(n));
         for (int64_t i = 0; i < n; ++i)
           freq[static_cast<size_t>(i)] =
               std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(size));
         Tensor inv_freq = toDevice(be, {n}, freq);
         Tensor y = be.empty({rows, heads, size});
         be.rope(x, pos, inv_freq, heads, false, y);
         Tensor back = be.empty({rows, heads, size});
         be.rope(y, pos, inv_freq, heads, true, back);
         be.rope(x, pos, inv_freq, 2, false, x);
         return Outputs{toHost(y), toHost(back), toHost(x)};
       },
       2e-5},
      // int8 weights in two groups per row; n + 2 rows: the CPU's direct kernel up to 15,
      // its dequantized panels from 16 on (n = 127).
      {"gemm_q8",
       [](Backend& be, int64_t n) {
         const int64_t m = n + 2, k = 2 * n + 2;
         const QuantizedRows q = quantizeRows(randomVector(5, n * k), n, k, k / 2, "w");
         Tensor x = toDevice(be, {m, k}, randomVector(6, m * k));
         Tensor w = be.empty({n, k}, DType::kI8);
         be.upload(w, q.values.data());
         Tensor scales = toDevice(be, {n, 2}, q.scales);
         Tensor y = be.empty({m, n});
         be.gemmQ8(x, w, scales, y);
         return Outputs{toHost(y)};
       },
       1e-5},
      {"embedding",
       [](Backend& be, int64_t n) {
         const int64_t vocab = 11, d = n, m = 2 * n + 3;
         Tensor id = toDeviceI32(be, {m}, ids(m, vocab, 1));
         Tensor table = toDevice(be, {vocab, d}, randomVector(4, vocab * d));
         Tensor y = be.empty({m, d});
         be.embedding(id, table, y);
         be.embeddingBackward(id, toDevice(be, {m, d}, randomVector(5, m * d)), table);
         return Outputs{toHost(y), toHost(table)};
       },
       1e-6},
      {"gemm_batched",
       [](Backend& be, int64_t n) {
         const int64_t batch = 3, m = n + 1, k = n + 2;
         Tensor a = toDevice(be, {batch, k, m}, randomVector(1, batch * m * k));  // transposed
         Tensor b = toDevice(be, {batch, n, k}, randomVector(2, batch * k * n));  // transposed
         Tensor c = toDevice(be, {batch, m, n}, randomVector(3, batch * m * n));
         be.gemmBatched(true, true, 0.5f, a, b, 2.0f, c);
         Tensor d = be.empty({batch, m, n});
         be.gemmBatched(false, false, 1.0f,
                        toDevice(be, {batch, m, k}, randomVector(4, batch * m * k)),
                        toDevice(be, {batch, k, n}, randomVector(5, batch * k * n)), 0.0f, d);
         return Outputs{toHost(c), toHost(d)};
       },
       1e-5},
      // Whole sequences (Tq = Tk), a decoding step over a cache (Tq < Tk), no mask; in
      // place as attention runs it, and its backward.
      {"softmax",
       [](Backend& be, int64_t n) {
         const int64_t tk = n + 1, tq = (n + 1) / 2 + 1;
         Tensor square = toDevice(be, {3, tk, tk}, randomVector(4, 3 * tk * tk, -6, 6));
         Tensor cached = toDevice(be, {2, tq, tk}, randomVector(5, 2 * tq * tk, -6, 6));
         Tensor plain = be.empty({2, tq, tk});
         be.softmax(cached, false, plain);
         be.softmax(square, true, square);
         be.softmax(cached, true, cached);
         Tensor dy = toDevice(be, {3, tk, tk}, randomVector(6, 3 * tk * tk));
         Tensor dx = be.empty({3, tk, tk});
         be.softmaxBackward(square, dy, dx);
         be.softmaxBackward(square, dy, dy);
         return Outputs{toHost(square), toHost(cached), toHost(plain), toHost(dx), toHost(dy)};
       },
       1e-6},
      {"softmax_cross_entropy",
       [](Backend& be, int64_t n) {
         const int64_t rows = 2 * n + 1, c = n + 2;
         Tensor logits = toDevice(be, {rows, c}, randomVector(4, rows * c, -8, 8));
         Tensor labels = toDeviceI32(be, {rows}, ids(rows, c, 2));
         Tensor losses = be.empty({rows}), d = be.empty({rows, c}), only = be.empty({rows});
         be.softmaxCrossEntropy(logits, labels, 0.25f, losses, d);
         be.softmaxCrossEntropy(logits, labels, 1.0f, only, Tensor());
         return Outputs{toHost(losses), toHost(d), toHost(only)};
       },
       1e-6},
      sgdCase("sgd", 0.0f, false),
      sgdCase("sgd_momentum", 0.9f, false),
      sgdCase("sgd_nesterov", 0.9f, true),
      {"adamw",
       [](Backend& be, int64_t n) {
         Tensor w = toDevice(be, {n}, randomVector(10, n));
         Tensor m = be.zeros({n}), v = be.zeros({n});
         for (int64_t step = 1; step <= 3; ++step) {
           be.adamwStep(w, toDevice(be, {n}, randomVector(11 + step, n)), m, v,
                        AdamWStep{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, step});
         }
         return Outputs{toHost(w), toHost(m), toHost(v)};
       },
       1e-5},
  };
}

// The OpenCL backend on device 0, built once for the whole suite, or why there is none.
opencl::OpenClBackend* device() {
  static std::unique_ptr<opencl::OpenClBackend> be = [] {
    return opencl::listClDevices().empty() ? nullptr : std::make_unique<opencl::OpenClBackend>();
  }();
  return be.get();
}

class OpenClOpsTest : public ::testing::TestWithParam<std::tuple<OpCase, int64_t>> {};

TEST_P(OpenClOpsTest, MatchesTheCpuReference) {
  opencl::OpenClBackend* cl = device();
  if (!cl) GTEST_SKIP() << "no OpenCL device: " << opencl::noDevicesReason();
  const auto& [op, n] = GetParam();
  cpu::CpuBackend cpu;
  const Outputs want = op.run(cpu, n);
  const Outputs got = op.run(*cl, n);
  ASSERT_EQ(got.size(), want.size());
  for (size_t o = 0; o < want.size(); ++o) {
    ASSERT_EQ(got[o].size(), want[o].size()) << "output " << o;
    for (size_t i = 0; i < want[o].size(); ++i) {
      const double w = want[o][i], g = got[o][i];
      ASSERT_TRUE(g == w || std::abs(g - w) <= op.tolerance * (1 + std::abs(w)) ||
                  (std::isnan(g) && std::isnan(w)))
          << op.name << " output " << o << " element " << i << ": opencl " << g << ", cpu " << w;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpenClOpsTest,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::Values(1, 7, 13, 127)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace tandem
