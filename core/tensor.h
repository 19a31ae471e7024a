// Tensor: a shape and dtype over a region of a Storage owned by a Backend.
//
// Tensors are cheap handles: copies share the storage (shared_ptr), and reshape/slice
// make views. The element offset lets a view start inside its storage; backends add it
// to their base address. Data moves between host and device only through Backend.
#pragma once

#include <cstddef>
#include <memory>

#include "core/dtype.h"
#include "core/shape.h"

namespace tandem {

class Backend;

// A block of memory owned by one backend. Backends derive from it and free the memory
// in their destructor; a Storage must not outlive its Backend.
class Storage {
 public:
  Storage(Backend* owner, size_t bytes) : owner_(owner), bytes_(bytes) {}
  virtual ~Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  Backend& backend() const { return *owner_; }
  size_t bytes() const { return bytes_; }

 private:
  Backend* owner_;
  size_t bytes_;
};

class Tensor {
 public:
  Tensor() = default;
  // Throws InvalidArgument if shape, dtype and offset do not fit in the storage.
  Tensor(std::shared_ptr<Storage> storage, Shape shape, DType dtype, int64_t offset = 0);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return shape_.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtypeSize(dtype_); }
  // Offset of the first element inside the storage, in elements of dtype().
  int64_t offset() const { return offset_; }
  Storage* storage() const { return storage_.get(); }
  Backend& backend() const;

  // A view with another shape of the same element count.
  Tensor reshape(const Shape& shape) const;
  // A view of the first shape.numel() elements with `shape` (a scratch buffer reused
  // for smaller sizes).
  Tensor head(const Shape& shape) const;
  // Rows [start, start + count) along the first dimension.
  Tensor slice(int64_t start, int64_t count) const;

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::kF32;
  int64_t offset_ = 0;
};

}  // namespace tandem
