// The OpenCL backend's single-kernel ops: argument checks (shared with every backend),
// then one launch of a kernel from kernels/*.cl. Kernel semantics follow the CPU
// reference op for op; the comments in the .cl files say where order matters.
#include <cmath>

#include "backends/composed_conv.h"
#include "backends/op_checks.h"
#include "backends/opencl/launch.h"

namespace tandem::opencl {

namespace {

cl_ulong u(int64_t v) { return static_cast<cl_ulong>(v); }
size_t items(int64_t v) { return static_cast<size_t>(v); }

// The two kernels of an activation (elementwise.cl's ACTIVATION).
struct ActivationKernels {
  const char *forward, *backward;
};

ActivationKernels activationKernels(Activation kind) {
  switch (kind) {
    case Activation::kReLU:
      return {"relu_f32", "relu_backward_f32"};
    case Activation::kGELU:
      return {"gelu_f32", "gelu_backward_f32"};
    case Activation::kTanh:
      return {"tanh_f32", "tanh_backward_f32"};
    case Activation::kSigmoid:
      return {"sigmoid_f32", "sigmoid_backward_f32"};
    case Activation::kSiLU:
      return {"silu_f32", "silu_backward_f32"};
    case Activation::kReLU6:
      return {"relu6_f32", "relu6_backward_f32"};
    case Activation::kHardSigmoid:
      return {"hardsigmoid_f32", "hardsigmoid_backward_f32"};
    case Activation::kHardSwish:
      return {"hardswish_f32", "hardswish_backward_f32"};
  }
  throw InvalidArgument("unknown activation " + std::to_string(static_cast<int>(kind)));
}

}  // namespace

void OpenClBackend::axpby(float alpha, const Tensor& x, float beta, const Tensor& y) {
  backends::checkSameCount(x, y, label_, "axpby");
  requireF32(x, "axpby");
  requireF32(y, "axpby");
  launch("axpby_f32", items(x.numel()), alpha, x, beta, y, u(x.numel()));
}

void OpenClBackend::mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  backends::checkSameCount(a, b, label_, "mul");
  backends::checkSameCount(a, out, label_, "mul");
  for (const Tensor* t : {&a, &b, &out}) requireF32(*t, "mul");
  launch("mul_f32", items(a.numel()), a, b, out, u(a.numel()));
}

void OpenClBackend::addBias(const Tensor& y, const Tensor& bias) {
  const backends::ChannelView v = backends::channelView(y, bias.numel(), label_, "addBias");
  requireF32(y, "addBias");
  requireF32(bias, "addBias");
  launch("add_bias_f32", items(y.numel()), y, bias, u(y.numel()), u(v.c),
         u(std::max<int64_t>(v.r, 1)));
}

void OpenClBackend::biasGrad(const Tensor& dy, const Tensor& db) {
  const backends::ChannelView v = backends::channelView(dy, db.numel(), label_, "biasGrad");
  requireF32(dy, "biasGrad");
  requireF32(db, "biasGrad");
  const size_t local = channelGroup("bias_grad_f32", v.n * v.r);
  launchGroups("bias_grad_f32", items(v.c), local, dy, db, u(v.n), u(v.c), u(v.r),
               cl::Local(local * accBytes()));
}

void OpenClBackend::activation(Activation kind, const Tensor& x, const Tensor& y) {
  backends::checkSameCount(x, y, label_, "activation");
  requireF32(x, "activation");
  requireF32(y, "activation");
  launch(activationKernels(kind).forward, items(x.numel()), x, y, u(x.numel()));
}

void OpenClBackend::activationBackward(Activation kind, const Tensor& x, const Tensor& y,
                                       const Tensor& dy, const Tensor& dx) {
  backends::checkSameCount(dy, dx, label_, "activationBackward");
  const Tensor& s = activationGradFromInput(kind) ? x : y;
  backends::checkSameCount(s, dx, label_, "activationBackward");
  for (const Tensor* t : {&s, &dy, &dx}) requireF32(*t, "activationBackward");
  launch(activationKernels(kind).backward, items(dx.numel()), s, dy, dx, u(dx.numel()));
}

