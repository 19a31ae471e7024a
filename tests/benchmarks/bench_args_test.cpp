#include "benchmarks/bench_args.h"

#include <gtest/gtest.h>

namespace tandem::bench {
namespace {

using ::testing::ExitedWithCode;

TEST(BenchArgsTest, WholeNumbersInRangeAreRead) {
  EXPECT_EQ(wholeNumber("b", "--iters", "7", 1, 10), 7);
  EXPECT_EQ(wholeNumber("b", "--spin-us", "-1", -1, 10), -1);
  EXPECT_EQ(wholeNumber("b", "--count", "17179869184", 0, 1LL << 34), 1LL << 34);
  EXPECT_EQ(wholeNumbers("b", "--sizes-mib", "1,16,64", 1, 64), (std::vector<int>{1, 16, 64}));
  EXPECT_EQ(wholeNumbers("b", "--ranks", "3", 2, 64), (std::vector<int>{3}));
}

TEST(BenchArgsTest, AnythingElseIsNamedWithItsOptionAndExitsWithTwo) {
  EXPECT_EXIT(wholeNumber("bench", "--iters", "abc", 1, 10), ExitedWithCode(2),
              "bench: --iters: expected a whole number from 1 to 10, got 'abc'");
  EXPECT_EXIT(wholeNumber("bench", "--iters", "12abc", 1, 100), ExitedWithCode(2), "got '12abc'");
  EXPECT_EXIT(wholeNumber("bench", "--iters", "", 1, 10), ExitedWithCode(2), "got ''");
  EXPECT_EXIT(wholeNumber("bench", "--iters", "0", 1, 10), ExitedWithCode(2), "got '0'");
  EXPECT_EXIT(wholeNumber("bench", "--iters", "11", 1, 10), ExitedWithCode(2), "got '11'");
  EXPECT_EXIT(wholeNumber("bench", "--iters", "99999999999999999999", 1, 10), ExitedWithCode(2),
              "got '99999999999999999999'");
  EXPECT_EXIT(wholeNumbers("bench", "--ranks", "2,,4", 2, 64), ExitedWithCode(2),
              "bench: --ranks: .* got ''");
  EXPECT_EXIT(wholeNumbers("bench", "--ranks", "2,1", 2, 64), ExitedWithCode(2), "got '1'");
  EXPECT_EXIT(wholeNumbers("bench", "--ranks", "2,", 2, 64), ExitedWithCode(2), "got ''");
}

}  // namespace
}  // namespace tandem::bench
