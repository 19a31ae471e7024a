// The CPU's convolution kernels (conv2d and its two gradients) against naive loops over odd
// sizes, strides, paddings, 1x1 and tiled shapes; bitwise the same whatever the thread count
// and whether a sample runs alone or in a batch; close to the composed im2col + gemm path
// other backends run.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/composed_conv.h"
#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::randomVector;

struct ConvCase {
  int64_t n, c, h, w, oc, kh, kw, stride, pad;
};

std::ostream& operator<<(std::ostream& os, const ConvCase& p) {
  return os << "n" << p.n << " c" << p.c << " " << p.h << "x" << p.w << " oc" << p.oc << " k"
            << p.kh << "x" << p.kw << " s" << p.stride << " p" << p.pad;
}

// Naive sums in double, with the sum of the terms' magnitudes as each one's error scale.
struct Reference {
  std::vector<double> value, scale;
};

class ConvTest : public ::testing::TestWithParam<ConvCase> {
 protected:
  Window2d window() const {
    const ConvCase& p = GetParam();
    return Window2d{p.c, p.h, p.w, p.kh, p.kw, p.stride, p.stride, p.pad, p.pad};
  }
  int64_t inCount() const { return GetParam().n * GetParam().c * GetParam().h * GetParam().w; }
  int64_t outCount() const {
    const Window2d g = window();
    return GetParam().n * GetParam().oc * g.outHeight() * g.outWidth();
  }
  int64_t weightCount() const {
    const ConvCase& p = GetParam();
    return p.oc * p.c * p.kh * p.kw;
  }
  Shape inShape() const {
    const ConvCase& p = GetParam();
    return {p.n, p.c, p.h, p.w};
  }
  Shape outShape() const {
    const Window2d g = window();
    return {GetParam().n, GetParam().oc, g.outHeight(), g.outWidth()};
  }
  Shape weightShape() const {
    const ConvCase& p = GetParam();
    return {p.oc, p.c, p.kh, p.kw};
  }

  // Calls fn(s, o, oy, ox, c, ki, kj, x index, w index) for every tap inside the input.
  template <typename Fn>
  void forEachTap(Fn&& fn) const {
    const ConvCase& p = GetParam();
    const Window2d g = window();
    for (int64_t s = 0; s < p.n; ++s)
      for (int64_t o = 0; o < p.oc; ++o)
        for (int64_t oy = 0; oy < g.outHeight(); ++oy)
          for (int64_t ox = 0; ox < g.outWidth(); ++ox)
            for (int64_t c = 0; c < p.c; ++c)
              for (int64_t ki = 0; ki < p.kh; ++ki)
                for (int64_t kj = 0; kj < p.kw; ++kj) {
                  const int64_t iy = oy * p.stride - p.pad + ki, ix = ox * p.stride - p.pad + kj;
                  if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) continue;
                  const int64_t y_at = ((s * p.oc + o) * g.outHeight() + oy) * g.outWidth() + ox;
                  fn(y_at, ((s * p.c + c) * p.h + iy) * p.w + ix,
                     ((o * p.c + c) * p.kh + ki) * p.kw + kj, o);
                }
  }

  static void expectNear(const std::vector<float>& got, const Reference& want, const char* what) {
    ASSERT_EQ(got.size(), want.value.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want.value[i], 1e-5 * (1.0 + want.scale[i]))
          << what << " element " << i << " of " << GetParam();
  }
};

INSTANTIATE_TEST_SUITE_P(
    Shapes, ConvTest,
    ::testing::Values(ConvCase{1, 1, 1, 1, 1, 1, 1, 1, 0}, ConvCase{2, 3, 7, 7, 5, 3, 3, 1, 1},
                      ConvCase{3, 2, 13, 7, 7, 3, 2, 2, 1}, ConvCase{4, 5, 13, 13, 13, 1, 1, 1, 0},
                      ConvCase{2, 4, 14, 14, 8, 1, 1, 2, 0}, ConvCase{2, 1, 127, 3, 3, 3, 3, 1, 1},
                      ConvCase{5, 7, 9, 9, 4, 3, 3, 2, 1},
                      // K x OW beyond a column tile: tiles of one row
                      ConvCase{2, 64, 20, 40, 3, 5, 5, 1, 2},
                      // fewer than 16 outputs a sample, K >= 32 and OC >= 16: samples grouped
                      // (ResNet's last stages); the last in groups of 2 and 1 (OC x OH*OW
                      // past 2^18 floats)
                      ConvCase{3, 16, 2, 2, 20, 3, 3, 2, 1}, ConvCase{5, 9, 3, 3, 17, 3, 3, 1, 1},
                      ConvCase{4, 37, 1, 1, 23, 1, 1, 1, 0},
                      ConvCase{3, 4, 3, 3, 40000, 3, 3, 1, 1}));

