#include "core/tensor.h"

#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

TEST(ShapeTest, NumelBatchAndString) {
  const Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ(s.withBatch(5), (Shape{5, 2, 3, 4}));
  EXPECT_EQ(s.dropFirst(), (Shape{3, 4}));
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_EQ((Shape{0, 7}).numel(), 0);
}

TEST(ShapeTest, RejectsNegativeAndOverlongShapes) {
  EXPECT_THROW((Shape{2, -1}), InvalidArgument);
  EXPECT_THROW((Shape{1, 1, 1, 1, 1, 1, 1}), InvalidArgument);
  EXPECT_THROW(Shape{2}[3], InvalidArgument);
}

TEST(TensorTest, ViewsShareStorage) {
  cpu::CpuBackend be;
  Tensor t = toDevice(be, {4, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  Tensor rows = t.slice(1, 2);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(toHost(rows), (std::vector<float>{3, 4, 5, 6, 7, 8}));
  Tensor flat = rows.reshape({6});
  be.fill(flat.slice(0, 1), 42.0f);
  EXPECT_EQ(toHost(t)[3], 42.0f);
  EXPECT_EQ(toHost(t.head({2})), (std::vector<float>{0, 1}));
}

TEST(TensorTest, BadViewsAreErrors) {
  cpu::CpuBackend be;
  Tensor t = be.zeros({4, 3});
  testing::expectThrowWith<InvalidArgument>([&] { t.reshape({5, 3}); }, {"[4, 3]", "[5, 3]"});
  testing::expectThrowWith<InvalidArgument>([&] { t.slice(3, 2); }, {"[3, 5)", "[4, 3]"});
  EXPECT_THROW(t.head({13}), InvalidArgument);
  EXPECT_THROW(Tensor().backend(), InvalidArgument);
  EXPECT_THROW(Tensor(be.allocate(8), {3}, DType::kF32), InvalidArgument);
}

TEST(TensorTest, TensorsFromAnotherBackendAreRejected) {
  cpu::CpuBackend a, b;
  Tensor x = a.zeros({3});
  testing::expectThrowWith<InvalidArgument>([&] { b.fill(x, 1.0f); }, {"another backend"});
}

}  // namespace
}  // namespace tandem
