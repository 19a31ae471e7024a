// im2col/col2im, transpose01, pooling and depthwise convolution against naive loops, over
// odd sizes, strides and paddings.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::randomVector;

struct WindowCase {
  int64_t n, c, h, w, kh, kw, stride, pad;
};

class SpatialTest : public ::testing::TestWithParam<WindowCase> {
 protected:
  Window2d window() const {
    const WindowCase& p = GetParam();
    return Window2d{p.c, p.h, p.w, p.kh, p.kw, p.stride, p.stride, p.pad, p.pad};
  }
  cpu::CpuBackend be_{cpu::CpuOptions{3}};
};

INSTANTIATE_TEST_SUITE_P(
    Windows, SpatialTest,
    ::testing::Values(WindowCase{1, 1, 1, 1, 1, 1, 1, 0}, WindowCase{2, 3, 7, 7, 3, 3, 1, 1},
                      WindowCase{3, 2, 13, 7, 3, 2, 2, 1}, WindowCase{1, 5, 13, 13, 2, 2, 2, 0},
                      WindowCase{3, 4, 8, 10, 2, 2, 2, 0}, WindowCase{2, 1, 127, 3, 3, 3, 1, 1},
                      WindowCase{4, 13, 7, 9, 3, 3, 2, 1}, WindowCase{2, 7, 13, 1, 1, 1, 1, 0},
                      WindowCase{3, 6, 5, 6, 5, 5, 1, 2}));

TEST_P(SpatialTest, Im2colMatchesNaiveGather) {
  const Window2d g = window();
  const int64_t n = GetParam().n, oh = g.outHeight(), ow = g.outWidth();
  const auto x = randomVector(1, n * g.channels * g.height * g.width);
  const int64_t rows = g.channels * g.kernel_h * g.kernel_w;
  Tensor col = be_.empty({rows, n * oh * ow});
  be_.im2col(toDevice(be_, {n, g.channels, g.height, g.width}, x), g, col);
  const auto c = toHost(col);
  for (int64_t ch = 0; ch < g.channels; ++ch)
    for (int64_t ki = 0; ki < g.kernel_h; ++ki)
      for (int64_t kj = 0; kj < g.kernel_w; ++kj)
        for (int64_t s = 0; s < n; ++s)
          for (int64_t oy = 0; oy < oh; ++oy)
            for (int64_t ox = 0; ox < ow; ++ox) {
              const int64_t iy = oy * g.stride_h - g.pad_h + ki,
                            ix = ox * g.stride_w - g.pad_w + kj;
              const float want = iy < 0 || iy >= g.height || ix < 0 || ix >= g.width
                                     ? 0.0f
                                     : x[((s * g.channels + ch) * g.height + iy) * g.width + ix];
              const int64_t row = (ch * g.kernel_h + ki) * g.kernel_w + kj;
              ASSERT_EQ(c[row * n * oh * ow + s * oh * ow + oy * ow + ox], want);
            }
}

TEST_P(SpatialTest, Col2imIsTheAdjointOfIm2col) {
  // <im2col(x), c> == <x, col2im(c)> for random x and c.
  const Window2d g = window();
  const int64_t n = GetParam().n, cols = n * g.outHeight() * g.outWidth();
  const int64_t rows = g.channels * g.kernel_h * g.kernel_w;
  const Shape xs{n, g.channels, g.height, g.width};
  Tensor x = toDevice(be_, xs, randomVector(2, xs.numel()));
  Tensor c = toDevice(be_, {rows, cols}, randomVector(3, rows * cols));
  Tensor ix = be_.empty({rows, cols}), cx = be_.empty(xs);
  be_.im2col(x, g, ix);
  be_.col2im(c, g, cx);
  const double lhs = be_.dot(ix, c), rhs = be_.dot(x, cx);
  EXPECT_NEAR(lhs, rhs, 1e-4 * (1 + std::abs(lhs)));
}

