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

int64_t checkPool(const Tensor& input, const Tensor& pooled, const Window2d& g,
                  std::string_view device, const char* op) {
  checkWindowInput(input, g, device, op);
  const int64_t n = input.shape()[0];
  const Shape want{n, g.channels, g.outHeight(), g.outWidth()};
  TANDEM_CHECK_MSG(pooled.shape() == want, InvalidArgument,
                   device << " " << op << ": output " << pooled.shape() << ", expected " << want);
  return n;
}

int64_t checkDepthwise(const Tensor& x, const Tensor& w, const Tensor& y, const Window2d& g,
                       std::string_view device, const char* op) {
  const int64_t n = checkPool(x, y, g, device, op);
  TANDEM_CHECK_MSG(w.numel() == g.channels * g.kernel_h * g.kernel_w, InvalidArgument,
                   device << " " << op << ": weight " << w.shape() << " holds " << w.numel()
                          << " values, expected [" << g.channels << ", 1, " << g.kernel_h << ", "
                          << g.kernel_w << "]");
  TANDEM_CHECK_MSG(x.dtype() == DType::kF32 && w.dtype() == DType::kF32 && y.dtype() == DType::kF32,
                   InvalidArgument, device << " " << op << ": f32 tensors only");
  return n;
}

void checkColumns(const Tensor& col, const Tensor& images, const Window2d& g,
                  std::string_view device, const char* op) {
  const int64_t rows = g.channels * g.kernel_h * g.kernel_w;
  const int64_t cols = images.shape()[0] * g.outHeight() * g.outWidth();
  TANDEM_CHECK_MSG(col.shape() == (Shape{rows, cols}), InvalidArgument,
                   device << " " << op << ": col " << col.shape() << ", expected [" << rows << ", "
                          << cols << "]");
}

ConvDims checkConv(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                   const Window2d& g, std::string_view device, const char* op) {
  checkWindowInput(x, g, device, op);
  TANDEM_CHECK_MSG(y.shape().rank() == 4, InvalidArgument,
                   device << " " << op << ": output " << y.shape() << " is not [N, OC, OH, OW]");
  ConvDims d{x.shape()[0], y.shape()[1], g.channels * g.kernel_h * g.kernel_w};
  const Shape want{d.n, d.oc, g.outHeight(), g.outWidth()};
  TANDEM_CHECK_MSG(y.shape() == want, InvalidArgument,
                   device << " " << op << ": output " << y.shape() << ", expected " << want);
  TANDEM_CHECK_MSG(w.numel() == d.oc * d.k, InvalidArgument,
                   device << " " << op << ": weight " << w.shape() << " holds " << w.numel()
                          << " values, expected [" << d.oc << ", " << g.channels << ", "
                          << g.kernel_h << ", " << g.kernel_w << "]");
  TANDEM_CHECK_MSG(
      !bias.defined() || bias.numel() == d.oc, InvalidArgument,
      device << " " << op << ": bias " << bias.shape() << ", expected [" << d.oc << "]");
  for (const Tensor* t : {&x, &w, &bias, &y})
    TANDEM_CHECK_MSG(!t->defined() || t->dtype() == DType::kF32, InvalidArgument,
                     device << " " << op << ": tensors must be f32, got " << dtypeName(t->dtype()));
  return d;
}

void checkArgmax(const Tensor& argmax, const Tensor& y, std::string_view device, const char* op) {
  TANDEM_CHECK_MSG(
      argmax.shape() == y.shape(), InvalidArgument,
      device << " " << op << ": argmax " << argmax.shape() << " vs pooled " << y.shape());
}

Transpose01 checkTranspose01(const Tensor& src, const Tensor& dst, std::string_view device) {
  const Shape& s = src.shape();
  TANDEM_CHECK_MSG(s.rank() >= 2, InvalidArgument,
                   device << " transpose01: rank of " << s << " < 2");
  const int64_t a = s[0], b = s[1], r = a * b == 0 ? 0 : src.numel() / (a * b);
  TANDEM_CHECK_MSG(dst.numel() == src.numel() && dst.shape().rank() >= 2 && dst.shape()[0] == b &&
                       dst.shape()[1] == a,
                   InvalidArgument,
                   device << " transpose01: " << s << " cannot be written as " << dst.shape());
  return {a, b, r};
}

