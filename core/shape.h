// Tensor shapes: up to kMaxRank dimensions, row-major (the last dimension is contiguous).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

namespace tandem {

class Shape {
 public:
  static constexpr int kMaxRank = 6;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const;
  int64_t& operator[](int i);
  // Number of elements; 1 for a rank-0 shape.
  int64_t numel() const;
  std::vector<int64_t> dims() const { return {dims_.begin(), dims_.begin() + rank_}; }

  // This shape with `n` prepended (a batch of per-sample shapes).
  Shape withBatch(int64_t n) const;
  // This shape without its first dimension (a per-sample shape).
  Shape dropFirst() const;

  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  // "[2, 3, 4]"

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

std::ostream& operator<<(std::ostream& os, const Shape& s);

}  // namespace tandem