// Depthwise convolution (w [C, kh, kw]) and both gradients against sums in double; the
// same bits whatever the threads, and a weight gradient accumulated over two halves of a
// batch the same as over the whole batch in one call (sample by sample).
TEST_P(SpatialTest, DepthwiseConvolutionMatchesNaiveSums) {
  const Window2d g = window();
  const int64_t n = GetParam().n, c = g.channels, oh = g.outHeight(), ow = g.outWidth();
  const int64_t taps = g.kernel_h * g.kernel_w;
  const Shape xs{n, c, g.height, g.width}, ys{n, c, oh, ow};
  const auto x = randomVector(11, xs.numel()), w = randomVector(12, c * taps),
             dy = randomVector(13, ys.numel());
  std::vector<double> y(static_cast<size_t>(ys.numel())), dx(static_cast<size_t>(xs.numel())),
      dw(static_cast<size_t>(c * taps));
  std::vector<double> y_abs(y.size()), dx_abs(dx.size()), dw_abs(dw.size());
  for (int64_t s = 0; s < n; ++s)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox)
          for (int64_t ki = 0; ki < g.kernel_h; ++ki)
            for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
              const int64_t iy = oy * g.stride_h - g.pad_h + ki,
                            ix = ox * g.stride_w - g.pad_w + kj;
              if (iy < 0 || iy >= g.height || ix < 0 || ix >= g.width) continue;
              const auto xi = static_cast<size_t>(((s * c + ch) * g.height + iy) * g.width + ix);
              const auto yi = static_cast<size_t>(((s * c + ch) * oh + oy) * ow + ox);
              const auto wi = static_cast<size_t>(ch * taps + ki * g.kernel_w + kj);
              y[yi] += double(w[wi]) * x[xi], y_abs[yi] += std::fabs(double(w[wi]) * x[xi]);
              dx[xi] += double(w[wi]) * dy[yi], dx_abs[xi] += std::fabs(double(w[wi]) * dy[yi]);
              dw[wi] += double(x[xi]) * dy[yi], dw_abs[wi] += std::fabs(double(x[xi]) * dy[yi]);
            }
  const auto expectNear = [](const std::vector<float>& got, const std::vector<double>& want,
                             const std::vector<double>& scale, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + scale[i])) << what << " " << i;
  };
  const auto run = [&](cpu::CpuBackend& be) {
    Tensor xt = toDevice(be, xs, x), wt = toDevice(be, {c, 1, g.kernel_h, g.kernel_w}, w);
    Tensor dyt = toDevice(be, ys, dy);
    Tensor yt = be.empty(ys), dxt = be.empty(xs), dwt = be.zeros({c, 1, g.kernel_h, g.kernel_w});
    be.depthwiseConv2d(xt, wt, g, yt);
    be.depthwiseConv2dBackwardData(dyt, wt, g, dxt);
    be.depthwiseConv2dBackwardWeight(xt, dyt, g, dwt);
    return std::vector<std::vector<float>>{toHost(yt), toHost(dxt), toHost(dwt)};
  };
  const auto got = run(be_);
  expectNear(got[0], y, y_abs, "output");
  expectNear(got[1], dx, dx_abs, "input gradient");
  expectNear(got[2], dw, dw_abs, "weight gradient");
  cpu::CpuBackend one(cpu::CpuOptions{1});
  EXPECT_TRUE(run(one) == got) << "1 thread against 3";
  if (n > 1) {  // the batch's halves into one gradient
    const int64_t half = n / 2;
    Tensor xt = toDevice(be_, xs, x), dyt = toDevice(be_, ys, dy);
    Tensor dwt = be_.zeros({c, 1, g.kernel_h, g.kernel_w});
    be_.depthwiseConv2dBackwardWeight(xt.slice(0, half), dyt.slice(0, half), g, dwt);
    be_.depthwiseConv2dBackwardWeight(xt.slice(half, n - half), dyt.slice(half, n - half), g, dwt);
    EXPECT_TRUE(toHost(dwt) == got[2]) << "halves against the whole batch";
  }
  // A weight that does not fit is refused, naming the op.
  Tensor bad = be_.empty({c + 1, 1, g.kernel_h, g.kernel_w});
  testing::expectThrowWith<InvalidArgument>(
      [&] { be_.depthwiseConv2d(toDevice(be_, xs, x), bad, g, be_.empty(ys)); },
      {"cpu depthwiseConv2d: weight"});
}