RowsView checkLayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd, std::string_view device) {
  const int64_t d = gamma.numel();
  const int64_t m = rowsOf(x, d, device, "layerNorm");
  TANDEM_CHECK_MSG(
      beta.numel() == d && y.numel() == x.numel() && mean.numel() == m && rstd.numel() == m,
      InvalidArgument, device << " layerNorm: argument sizes disagree with x " << x.shape());
  return {m, d};
}

RowsView checkLayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                const Tensor& dgamma, const Tensor& dbeta,
                                std::string_view device) {
  const int64_t d = gamma.numel();
  const int64_t m = rowsOf(x, d, device, "layerNormBackward");
  TANDEM_CHECK_MSG(dy.numel() == x.numel() && dx.numel() == x.numel() && mean.numel() == m &&
                       rstd.numel() == m && dgamma.numel() == d && dbeta.numel() == d,
                   InvalidArgument,
                   device << " layerNormBackward: argument sizes disagree with x " << x.shape());
  return {m, d};
}

RowsView checkRmsNorm(const Tensor& x, const Tensor& gamma, const Tensor& y, const Tensor& rstd,
                      std::string_view device) {
  const int64_t d = gamma.numel();
  const int64_t m = rowsOf(x, d, device, "rmsNorm");
  TANDEM_CHECK_MSG(y.numel() == x.numel() && rstd.numel() == m, InvalidArgument,
                   device << " rmsNorm: argument sizes disagree with x " << x.shape());
  return {m, d};
}

RowsView checkRmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                              const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                              std::string_view device) {
  const int64_t d = gamma.numel();
  const int64_t m = rowsOf(x, d, device, "rmsNormBackward");
  TANDEM_CHECK_MSG(dy.numel() == x.numel() && dx.numel() == x.numel() && rstd.numel() == m &&
                       dgamma.numel() == d,
                   InvalidArgument,
                   device << " rmsNormBackward: argument sizes disagree with x " << x.shape());
  return {m, d};
}

ChannelView checkBatchNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                           const Tensor& mean, const Tensor& var, const Tensor& y,
                           std::string_view device, const char* op) {
  const int64_t c = gamma.numel();
  const ChannelView v = channelView(x, c, device, op);
  TANDEM_CHECK_MSG(c > 0 && v.n > 0 && v.r > 0 && beta.numel() == c && mean.numel() == c &&
                       var.numel() == c && y.numel() == x.numel(),
                   InvalidArgument,
                   device << " " << op << ": argument sizes disagree with x " << x.shape());
  for (const Tensor* t : {&x, &gamma, &beta, &mean, &var, &y})
    TANDEM_CHECK_MSG(t->dtype() == DType::kF32, InvalidArgument,
                     device << " " << op << ": expects f32 tensors, got " << dtypeName(t->dtype()));
  return v;
}

ChannelView checkBatchNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                   const Tensor& mean, const Tensor& var, const Tensor& dx,
                                   const Tensor& dgamma, const Tensor& dbeta,
                                   std::string_view device) {
  // x with dgamma in beta's place and dx in y's; dy with dbeta.
  const ChannelView v =
      checkBatchNorm(x, gamma, dgamma, mean, var, dx, device, "batchNormBackward");
  checkBatchNorm(dy, gamma, dbeta, mean, var, dx, device, "batchNormBackward");
  return v;
}

GemmQ8Dims checkGemmQ8(const Tensor& x, const Tensor& w, const Tensor& scales, const Tensor& y,
                       std::string_view device) {
  TANDEM_CHECK_MSG(x.dtype() == DType::kF32 && w.dtype() == DType::kI8 &&
                       scales.dtype() == DType::kF32 && y.dtype() == DType::kF32,
                   InvalidArgument,
                   device << " gemmQ8: expects x f32, w i8, scales f32, y f32; got "
                          << dtypeName(x.dtype()) << ", " << dtypeName(w.dtype()) << ", "
                          << dtypeName(scales.dtype()) << ", " << dtypeName(y.dtype()));
  const Shape &xs = x.shape(), &ws = w.shape(), &ss = scales.shape(), &ys = y.shape();
  TANDEM_CHECK_MSG(xs.rank() == 2 && ws.rank() == 2 && ss.rank() == 2 && ys.rank() == 2,
                   InvalidArgument,
                   device << " gemmQ8: operands must be 2-D, got x " << xs << ", w " << ws
                          << ", scales " << ss << ", y " << ys);
  const int64_t m = xs[0], k = xs[1], n = ws[0];
  TANDEM_CHECK_MSG(
      ws[1] == k && ys[0] == m && ys[1] == n && ss[0] == n && ss[1] > 0 && k % ss[1] == 0,
      InvalidArgument,
      device << " gemmQ8: x " << xs << " times w " << ws << "^T into y " << ys << " with scales "
             << ss << " (scales [N, K / group])");
  return {m, n, k, k / ss[1]};
}