void OpenClBackend::dropout(const Tensor& x, float p, uint64_t seed, const Tensor& mask,
                            const Tensor& y) {
  backends::checkSameCount(x, y, label_, "dropout");
  backends::checkSameCount(x, mask, label_, "dropout");
  TANDEM_CHECK_MSG(p >= 0.0f && p < 1.0f, InvalidArgument,
                   "dropout probability " << p << " is not in [0, 1)");
  for (const Tensor* t : {&x, &mask, &y}) requireF32(*t, "dropout");
  launch("dropout_f32", items(x.numel()), x, p, static_cast<cl_ulong>(seed), 1.0f / (1.0f - p),
         mask, y, u(x.numel()));
}

void OpenClBackend::sgdStep(const Tensor& param, const Tensor& grad, const Tensor& velocity,
                            const SgdStep& s) {
  backends::checkSameCount(param, grad, label_, "sgdStep");
  requireF32(param, "sgdStep");
  requireF32(grad, "sgdStep");
  const bool momentum = s.momentum != 0.0f;
  if (momentum) {
    backends::checkSameCount(param, velocity, label_, "sgdStep");
    requireF32(velocity, "sgdStep");
  }
  // Without momentum the kernel never reads v: param stands in for the absent tensor.
  const cl_int mode = !momentum ? 0 : s.nesterov ? 2 : 1;
  launch("sgd_f32", items(param.numel()), param, grad, momentum ? velocity : param,
         u(param.numel()), s.lr, s.momentum, s.weight_decay, mode);
}

void OpenClBackend::adamwStep(const Tensor& param, const Tensor& grad, const Tensor& m,
                              const Tensor& v, const AdamWStep& s) {
  backends::checkSameCount(param, grad, label_, "adamwStep");
  backends::checkSameCount(param, m, label_, "adamwStep");
  backends::checkSameCount(param, v, label_, "adamwStep");
  TANDEM_CHECK_MSG(s.step >= 1, InvalidArgument, "adamw step count " << s.step << " must be >= 1");
  for (const Tensor* t : {&param, &grad, &m, &v}) requireF32(*t, "adamwStep");
  // The bias corrections as the CPU reference computes them (std::pow in double).
  const float c1 = 1.0f / (1.0f - static_cast<float>(std::pow(s.beta1, s.step)));
  const float c2 = 1.0f / (1.0f - static_cast<float>(std::pow(s.beta2, s.step)));
  launch("adamw_f32", items(param.numel()), param, grad, m, v, u(param.numel()), s.lr, s.beta1,
         s.beta2, s.eps, s.weight_decay, c1, c2);
}

// --- spatial ---

void OpenClBackend::im2col(const Tensor& x, const Window2d& g, const Tensor& col) {
  backends::checkWindowInput(x, g, label_, "im2col");
  backends::checkColumns(col, x, g, label_, "im2col");
  const int64_t n = x.shape()[0];
  requireF32(x, "im2col");
  requireF32(col, "im2col");
  launch("im2col_f32", items(col.numel()), x, col, static_cast<cl_long>(n), g);
}

void OpenClBackend::col2im(const Tensor& col, const Window2d& g, const Tensor& dx) {
  backends::checkWindowInput(dx, g, label_, "col2im");
  backends::checkColumns(col, dx, g, label_, "col2im");
  const int64_t n = dx.shape()[0];
  requireF32(col, "col2im");
  requireF32(dx, "col2im");
  launch("col2im_f32", items(dx.numel()), col, dx, static_cast<cl_long>(n), g);
}

void OpenClBackend::transpose01(const Tensor& src, const Tensor& dst) {
  const backends::Transpose01 t = backends::checkTranspose01(src, dst, label_);
  requireF32(src, "transpose01");
  requireF32(dst, "transpose01");
  launch("transpose01_f32", items(src.numel()), src, dst, u(t.a), u(t.b), u(t.r));
}

