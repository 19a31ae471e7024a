// orderedGemm against the definition it promises: each element one chain of fused
// multiply-adds over k in order, from c's value or +0. Bitwise, with every tile kernel this
// CPU runs (the portable one always), on odd sizes (edge tiles), k past one packed block,
// transposed operands, 1 to 3 threads, and an element computed inside a larger product the
// same as alone.
#include "backends/cpu/ordered_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "tests/test_util.h"

namespace tandem {
namespace {

using cpu::MatrixView;
using testing::randomVector;

struct GemmCase {
  int64_t m, n, k;
  bool trans_a, trans_b, accumulate;
};

std::ostream& operator<<(std::ostream& os, const GemmCase& g) {
  return os << g.m << "x" << g.n << "x" << g.k << (g.trans_a ? " a^T" : "")
            << (g.trans_b ? " b^T" : "") << (g.accumulate ? " +=" : "");
}

// The chains, one element at a time.
std::vector<float> chains(const GemmCase& g, MatrixView a, MatrixView b, std::vector<float> c) {
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.n; ++j) {
      float acc = g.accumulate ? c[i * g.n + j] : 0.0f;
      for (int64_t kk = 0; kk < g.k; ++kk) acc = std::fma(a.at(i, kk), b.at(kk, j), acc);
      c[i * g.n + j] = acc;
    }
  return c;
}

bool sameBits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

class OrderedGemmTest : public ::testing::TestWithParam<GemmCase> {};

INSTANTIATE_TEST_SUITE_P(Shapes, OrderedGemmTest,
                         ::testing::Values(GemmCase{1, 1, 1, false, false, false},
                                           GemmCase{7, 13, 5, false, false, true},
                                           GemmCase{13, 7, 127, true, false, false},
                                           GemmCase{6, 16, 256, false, true, true},
                                           GemmCase{127, 33, 300, false, false, false},
                                           GemmCase{100, 530, 9, true, true, true},
                                           GemmCase{5, 1, 600, true, false, true},
                                           GemmCase{3, 4, 0, false, false, false}));

TEST_P(OrderedGemmTest, EveryElementIsOneChainOfFusedMultiplyAdds) {
  const GemmCase& g = GetParam();
  const auto av = randomVector(1, g.m * g.k), bv = randomVector(2, g.k * g.n);
  const auto start = randomVector(3, g.m * g.n);
  const MatrixView a{av.data(), g.trans_a ? g.m : g.k, g.trans_a};
  const MatrixView b{bv.data(), g.trans_b ? g.k : g.n, g.trans_b};
  const std::vector<float> want = chains(g, a, b, start);
  for (cpu::TileIsa isa : cpu::tileIsas())
    for (int threads : {1, 2, 3}) {
      cpu::ThreadPool pool(threads);
      std::vector<float> c = start;
      cpu::orderedGemm(pool, g.m, g.n, g.k, a, b, g.accumulate, c.data(), g.n, isa);
      EXPECT_TRUE(sameBits(c, want))
          << g << ", " << cpu::tileIsaName(isa) << ", " << threads << " threads";
    }
}

TEST_P(OrderedGemmTest, AChainCutAtAnyKContinuesExactly) {
  const GemmCase& g = GetParam();
  const auto av = randomVector(4, g.m * g.k), bv = randomVector(5, g.k * g.n);
  const MatrixView a{av.data(), g.trans_a ? g.m : g.k, g.trans_a};
  const MatrixView b{bv.data(), g.trans_b ? g.k : g.n, g.trans_b};
  cpu::ThreadPool pool(2);
  std::vector<float> whole(static_cast<size_t>(g.m * g.n)), halves = whole;
  cpu::orderedGemm(pool, g.m, g.n, g.k, a, b, false, whole.data(), g.n);
  const int64_t cut = (g.k + 1) / 2;  // k 0 and 1: an empty part, a no-op
  // The first `cut` columns of a and rows of b, then the rest.
  auto from = [](MatrixView v, int64_t r, int64_t c) {
    return MatrixView{&v.p[v.trans ? c * v.ld + r : r * v.ld + c], v.ld, v.trans};
  };
  cpu::orderedGemm(pool, g.m, g.n, cut, a, b, false, halves.data(), g.n);
  cpu::orderedGemm(pool, g.m, g.n, g.k - cut, from(a, 0, cut), from(b, cut, 0), true, halves.data(),
                   g.n);
  EXPECT_TRUE(sameBits(halves, whole)) << g << " cut at " << cut;
}

TEST(OrderedGemmPlaceTest, AnElementIsTheSameAloneAndInsideALargerProduct) {
  const int64_t m = 50, n = 70, k = 333;
  const auto av = randomVector(6, m * k), bv = randomVector(7, k * n);
  cpu::ThreadPool pool(2);
  std::vector<float> all(static_cast<size_t>(m * n));
  cpu::orderedGemm(pool, m, n, k, MatrixView{av.data(), k, false}, MatrixView{bv.data(), n, false},
                   false, all.data(), n);
  for (const auto& [i, j] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {7, 17}, {49, 69}, {13, 64}}) {
    float one = 0;
    cpu::orderedGemm(pool, 1, 1, k, MatrixView{av.data() + i * k, k, false},
                     MatrixView{bv.data() + j, n, false}, false, &one, 1);
    EXPECT_EQ(std::memcmp(&one, &all[static_cast<size_t>(i * n + j)], sizeof(float)), 0)
        << "element " << i << ", " << j;
  }
}

}  // namespace
}  // namespace tandem
