#include "core/comm/group.h"

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

}  // namespace tandem
