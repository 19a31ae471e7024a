#include "core/backend.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace tandem {

int64_t convColumnChunk(const Window2d& g, int64_t out_channels, int64_t n) {
  constexpr int64_t kColumnBudget = int64_t{1} << 20;  // elements: 4 MiB of f32
  const int64_t per_sample =
      std::max(g.channels * g.kernel_h * g.kernel_w, out_channels) * g.outHeight() * g.outWidth();
  return std::clamp<int64_t>(kColumnBudget / std::max<int64_t>(per_sample, 1), 1,
                             std::max<int64_t>(n, 1));
}

int64_t convWeightGradGroup(const Window2d& g, int64_t out_channels, int64_t chunk) {
  const int64_t fit = chunk * g.outHeight() * g.outWidth() / std::max<int64_t>(out_channels, 1);
  const int64_t group = std::min(fit, chunk);
  return group >= 2 ? group : 0;
}

Tensor Backend::empty(const Shape& shape, DType dtype) {
  try {
    return Tensor(allocate(static_cast<size_t>(shape.numel()) * dtypeSize(dtype)), shape, dtype);
  } catch (const DeviceError& e) {  // out of device memory: say which tensor asked
    std::ostringstream os;
    os << "tensor " << shape << " " << dtypeName(dtype) << ": " << e.what();
    throw DeviceError(os.str());
  }
}

std::vector<OpUse> Backend::lacking(const std::vector<OpUse>& uses) const {
  std::vector<OpUse> out;
  for (const OpUse& u : uses)
    if (!supports(u.op, u.dtype)) out.push_back(u);
  return out;
}

Tensor Backend::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  fill(t, 0.0f);
  return t;
}

Tensor toDevice(Backend& backend, const Shape& shape, const std::vector<float>& values) {
  TANDEM_CHECK_MSG(static_cast<int64_t>(values.size()) == shape.numel(), InvalidArgument,
                   values.size() << " values for a tensor of shape " << shape);
  Tensor t = backend.empty(shape, DType::kF32);
  backend.upload(t, values.data());
  return t;
}

Tensor toDeviceI32(Backend& backend, const Shape& shape, const std::vector<int32_t>& values) {
  TANDEM_CHECK_MSG(static_cast<int64_t>(values.size()) == shape.numel(), InvalidArgument,
                   values.size() << " values for a tensor of shape " << shape);
  Tensor t = backend.empty(shape, DType::kI32);
  backend.upload(t, values.data());
  return t;
}

std::vector<float> toHost(const Tensor& t) {
  TANDEM_CHECK_MSG(t.dtype() == DType::kF32, InvalidArgument,
                   "toHost expects f32, got " << dtypeName(t.dtype()));
  std::vector<float> out(static_cast<size_t>(t.numel()));
  t.backend().download(t, out.data());
  return out;
}

std::vector<int32_t> toHostI32(const Tensor& t) {
  TANDEM_CHECK_MSG(t.dtype() == DType::kI32, InvalidArgument,
                   "toHostI32 expects i32, got " << dtypeName(t.dtype()));
  std::vector<int32_t> out(static_cast<size_t>(t.numel()));
  t.backend().download(t, out.data());
  return out;
}

}  // namespace tandem
