// Numbers in the options of the benchmarks that read their own (the others take Google
// Benchmark's flags): a value that is not a whole number in range is named with its
// option and the benchmark exits with status 2, rather than aborting on an exception,
// crashing on a count of zero, or running with what atoi made of it.
#pragma once

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::bench {

// `value`, given to `option` of `program`, as a whole number from `min` to `max`.
inline long long wholeNumber(std::string_view program, std::string_view option,
                             std::string_view value, long long min, long long max) {
  long long n = 0;
  const char* end = value.data() + value.size();
  const auto [stop, error] = std::from_chars(value.data(), end, n);
  if (error != std::errc() || stop != end || n < min || n > max) {
    std::fprintf(stderr, "%.*s: %.*s: expected a whole number from %lld to %lld, got '%.*s'\n",
                 static_cast<int>(program.size()), program.data(), static_cast<int>(option.size()),
                 option.data(), min, max, static_cast<int>(value.size()), value.data());
    std::exit(2);
  }
  return n;
}

// The arguments as (option, value) pairs. --help or -h anywhere prints `usage` to stdout
// and exits with status 0; an option without its value is named and the benchmark exits
// with status 2.
inline std::vector<std::pair<std::string_view, std::string_view>> optionPairs(
    std::string_view program, int argc, char** argv, std::string_view usage) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
      std::printf("%.*s", static_cast<int>(usage.size()), usage.data());
      std::exit(0);
    }
  std::vector<std::pair<std::string_view, std::string_view>> pairs;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 == argc) {
      std::fprintf(stderr, "%.*s: %s needs a value (--help lists the options)\n",
                   static_cast<int>(program.size()), program.data(), argv[i]);
      std::exit(2);
    }
    pairs.emplace_back(argv[i], argv[i + 1]);
  }
  return pairs;
}

// A comma-separated list of them ("1,16,64"), none left out.
inline std::vector<int> wholeNumbers(std::string_view program, std::string_view option,
                                     std::string_view list, int min, int max) {
  std::vector<int> numbers;
  for (size_t at = 0;;) {
    const size_t comma = list.find(',', at);
    const std::string_view item =
        list.substr(at, comma == std::string_view::npos ? comma : comma - at);
    numbers.push_back(static_cast<int>(wholeNumber(program, option, item, min, max)));
    if (comma == std::string_view::npos) return numbers;
    at = comma + 1;
  }
}

}  // namespace tandem::bench
