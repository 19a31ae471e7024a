#include "backends/op_checks.h"

#include "core/error.h"

namespace tandem::backends {

void checkSameCount(const Tensor& a, const Tensor& b, std::string_view device, const char* op) {
  TANDEM_CHECK_MSG(
      a.numel() == b.numel(), InvalidArgument,
      device << " " << op << ": element counts differ, " << a.shape() << " vs " << b.shape());
}

ChannelView channelView(const Tensor& y, int64_t channels, std::string_view device,
                        const char* op) {
  const Shape& s = y.shape();
  TANDEM_CHECK_MSG(s.rank() >= 2 && s[1] == channels, InvalidArgument,
                   device << " " << op << ": tensor " << s << " does not have " << channels
                          << " channels in dimension 1");
  return {s[0], channels, s[0] * channels == 0 ? 0 : y.numel() / (s[0] * channels)};
}

int64_t rowsOf(const Tensor& x, int64_t d, std::string_view device, const char* op) {
  TANDEM_CHECK_MSG(d > 0 && x.shape().rank() >= 1 && x.shape()[x.shape().rank() - 1] == d,
                   InvalidArgument,
                   device << " " << op << ": last dimension of " << x.shape() << " is not " << d);
  return x.numel() / d;
}

void checkWindowInput(const Tensor& x, const Window2d& g, std::string_view device, const char* op) {
  const Shape& s = x.shape();
  TANDEM_CHECK_MSG(s.rank() == 4 && s[1] == g.channels && s[2] == g.height && s[3] == g.width,
                   InvalidArgument,
                   device << " " << op << ": input " << s << " does not match the window's [N, "
                          << g.channels << ", " << g.height << ", " << g.width << "]");
  TANDEM_CHECK_MSG(g.stride_h > 0 && g.stride_w > 0 && g.outHeight() > 0 && g.outWidth() > 0,
                   InvalidArgument, device << " " << op << ": window leaves no output");
}

void checkWindowOutput(const Tensor& y, int64_t n, const Window2d& g, std::string_view device,
                       const char* op) {
  const Shape want{n, g.channels, g.outHeight(), g.outWidth()};
  TANDEM_CHECK_MSG(y.shape() == want, InvalidArgument,
                   device << " " << op << ": output " << y.shape() << ", expected " << want);
}

GemmDims gemmDims(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b, const Tensor& c) {
  TANDEM_CHECK_MSG(
      a.shape().rank() == 2 && b.shape().rank() == 2 && c.shape().rank() == 2, InvalidArgument,
      "gemm needs 2-D tensors, got " << a.shape() << ", " << b.shape() << ", " << c.shape());
  const int64_t m = trans_a ? a.shape()[1] : a.shape()[0];
  const int64_t k = trans_a ? a.shape()[0] : a.shape()[1];
  const int64_t kb = trans_b ? b.shape()[1] : b.shape()[0];
  const int64_t n = trans_b ? b.shape()[0] : b.shape()[1];
  TANDEM_CHECK_MSG(k == kb && c.shape()[0] == m && c.shape()[1] == n, InvalidArgument,
                   "gemm shapes do not agree: op(a) " << m << "x" << k << ", op(b) " << kb << "x"
                                                      << n << ", c " << c.shape());
  return {m, n, k};
}

void checkIds(const int32_t* ids, int64_t count, int64_t limit, const char* what,
              const char* where) {
  for (int64_t i = 0; i < count; ++i) {
    TANDEM_CHECK_MSG(
        ids[i] >= 0 && ids[i] < limit, InvalidArgument,
        what << " " << ids[i] << " " << where << " " << i << " is outside [0, " << limit << ")");
  }
}

}  // namespace tandem::backends