TEST_P(SpatialTest, PoolingMatchesNaive) {
  const Window2d g = window();
  ASSERT_TRUE(2 * g.pad_h <= g.kernel_h && 2 * g.pad_w <= g.kernel_w)
      << "pooling needs pad <= kernel / 2";
  const int64_t n = GetParam().n, oh = g.outHeight(), ow = g.outWidth();
  const Shape xs{n, g.channels, g.height, g.width}, ys{n, g.channels, oh, ow};
  const auto x = randomVector(4, xs.numel());
  Tensor xt = toDevice(be_, xs, x), ymax = be_.empty(ys), arg = be_.empty(ys, DType::kI32),
         yavg = be_.empty(ys);
  be_.maxPool(xt, g, ymax, arg);
  be_.avgPool(xt, g, yavg);
  const auto mx = toHost(ymax), av = toHost(yavg);
  const auto dy = randomVector(5, ys.numel());
  Tensor dmax = be_.empty(xs), davg = be_.empty(xs);
  be_.maxPoolBackward(toDevice(be_, ys, dy), arg, g, dmax);
  be_.avgPoolBackward(toDevice(be_, ys, dy), g, davg);
  std::vector<double> want_dmax(x.size(), 0.0), want_davg(x.size(), 0.0);
  for (int64_t p = 0; p < n * g.channels; ++p)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox) {
        float best = -std::numeric_limits<float>::infinity();
        int64_t at = -1;
        double sum = 0;
        const int64_t out = (p * oh + oy) * ow + ox;
        for (int64_t ki = 0; ki < g.kernel_h; ++ki)
          for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
            const int64_t iy = oy * g.stride_h - g.pad_h + ki, ix = ox * g.stride_w - g.pad_w + kj;
            if (iy < 0 || iy >= g.height || ix < 0 || ix >= g.width) continue;
            const int64_t idx = (p * g.height + iy) * g.width + ix;
            if (x[idx] > best) best = x[idx], at = idx;
            sum += x[idx];
            want_davg[idx] += dy[out] / static_cast<double>(g.kernel_h * g.kernel_w);
          }
        ASSERT_EQ(mx[out], best);
        want_dmax[at] += dy[out];
        EXPECT_NEAR(av[out], sum / (g.kernel_h * g.kernel_w), 1e-6);
      }
  const auto gm = toHost(dmax), ga = toHost(davg);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(gm[i], want_dmax[i], 1e-6);
    EXPECT_NEAR(ga[i], want_davg[i], 1e-6);
  }
}

// Ceil mode: PyTorch's output sizes (a last window where input is left over, if it starts
// inside the input or its left padding) and each window's maximum over its cells inside
// the input, on the 2x2 stride-2 kernel (whose fast path must then not run) and others.
TEST(SpatialOpsTest, MaxPoolInCeilModeAddsPartialWindows) {
  cpu::CpuBackend be(cpu::CpuOptions{2});
  struct Case {
    int64_t h, w, k, s, p, oh, ow;
  };
  // (torch.nn.MaxPool2d(k, s, p, ceil_mode=True) on [1, 1, h, w] gives [oh, ow].)
  for (const Case c : {Case{7, 5, 2, 2, 0, 4, 3}, Case{13, 13, 3, 2, 0, 6, 6},
                       Case{6, 6, 3, 2, 1, 4, 4}, Case{5, 8, 3, 3, 1, 2, 3}}) {
    Window2d g{2, c.h, c.w, c.k, c.k, c.s, c.s, c.p, c.p};
    g.ceil = true;
    ASSERT_EQ(g.outHeight(), c.oh) << c.h << "x" << c.w;
    ASSERT_EQ(g.outWidth(), c.ow) << c.h << "x" << c.w;
    const Shape xs{1, 2, c.h, c.w}, ys{1, 2, c.oh, c.ow};
    const auto x = randomVector(30, xs.numel());
    Tensor y = be.empty(ys), arg = be.empty(ys, DType::kI32);
    be.maxPool(toDevice(be, xs, x), g, y, arg);
    const auto got = toHost(y);
    for (int64_t ch = 0; ch < 2; ++ch)
      for (int64_t oy = 0; oy < c.oh; ++oy)
        for (int64_t ox = 0; ox < c.ow; ++ox) {
          float best = -std::numeric_limits<float>::infinity();
          for (int64_t iy = std::max<int64_t>(0, oy * c.s - c.p);
               iy < std::min(c.h, oy * c.s - c.p + c.k); ++iy)
            for (int64_t ix = std::max<int64_t>(0, ox * c.s - c.p);
                 ix < std::min(c.w, ox * c.s - c.p + c.k); ++ix)
              best = std::max(best, x[static_cast<size_t>((ch * c.h + iy) * c.w + ix)]);
          ASSERT_EQ(got[static_cast<size_t>((ch * c.oh + oy) * c.ow + ox)], best)
              << c.h << "x" << c.w << " at " << oy << ", " << ox;
        }
  }
}

