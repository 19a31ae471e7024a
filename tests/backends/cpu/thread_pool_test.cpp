#include "backends/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

namespace tandem::cpu {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 3, 7, 1000, 100003}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallelFor(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (const auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPoolTest, RangesAreTheSameEveryCall) {
  ThreadPool pool(3);
  auto ranges = [&] {
    std::vector<std::pair<int64_t, int64_t>> r(3, {-1, -1});
    std::atomic<int> k{0};
    pool.parallelFor(100, 10, [&](int64_t b, int64_t e) { r[static_cast<size_t>(k++)] = {b, e}; });
    std::sort(r.begin(), r.end());
    return r;
  };
  EXPECT_EQ(ranges(), ranges());
}

TEST(ThreadPoolTest, ExceptionsReachTheCallerAndThePoolSurvives) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallelFor(300, 1,
                                [](int64_t b, int64_t) {
                                  if (b > 0) throw std::runtime_error("range failed");
                                }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  pool.parallelFor(10, 1, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 10);
}

TEST(ThreadPoolTest, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.parallelFor(4, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallelFor(5, 1, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
  });
  EXPECT_EQ(total.load(), 20);
}

}  // namespace
}  // namespace tandem::cpu
