#include "core/shape.h"

#include <ostream>

#include "core/error.h"

namespace tandem {

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  TANDEM_CHECK_MSG(dims.size() <= static_cast<size_t>(kMaxRank), InvalidArgument,
                   "shape of rank " << dims.size() << " exceeds the maximum rank " << kMaxRank);
  for (int64_t d : dims) {
    TANDEM_CHECK_MSG(d >= 0, InvalidArgument, "negative dimension " << d << " in a shape");
    dims_[rank_++] = d;
  }
}

int64_t Shape::operator[](int i) const {
  TANDEM_CHECK_MSG(i >= 0 && i < rank_, InvalidArgument,
                   "dimension index " << i << " out of range for shape " << str());
  return dims_[i];
}

int64_t& Shape::operator[](int i) {
  TANDEM_CHECK_MSG(i >= 0 && i < rank_, InvalidArgument,
                   "dimension index " << i << " out of range for shape " << str());
  return dims_[i];
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) {
    TANDEM_CHECK_MSG(!__builtin_mul_overflow(n, dims_[i], &n), InvalidArgument,
                     "shape " << str() << " has more elements than fit in 64 bits");
  }
  return n;
}

Shape Shape::withBatch(int64_t n) const {
  TANDEM_CHECK_MSG(rank_ < kMaxRank, InvalidArgument, "cannot add a batch dimension to " << str());
  Shape s;
  s.rank_ = rank_ + 1;
  s.dims_[0] = n;
  for (int i = 0; i < rank_; ++i) s.dims_[i + 1] = dims_[i];
  return s;
}

Shape Shape::dropFirst() const {
  TANDEM_CHECK_MSG(rank_ > 0, InvalidArgument, "cannot drop a dimension of a rank-0 shape");
  Shape s;
  s.rank_ = rank_ - 1;
  for (int i = 1; i < rank_; ++i) s.dims_[i - 1] = dims_[i];
  return s;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

}  // namespace tandem
