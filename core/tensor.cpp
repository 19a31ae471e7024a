#include "core/tensor.h"

#include <utility>

#include "core/error.h"

namespace tandem {

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, DType dtype, int64_t offset)
    : storage_(std::move(storage)), shape_(shape), dtype_(dtype), offset_(offset) {
  TANDEM_CHECK_MSG(storage_ != nullptr, InvalidArgument, "tensor " << shape << " without storage");
  TANDEM_CHECK_MSG(offset >= 0, InvalidArgument, "negative tensor offset " << offset);
  const size_t end =
      (static_cast<size_t>(offset) + static_cast<size_t>(shape.numel())) * dtypeSize(dtype);
  TANDEM_CHECK_MSG(end <= storage_->bytes(), InvalidArgument,
                   "tensor " << shape << " " << dtypeName(dtype) << " at offset " << offset
                             << " needs " << end << " bytes but its storage has "
                             << storage_->bytes());
}

Backend& Tensor::backend() const {
  TANDEM_CHECK_MSG(defined(), InvalidArgument, "use of an undefined tensor");
  return storage_->backend();
}

Tensor Tensor::reshape(const Shape& shape) const {
  TANDEM_CHECK_MSG(shape.numel() == numel(), InvalidArgument,
                   "cannot reshape " << shape_ << " to " << shape << " (element counts differ)");
  return Tensor(storage_, shape, dtype_, offset_);
}

Tensor Tensor::head(const Shape& shape) const {
  TANDEM_CHECK_MSG(shape.numel() <= numel(), InvalidArgument,
                   "view " << shape << " is larger than tensor " << shape_);
  return Tensor(storage_, shape, dtype_, offset_);
}

Tensor Tensor::slice(int64_t start, int64_t count) const {
  TANDEM_CHECK_MSG(shape_.rank() > 0 && start >= 0 && count >= 0 && start + count <= shape_[0],
                   InvalidArgument,
                   "slice [" << start << ", " << start + count << ") out of range for " << shape_);
  Shape s = shape_;
  s[0] = count;
  const int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  return Tensor(storage_, s, dtype_, offset_ + start * row);
}

}  // namespace tandem