// Convolution runs as im2col, gemm (CLBlast) and transpose01 (backends/composed_conv.h).
void OpenClBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Window2d& g,
                           const Tensor& y) {
  backends::composedConv2d(*this, label_, x, w, bias, g, y);
}

void OpenClBackend::conv2dBackwardData(const Tensor& dy, const Tensor& w, const Window2d& g,
                                       const Tensor& dx) {
  backends::composedConv2dBackwardData(*this, label_, dy, w, g, dx);
}

void OpenClBackend::conv2dBackwardWeight(const Tensor& x, const Tensor& dy, const Window2d& g,
                                         const Tensor& dw, const Tensor& db) {
  backends::composedConv2dBackwardWeight(*this, label_, x, dy, g, dw, db);
}

void OpenClBackend::maxPool(const Tensor& x, const Window2d& g, const Tensor& y,
                            const Tensor& argmax) {
  const int64_t n = backends::checkPool(x, y, g, label_, "maxPool");
  backends::checkArgmax(argmax, y, label_, "maxPool");
  requireF32(x, "maxPool");
  requireF32(y, "maxPool");
  requireI32(argmax, "maxPool");
  launch("max_pool_f32", items(y.numel()), x, y, argmax, static_cast<cl_long>(n), g);
}

void OpenClBackend::maxPoolBackward(const Tensor& dy, const Tensor& argmax, const Window2d& g,
                                    const Tensor& dx) {
  const int64_t n = backends::checkPool(dx, dy, g, label_, "maxPoolBackward");
  backends::checkArgmax(argmax, dy, label_, "maxPoolBackward");
  requireF32(dy, "maxPoolBackward");
  requireI32(argmax, "maxPoolBackward");
  requireF32(dx, "maxPoolBackward");
  launch("max_pool_backward_f32", items(dx.numel()), dy, argmax, dx, static_cast<cl_long>(n), g);
}

void OpenClBackend::avgPool(const Tensor& x, const Window2d& g, const Tensor& y) {
  const int64_t n = backends::checkPool(x, y, g, label_, "avgPool");
  requireF32(x, "avgPool");
  requireF32(y, "avgPool");
  launch("avg_pool_f32", items(y.numel()), x, y, static_cast<cl_long>(n), g);
}

void OpenClBackend::avgPoolBackward(const Tensor& dy, const Window2d& g, const Tensor& dx) {
  const int64_t n = backends::checkPool(dx, dy, g, label_, "avgPoolBackward");
  requireF32(dy, "avgPoolBackward");
  requireF32(dx, "avgPoolBackward");
  launch("avg_pool_backward_f32", items(dx.numel()), dy, dx, static_cast<cl_long>(n), g);
}

// --- depthwise convolution: direct kernels (kernels/spatial.cl) ---

void OpenClBackend::depthwiseConv2d(const Tensor& x, const Tensor& w, const Window2d& g,
                                    const Tensor& y) {
  const int64_t n = backends::checkDepthwise(x, w, y, g, label_, "depthwiseConv2d");
  launch("depthwise_conv2d_f32", items(y.numel()), x, w, y, static_cast<cl_long>(n), g);
}

void OpenClBackend::depthwiseConv2dBackwardData(const Tensor& dy, const Tensor& w,
                                                const Window2d& g, const Tensor& dx) {
  const int64_t n = backends::checkDepthwise(dx, w, dy, g, label_, "depthwiseConv2dBackwardData");
  launch("depthwise_conv2d_backward_data_f32", items(dx.numel()), dy, w, dx,
         static_cast<cl_long>(n), g);
}

void OpenClBackend::depthwiseConv2dBackwardWeight(const Tensor& x, const Tensor& dy,
                                                  const Window2d& g, const Tensor& dw) {
  const int64_t n = backends::checkDepthwise(x, dw, dy, g, label_, "depthwiseConv2dBackwardWeight");
  launch("depthwise_conv2d_backward_weight_f32", items(dw.numel()), x, dy, dw,
         static_cast<cl_long>(n), g);
}

// --- batch normalisation ---