TEST_P(ConvTest, ForwardMatchesNaiveSums) {
  const auto x = randomVector(1, inCount()), w = randomVector(2, weightCount());
  const auto bias = randomVector(3, GetParam().oc);
  Reference want{std::vector<double>(static_cast<size_t>(outCount())),
                 std::vector<double>(static_cast<size_t>(outCount()))};
  forEachTap([&](int64_t y_at, int64_t x_at, int64_t w_at, int64_t) {
    const double t = static_cast<double>(x[x_at]) * w[w_at];
    want.value[y_at] += t;
    want.scale[y_at] += std::fabs(t);
  });
  for (size_t i = 0; i < want.value.size(); ++i)
    want.value[i] += bias[(i / (want.value.size() / GetParam().n / GetParam().oc)) % GetParam().oc];
  for (const int threads : {1, 2, 3}) {
    cpu::CpuBackend be(cpu::CpuOptions{threads});
    Tensor y = be.empty(outShape());
    be.conv2d(toDevice(be, inShape(), x), toDevice(be, weightShape(), w),
              toDevice(be, {GetParam().oc}, bias), window(), y);
    expectNear(toHost(y), want, "conv2d");
  }
}

TEST_P(ConvTest, GradientsMatchNaiveSums) {
  const auto x = randomVector(4, inCount()), w = randomVector(5, weightCount());
  const auto dy = randomVector(6, outCount()), dw0 = randomVector(7, weightCount());
  const auto db0 = randomVector(8, GetParam().oc);
  Reference dx{std::vector<double>(static_cast<size_t>(inCount())),
               std::vector<double>(static_cast<size_t>(inCount()))};
  Reference dw{std::vector<double>(dw0.begin(), dw0.end()),
               std::vector<double>(static_cast<size_t>(weightCount()))};
  Reference db{std::vector<double>(db0.begin(), db0.end()),
               std::vector<double>(static_cast<size_t>(GetParam().oc))};
  forEachTap([&](int64_t y_at, int64_t x_at, int64_t w_at, int64_t) {
    dx.value[x_at] += static_cast<double>(dy[y_at]) * w[w_at];
    dx.scale[x_at] += std::fabs(static_cast<double>(dy[y_at]) * w[w_at]);
    dw.value[w_at] += static_cast<double>(dy[y_at]) * x[x_at];
    dw.scale[w_at] += std::fabs(static_cast<double>(dy[y_at]) * x[x_at]);
  });
  const int64_t per_channel = outCount() / GetParam().n / GetParam().oc;
  for (int64_t i = 0; i < outCount(); ++i) {
    db.value[(i / per_channel) % GetParam().oc] += dy[i];
    db.scale[(i / per_channel) % GetParam().oc] += std::fabs(dy[i]);
  }
  for (const int threads : {1, 2, 3}) {
    cpu::CpuBackend be(cpu::CpuOptions{threads});
    Tensor gx = be.empty(inShape());
    const Tensor gw = toDevice(be, weightShape(), dw0), gb = toDevice(be, {GetParam().oc}, db0);
    be.conv2dBackwardData(toDevice(be, outShape(), dy), toDevice(be, weightShape(), w), window(),
                          gx);
    be.conv2dBackwardWeight(toDevice(be, inShape(), x), toDevice(be, outShape(), dy), window(), gw,
                            gb);
    expectNear(toHost(gx), dx, "conv2dBackwardData");
    expectNear(toHost(gw), dw, "conv2dBackwardWeight (weights)");
    expectNear(toHost(gb), db, "conv2dBackwardWeight (bias)");
  }
}

