#include "benchmarks/bench_args.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

// An argument list as main() gets it; the words live as long as it does.
struct Argv {
  std::vector<std::string> words;
  std::vector<char*> pointers;
  explicit Argv(std::vector<std::string> w) : words(std::move(w)) {
    for (std::string& word : words) pointers.push_back(word.data());
  }
  auto pairs() {
    return optionPairs("bench", static_cast<int>(pointers.size()), pointers.data(),
                       "usage: bench\n");
  }
};

// The (option, value) pairs of an argument list; --help or -h anywhere prints the usage
// and exits with 0; an option left without its value is named and exits with 2.
TEST(BenchArgsTest, ArgumentsComeInPairsAndHelpPrintsTheUsage) {
  using Pairs = std::vector<std::pair<std::string_view, std::string_view>>;
  EXPECT_EQ(Argv({"bench"}).pairs(), Pairs{});
  Argv two({"bench", "--iters", "7", "--ranks", "2,4"});
  EXPECT_EQ(two.pairs(), (Pairs{{"--iters", "7"}, {"--ranks", "2,4"}}));
  EXPECT_EXIT(Argv({"bench", "--iters", "7", "--help"}).pairs(), ExitedWithCode(0), "");
  EXPECT_EXIT(Argv({"bench", "-h"}).pairs(), ExitedWithCode(0), "");
  EXPECT_EXIT(Argv({"bench", "--iters", "7", "--ranks"}).pairs(), ExitedWithCode(2),
              "bench: --ranks needs a value \\(--help lists the options\\)");
}

}  // namespace
}  // namespace tandem::bench