size_t OpenClBackend::channelGroup(const char* kernel_name, int64_t values) {
  size_t local = 1;
  const size_t count = items(values), most = kernel(kernel_name).local;
  while (local < count && local < most) local *= 2;
  return local;
}

void OpenClBackend::batchNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                              bool batch, const Tensor& mean, const Tensor& var, const Tensor& y) {
  const backends::ChannelView v =
      backends::checkBatchNorm(x, gamma, beta, mean, var, y, label_, "batchNorm");
  if (batch) {
    const size_t local = channelGroup("batch_norm_stats_f32", v.n * v.r);
    launchGroups("batch_norm_stats_f32", items(v.c), local, x, mean, var, u(v.n), u(v.c), u(v.r),
                 cl::Local(local * accBytes()));
  }
  launch("batch_norm_f32", items(x.numel()), x, gamma, beta, eps, mean, var, y, u(v.c), u(v.r),
         u(x.numel()));
}

void OpenClBackend::batchNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                      const Tensor& mean, const Tensor& var, float eps,
                                      const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  const backends::ChannelView v =
      backends::checkBatchNormBackward(dy, x, gamma, mean, var, dx, dgamma, dbeta, label_);
  const Tensor sums = empty({2 * v.c});
  const size_t local = channelGroup("batch_norm_backward_sums_f32", v.n * v.r);
  launchGroups("batch_norm_backward_sums_f32", items(v.c), local, dy, x, mean, var, eps, dgamma,
               dbeta, sums, u(v.n), u(v.c), u(v.r), cl::Local(local * accBytes()));
  launch("batch_norm_backward_dx_f32", items(x.numel()), dy, x, gamma, mean, var, eps, sums, dx,
         u(v.c), u(v.r), u(x.numel()));
}

// --- rows ---

void OpenClBackend::layerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                              const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const backends::RowsView v = backends::checkLayerNorm(x, gamma, beta, y, mean, rstd, label_);
  for (const Tensor* t : {&x, &gamma, &beta, &y, &mean, &rstd}) requireF32(*t, "layerNorm");
  launch("layer_norm_f32", items(v.m), x, gamma, beta, eps, y, mean, rstd, u(v.m), u(v.d));
}

void OpenClBackend::layerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                      const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                      const Tensor& dgamma, const Tensor& dbeta) {
  const backends::RowsView v =
      backends::checkLayerNormBackward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, label_);
  for (const Tensor* t : {&dy, &x, &gamma, &mean, &rstd, &dx, &dgamma, &dbeta})
    requireF32(*t, "layerNormBackward");
  launch("layer_norm_backward_dx_f32", items(v.m), dy, x, gamma, mean, rstd, dx, u(v.m), u(v.d));
  launch("layer_norm_backward_params_f32", items(v.d), dy, x, mean, rstd, dgamma, dbeta, u(v.m),
         u(v.d));
}

void OpenClBackend::rmsNorm(const Tensor& x, const Tensor& gamma, float eps, const Tensor& y,
                            const Tensor& rstd) {
  const backends::RowsView v = backends::checkRmsNorm(x, gamma, y, rstd, label_);
  for (const Tensor* t : {&x, &gamma, &y, &rstd}) requireF32(*t, "rmsNorm");
  launch("rms_norm_f32", items(v.m), x, gamma, eps, y, rstd, u(v.m), u(v.d));
}

void OpenClBackend::rmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                    const Tensor& rstd, const Tensor& dx, const Tensor& dgamma) {
  const backends::RowsView v =
      backends::checkRmsNormBackward(dy, x, gamma, rstd, dx, dgamma, label_);
  for (const Tensor* t : {&dy, &x, &gamma, &rstd, &dx, &dgamma}) requireF32(*t, "rmsNormBackward");
  launch("rms_norm_backward_dx_f32", items(v.m), dy, x, gamma, rstd, dx, u(v.m), u(v.d));
  launch("rms_norm_backward_params_f32", items(v.d), dy, x, rstd, dgamma, u(v.m), u(v.d));
}