// Bitwise: the pipeline's equivalence tests and recovery rely on it.
TEST_P(ConvTest, ResultsAreBitwiseTheSameWhateverTheThreadsAndTheBatch) {
  const ConvCase& p = GetParam();
  const auto x = randomVector(9, inCount()), w = randomVector(10, weightCount());
  const auto dy = randomVector(11, outCount()), bias = randomVector(12, p.oc);
  struct Run {
    std::vector<float> y, dx, dw, db;
  };
  auto run = [&](int threads, bool one_at_a_time) {
    cpu::CpuBackend be(cpu::CpuOptions{threads});
    const Tensor tx = toDevice(be, inShape(), x), tw = toDevice(be, weightShape(), w);
    const Tensor tdy = toDevice(be, outShape(), dy), tb = toDevice(be, {p.oc}, bias);
    Tensor y = be.empty(outShape()), dx = be.empty(inShape());
    Tensor dw = be.zeros(weightShape()), db = be.zeros({p.oc});
    if (!one_at_a_time) {
      be.conv2d(tx, tw, tb, window(), y);
      be.conv2dBackwardData(tdy, tw, window(), dx);
      be.conv2dBackwardWeight(tx, tdy, window(), dw, db);
    } else {  // each sample alone (fewer samples than threads: split inside the sample)
      for (int64_t s = 0; s < p.n; ++s) {
        be.conv2d(tx.slice(s, 1), tw, tb, window(), y.slice(s, 1));
        be.conv2dBackwardData(tdy.slice(s, 1), tw, window(), dx.slice(s, 1));
        // dw sums sample by sample: the batch's sum is the samples' added one by one
        be.conv2dBackwardWeight(tx.slice(s, 1), tdy.slice(s, 1), window(), dw, Tensor());
      }
      be.conv2dBackwardWeight(tx, tdy, window(), be.zeros(weightShape()), db);
    }
    return Run{toHost(y), toHost(dx), toHost(dw), toHost(db)};
  };
  const Run base = run(1, false);
  for (const auto& [threads, alone] :
       std::vector<std::pair<int, bool>>{{2, false}, {3, false}, {2, true}, {3, true}}) {
    const Run r = run(threads, alone);
    EXPECT_EQ(r.y, base.y) << threads << " threads, alone " << alone << ", " << p;
    EXPECT_EQ(r.dx, base.dx) << threads << " threads, alone " << alone << ", " << p;
    EXPECT_EQ(r.dw, base.dw) << threads << " threads, alone " << alone << ", " << p;
    EXPECT_EQ(r.db, base.db) << threads << " threads, alone " << alone << ", " << p;
  }
}

// The composed path (what OpenCL runs, on the CPU's primitives) computes the same sums.
TEST_P(ConvTest, TheComposedPathAgrees) {
  const ConvCase& p = GetParam();
  cpu::CpuBackend be(cpu::CpuOptions{2});
  const Tensor x = toDevice(be, inShape(), randomVector(13, inCount()));
  const Tensor w = toDevice(be, weightShape(), randomVector(14, weightCount()));
  const Tensor dy = toDevice(be, outShape(), randomVector(15, outCount()));
  const Tensor bias = toDevice(be, {p.oc}, randomVector(16, p.oc));
  Tensor y1 = be.empty(outShape()), y2 = be.empty(outShape());
  Tensor dx1 = be.empty(inShape()), dx2 = be.empty(inShape());
  Tensor dw1 = be.zeros(weightShape()), dw2 = be.zeros(weightShape());
  Tensor db1 = be.zeros({p.oc}), db2 = be.zeros({p.oc});
  be.conv2d(x, w, bias, window(), y1);
  backends::composedConv2d(be, "cpu", x, w, bias, window(), y2);
  be.conv2dBackwardData(dy, w, window(), dx1);
  backends::composedConv2dBackwardData(be, "cpu", dy, w, window(), dx2);
  be.conv2dBackwardWeight(x, dy, window(), dw1, db1);
  backends::composedConv2dBackwardWeight(be, "cpu", x, dy, window(), dw2, db2);
  auto close = [&](const Tensor& a, const Tensor& b, const char* what) {
    const auto va = toHost(a), vb = toHost(b);
    for (size_t i = 0; i < va.size(); ++i)
      ASSERT_NEAR(va[i], vb[i], 1e-4 * (1.0 + std::fabs(vb[i]))) << what << " " << i << ", " << p;
  };
  close(y1, y2, "conv2d");
  close(dx1, dx2, "conv2dBackwardData");
  close(dw1, dw2, "dw");
  close(db1, db2, "db");
}

TEST(ConvShapesTest, MismatchedTensorsAreRefusedNamingTheOp) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  const Window2d g{3, 8, 8, 3, 3, 1, 1, 1, 1};
  const Tensor x = be.zeros({2, 3, 8, 8}), y = be.zeros({2, 4, 8, 8});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        be.conv2d(x, be.zeros({4, 3, 3, 2}), Tensor(), g, y);
      },
      {"cpu conv2d", "weight [4, 3, 3, 2]", "expected [4, 3, 3, 3]"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        be.conv2d(x, be.zeros({4, 3, 3, 3}), be.zeros({5}), g, y);
      },
      {"cpu conv2d", "bias [5]"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        be.conv2d(x, be.zeros({4, 3, 3, 3}), Tensor(), g, be.zeros({2, 4, 7, 8}));
      },
      {"cpu conv2d", "output [2, 4, 7, 8]", "expected [2, 4, 8, 8]"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        be.conv2dBackwardData(y, be.zeros({4, 3, 3, 3}), g, be.zeros({2, 3, 8, 9}));
      },
      {"cpu conv2dBackwardData", "input [2, 3, 8, 9]"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        be.conv2dBackwardWeight(x, y, g, be.zeros({4, 3, 3, 3}, DType::kI32), Tensor());
      },
      {"cpu conv2dBackwardWeight", "f32"});
}

}  // namespace
}  // namespace tandem
