#include "core/pipeline/group.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {

std::string_view reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMean:
      return "mean";
    case ReduceOp::kMax:
      return "max";
  }
  return "invalid";
}

Slice sliceOf(size_t count, int size, int rank) {
  TANDEM_CHECK_MSG(size >= 1 && rank >= 0 && rank < size, InvalidArgument,
                   "slice of rank " << rank << " in a group of " << size);
  const auto n = static_cast<size_t>(size), r = static_cast<size_t>(rank);
  const size_t base = count / n, extra = count % n;
  const size_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

void accumulate(std::span<float> acc, std::span<const float> x, ReduceOp op) {
  TANDEM_CHECK_MSG(acc.size() == x.size(), InvalidArgument,
                   "accumulate " << x.size() << " values into " << acc.size());
  float* a = acc.data();
  const float* b = x.data();
  const size_t n = acc.size();
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < n; ++i) a[i] = std::max(a[i], b[i]);
  } else {
    for (size_t i = 0; i < n; ++i) a[i] += b[i];
  }
}

void finishReduce(std::span<float> acc, ReduceOp op, int ranks) {
  if (op != ReduceOp::kMean || ranks == 1) return;
  const auto n = static_cast<float>(ranks);
  for (float& v : acc) v = v / n;
}

}  // namespace tandem