void OpenClBackend::rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
                         int64_t heads, bool inverse, const Tensor& y) {
  const backends::RopeView v = backends::checkRope(x, positions, inv_freq, heads, y, label_);
  for (const Tensor* t : {&x, &inv_freq, &y}) requireF32(*t, "rope");
  launch("rope_f32", items(v.rows * v.heads * (v.size / 2)), x, positions, inv_freq,
         static_cast<cl_int>(inverse ? 1 : 0), y, u(v.rows), u(v.heads), u(v.all_heads),
         u(v.size / 2));
}

void OpenClBackend::gemmQ8(const Tensor& x, const Tensor& w, const Tensor& scales,
                           const Tensor& y) {
  const backends::GemmQ8Dims d = backends::checkGemmQ8(x, w, scales, y, label_);
  launch("gemm_q8_f32", items(d.m * d.n), x, w, scales, y, u(d.m), u(d.n), u(d.k), u(d.group));
}

void OpenClBackend::embedding(const Tensor& ids, const Tensor& table, const Tensor& y) {
  const backends::EmbeddingView v = backends::checkEmbedding(ids, table, y, label_, "embedding");
  requireI32(ids, "embedding");
  requireF32(table, "embedding");
  requireF32(y, "embedding");
  // Checked on the host: a kernel cannot raise an error that names the id.
  const std::vector<int32_t> host = hostIds(ids);
  backends::checkIds(host.data(), v.m, v.vocab, "embedding id", "at position");
  launch("embedding_f32", items(v.m * v.d), ids, table, y, u(v.m), u(v.d));
}

void OpenClBackend::embeddingBackward(const Tensor& ids, const Tensor& dy, const Tensor& dtable) {
  const backends::EmbeddingView v =
      backends::checkEmbedding(ids, dtable, dy, label_, "embeddingBackward");
  requireI32(ids, "embeddingBackward");
  requireF32(dy, "embeddingBackward");
  requireF32(dtable, "embeddingBackward");
  const std::vector<int32_t> host = hostIds(ids);
  backends::checkIds(host.data(), v.m, v.vocab, "embedding id", "at position");
  launch("embedding_backward_f32", items(v.d), ids, dy, dtable, u(v.m), u(v.d));
}

void OpenClBackend::softmax(const Tensor& x, bool causal, const Tensor& y) {
  const backends::SoftmaxView v = backends::checkSoftmax(x, y, causal, label_, "softmax");
  requireF32(x, "softmax");
  requireF32(y, "softmax");
  launch("softmax_f32", items(v.rows), x, y, static_cast<cl_int>(causal), u(v.rows), u(v.tq),
         u(v.tk));
}

void OpenClBackend::softmaxBackward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const backends::SoftmaxView v = backends::checkSoftmax(y, dy, false, label_, "softmaxBackward");
  backends::checkSameCount(y, dx, label_, "softmaxBackward");
  for (const Tensor* t : {&y, &dy, &dx}) requireF32(*t, "softmaxBackward");
  launch("softmax_backward_f32", items(v.rows), y, dy, dx, u(v.rows), u(v.tk));
}

void OpenClBackend::softmaxCrossEntropy(const Tensor& logits, const Tensor& labels,
                                        float grad_scale, const Tensor& losses,
                                        const Tensor& dlogits) {
  const backends::LogitsView v =
      backends::checkSoftmaxCrossEntropy(logits, labels, losses, dlogits, label_);
  requireF32(logits, "softmaxCrossEntropy");
  requireI32(labels, "softmaxCrossEntropy");
  requireF32(losses, "softmaxCrossEntropy");
  if (dlogits.defined()) requireF32(dlogits, "softmaxCrossEntropy");
  const std::vector<int32_t> host = hostIds(labels);
  backends::checkIds(host.data(), v.n, v.c, "label", "of sample");
  // Without a gradient the kernel never writes it: losses stand in for the absent tensor.
  const bool with_grad = dlogits.defined();
  launch("softmax_xent_f32", items(v.n), logits, labels, grad_scale, losses,
         with_grad ? dlogits : losses, static_cast<cl_int>(with_grad), u(v.n), u(v.c));
}

}  // namespace tandem::opencl