// Max pooling's gradient goes to a window's first maximum in (row, column) order, on the
// 2x2 stride-2 kernel and on the general one alike.
TEST(SpatialOpsTest, MaxPoolRoutesTiesToTheFirstMaximum) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  for (const int64_t stride : {2, 1}) {
    const Window2d g{1, 4, 4, 2, 2, stride, stride, 0, 0};
    const int64_t oh = g.outHeight(), ow = g.outWidth();
    // Window (0, 0) ties at its last three cells; (0, 1) at its two bottom ones.
    const std::vector<float> x = {0, 5, 1, 0,  //
                                  5, 5, 7, 7,  //
                                  1, 1, 1, 1,  //
                                  1, 1, 1, 1};
    Tensor y = be.empty({1, 1, oh, ow}), arg = be.empty({1, 1, oh, ow}, DType::kI32);
    be.maxPool(toDevice(be, {1, 1, 4, 4}, x), g, y, arg);
    const auto a = toHostI32(arg);
    EXPECT_EQ(a[0], 1) << "stride " << stride;
    EXPECT_EQ(a[1], 6) << "stride " << stride;
    EXPECT_EQ(a[static_cast<size_t>(ow)], stride == 2 ? 8 : 4) << "stride " << stride;
  }
}

TEST(SpatialOpsTest, Transpose01SwapsTheFirstTwoDimensions) {
  cpu::CpuBackend be(cpu::CpuOptions{2});
  for (int64_t a : {1, 7, 13}) {
    const int64_t b = 5, r = 3;
    const auto x = randomVector(6, a * b * r);
    Tensor dst = be.empty({b, a, r});
    be.transpose01(toDevice(be, {a, b, r}, x), dst);
    const auto y = toHost(dst);
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < b; ++j)
        for (int64_t k = 0; k < r; ++k) ASSERT_EQ(y[(j * a + i) * r + k], x[(i * b + j) * r + k]);
  }
  EXPECT_THROW(be.transpose01(be.zeros({2, 3, 4}), be.zeros({2, 3, 4})), InvalidArgument);
}

TEST(SpatialOpsTest, ShapeMismatchesAreErrors) {
  cpu::CpuBackend be;
  const Window2d g{2, 5, 5, 3, 3, 1, 1, 0, 0};
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        be.im2col(be.zeros({1, 3, 5, 5}), g, be.zeros({18, 9}));
      },
      {"im2col", "[1, 3, 5, 5]"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        be.im2col(be.zeros({1, 2, 5, 5}), g, be.zeros({18, 10}));
      },
      {"col [18, 10]", "expected [18, 9]"});
  // An argmax that is not the pooled shape would be read past its end.
  const Window2d pool{2, 4, 4, 2, 2, 2, 2, 0, 0};
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        be.maxPoolBackward(be.zeros({1, 2, 2, 2}), be.zeros({1, 2, 2, 1}, DType::kI32), pool,
                           be.zeros({1, 2, 4, 4}));
      },
      {"cpu maxPoolBackward: argmax [1, 2, 2, 1] vs pooled [1, 2, 2, 2]"});
}

}  // namespace
}  // namespace tandem