RopeView checkRope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, int64_t heads,
                   const Tensor& y, std::string_view device) {
  TANDEM_CHECK_MSG(
      positions.dtype() == DType::kI32, InvalidArgument,
      device << " rope: positions are " << dtypeName(positions.dtype()) << ", not i32");
  const int64_t rows = positions.numel(), size = 2 * inv_freq.numel();
  TANDEM_CHECK_MSG(rows > 0 && size > 0 && x.numel() % (rows * size) == 0 && y.numel() == x.numel(),
                   InvalidArgument,
                   device << " rope: x " << x.shape() << " is not " << rows << " rows of heads of "
                          << size << " (y " << y.shape() << ")");
  const int64_t all = x.numel() / (rows * size);
  TANDEM_CHECK_MSG(heads > 0 && heads <= all, InvalidArgument,
                   device << " rope: cannot rotate " << heads << " of " << all << " heads");
  return {rows, heads, all, size};
}

EmbeddingView checkEmbedding(const Tensor& ids, const Tensor& table, const Tensor& rows,
                             std::string_view device, const char* op) {
  TANDEM_CHECK_MSG(table.shape().rank() == 2, InvalidArgument,
                   device << " " << op << ": table " << table.shape() << " is not [V, D]");
  const int64_t vocab = table.shape()[0], d = table.shape()[1], m = ids.numel();
  TANDEM_CHECK_MSG(
      rows.numel() == m * d, InvalidArgument,
      device << " " << op << ": rows " << rows.shape() << " do not hold " << m << " x " << d);
  return {vocab, d, m};
}

SoftmaxView checkSoftmax(const Tensor& x, const Tensor& y, bool causal, std::string_view device,
                         const char* op) {
  const Shape& s = x.shape();
  TANDEM_CHECK_MSG(s.rank() >= 1 && s[s.rank() - 1] > 0, InvalidArgument,
                   device << " " << op << ": " << s << " has no rows to normalise");
  const int64_t tk = s[s.rank() - 1];
  const int64_t tq = s.rank() >= 2 ? s[s.rank() - 2] : 1;
  TANDEM_CHECK_MSG(!causal || tk >= tq, InvalidArgument,
                   device << " " << op << ": a causal mask needs at least as many keys as "
                          << "queries, got " << s);
  TANDEM_CHECK_MSG(y.numel() == x.numel(), InvalidArgument,
                   device << " " << op << ": " << y.shape() << " does not match " << s);
  return {x.numel() / tk, tq, tk};
}

LogitsView checkSoftmaxCrossEntropy(const Tensor& logits, const Tensor& labels,
                                    const Tensor& losses, const Tensor& dlogits,
                                    std::string_view device) {
  TANDEM_CHECK_MSG(
      logits.shape().rank() == 2, InvalidArgument,
      device << " softmaxCrossEntropy: logits " << logits.shape() << " are not [N, C]");
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  TANDEM_CHECK_MSG(labels.numel() == n && losses.numel() == n &&
                       (!dlogits.defined() || dlogits.numel() == n * c),
                   InvalidArgument,
                   device << " softmaxCrossEntropy: labels " << labels.shape() << " / losses "
                          << losses.shape() << " do not match logits " << logits.shape());
  return {n, c};
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

BatchedGemm batchedGemmDims(bool trans_a, bool trans_b, const Tensor& a, const Tensor& b,
                            const Tensor& c) {
  TANDEM_CHECK_MSG(a.shape().rank() == 3 && b.shape().rank() == 3 && c.shape().rank() == 3 &&
                       a.shape()[0] == b.shape()[0] && a.shape()[0] == c.shape()[0],
                   InvalidArgument,
                   "batched gemm needs 3-D tensors with one batch, got "
                       << a.shape() << ", " << b.shape() << ", " << c.shape());
  const int64_t batch = a.shape()[0];
  auto block = [](const Tensor& t) { return t.reshape(t.shape().dropFirst()); };
  if (batch == 0) return {0, {0, 0, 0}};
  return {batch, gemmDims(trans_a, trans_b, block(a.slice(0, 1)), block(b.slice(0, 1)),
                          block(c.slice(0, 1)))};
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
