// Element-wise kernels of the CPU backend: fills, conversions, axpby, activations,
// dropout, bias and the optimizer updates.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/fast_math.h"
#include "backends/cpu/row_sums.h"
#include "backends/op_checks.h"
#include "core/error.h"
#include "core/random.h"
#include "core/simd.h"

namespace tandem::cpu {

namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per range: enough work to beat a wake-up

void addRow(const float* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// One range of an SGD update; v is null without momentum.
void sgdRange(float* __restrict w, const float* __restrict g, float* __restrict v, int64_t n,
              const SgdStep& s) {
  const float lr = s.lr, wd = s.weight_decay, mom = s.momentum;
  if (!v) {
    for (int64_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + wd * w[i]);
  } else if (s.nesterov) {
    for (int64_t i = 0; i < n; ++i) {
      const float d = g[i] + wd * w[i];
      v[i] = mom * v[i] + d;
      w[i] -= lr * (d + mom * v[i]);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {  // PyTorch's order: d = g + wd w; v = mom v + d
      const float d = g[i] + wd * w[i];
      v[i] = mom * v[i] + d;
      w[i] -= lr * v[i];
    }
  }
}

}  // namespace

void CpuBackend::fill(const Tensor& dst, float value) {
  if (dst.dtype() == DType::kI32) {
    int32_t* p = i32(dst);
    const auto v = static_cast<int32_t>(value);
    pool_.parallelFor(dst.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = v;
    });
    return;
  }
  float* p = f32(dst);
  pool_.parallelFor(dst.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p[i] = value;
  });
}

void CpuBackend::convert(const Tensor& src, const Tensor& dst) {
  backends::checkSameCount(src, dst, "cpu", "convert");
  const DType from = src.dtype(), to = dst.dtype();
  const int64_t n = src.numel();
  auto run = [&](auto body) {
    pool_.parallelFor(n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) body(i);
    });
  };
  if (from == to) {
    copy(src, dst);
  } else if (from == DType::kF32 && to == DType::kF16) {
    const float* s = f32(src);
    auto* d = static_cast<uint16_t*>(data(dst));
    run([&](int64_t i) { d[i] = floatToHalf(s[i]); });
  } else if (from == DType::kF16 && to == DType::kF32) {
    const auto* s = static_cast<const uint16_t*>(data(src));
    float* d = f32(dst);
    run([&](int64_t i) { d[i] = halfToFloat(s[i]); });
  } else if (from == DType::kF32 && to == DType::kBF16) {
    const float* s = f32(src);
    auto* d = static_cast<uint16_t*>(data(dst));
    run([&](int64_t i) { d[i] = floatToBFloat16(s[i]); });
  } else if (from == DType::kBF16 && to == DType::kF32) {
    const auto* s = static_cast<const uint16_t*>(data(src));
    float* d = f32(dst);
    run([&](int64_t i) { d[i] = bfloat16ToFloat(s[i]); });
  } else if (from == DType::kF32 && to == DType::kI32) {
    const float* s = f32(src);
    int32_t* d = i32(dst);
    run([&](int64_t i) { d[i] = static_cast<int32_t>(std::lrint(s[i])); });
  } else if (from == DType::kI32 && to == DType::kF32) {
    const int32_t* s = i32(src);
    float* d = f32(dst);
    run([&](int64_t i) { d[i] = static_cast<float>(s[i]); });
  } else {
    throw Unsupported("cpu convert: " + std::string(dtypeName(from)) + " -> " +
                      std::string(dtypeName(to)) + " (i8 needs scales; see the transport codecs)");
  }
}

void CpuBackend::axpby(float alpha, const Tensor& x, float beta, const Tensor& y) {
  backends::checkSameCount(x, y, "cpu", "axpby");
  const float* xp = f32(x);
  float* yp = f32(y);
  pool_.parallelFor(x.numel(), kGrain, [=](int64_t b, int64_t e) {
    if (beta == 0.0f) {
      for (int64_t i = b; i < e; ++i) yp[i] = alpha * xp[i];
    } else if (beta == 1.0f) {
      for (int64_t i = b; i < e; ++i) yp[i] += alpha * xp[i];
    } else {
      for (int64_t i = b; i < e; ++i) yp[i] = alpha * xp[i] + beta * yp[i];
    }
  });
}

void CpuBackend::mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  backends::checkSameCount(a, b, "cpu", "mul");
  backends::checkSameCount(a, out, "cpu", "mul");
  const float* ap = f32(a);
  const float* bp = f32(b);
  float* op = f32(out);
  pool_.parallelFor(a.numel(), kGrain, [=](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) op[i] = ap[i] * bp[i];
  });
}

double CpuBackend::dot(const Tensor& a, const Tensor& b) {
  backends::checkSameCount(a, b, "cpu", "dot");
  const float* ap = f32(a);
  const float* bp = f32(b);
  // Fixed-size blocks summed in block order: the result does not depend on threads.
  constexpr int64_t kBlock = 4096;
  const int64_t n = a.numel();
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks));
  pool_.parallelFor(blocks, 8, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      double s = 0;
      const int64_t end = std::min(n, (blk + 1) * kBlock);
      for (int64_t i = blk * kBlock; i < end; ++i) s += static_cast<double>(ap[i]) * bp[i];
      partial[static_cast<size_t>(blk)] = s;
    }
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

TANDEM_CLONES double sum8(const float* __restrict x, int64_t n) {
  float lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lanes[k] += x[i + k];
  double sum = 0;
  for (int k = 0; k < 8; ++k) sum += lanes[k];
  for (; i < n; ++i) sum += x[i];
  return sum;
}

void CpuBackend::addBias(const Tensor& y, const Tensor& bias) {
  const backends::ChannelView v = backends::channelView(y, bias.numel(), "cpu", "addBias");
  float* yp = f32(y);
  const float* bp = f32(bias);
  if (v.r == 1) {  // [N, C], a linear layer's output: add the bias vector to each row
    pool_.parallelFor(v.n, std::max<int64_t>(1, kGrain / std::max<int64_t>(v.c, 1)),
                      [=](int64_t b, int64_t e) {
                        for (int64_t row = b; row < e; ++row) addRow(bp, yp + row * v.c, v.c);
                      });
    return;
  }
  pool_.parallelFor(v.n * v.c, std::max<int64_t>(1, kGrain / std::max<int64_t>(v.r, 1)),
                    [=](int64_t b, int64_t e) {
                      for (int64_t row = b; row < e; ++row) {
                        const float add = bp[row % v.c];
                        float* p = yp + row * v.r;
                        for (int64_t i = 0; i < v.r; ++i) p[i] += add;
                      }
                    });
}

void CpuBackend::biasGrad(const Tensor& dy, const Tensor& db) {
  const backends::ChannelView v = backends::channelView(dy, db.numel(), "cpu", "biasGrad");
  const float* dp = f32(dy);
  float* gp = f32(db);
  if (v.r == 1) {  // [N, C]: sum down the columns, rows in order
    pool_.parallelFor(v.c, 64, [&](int64_t b, int64_t e) {
      std::vector<double> acc(static_cast<size_t>(e - b), 0.0);
      for (int64_t n = 0; n < v.n; ++n) {
        const float* row = dp + n * v.c;
        for (int64_t c = b; c < e; ++c) acc[static_cast<size_t>(c - b)] += row[c];
      }
      for (int64_t c = b; c < e; ++c) gp[c] += static_cast<float>(acc[static_cast<size_t>(c - b)]);
    });
    return;
  }
  pool_.parallelFor(v.c, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      double acc = 0;
      for (int64_t n = 0; n < v.n; ++n) acc += sum8(dp + (n * v.c + c) * v.r, v.r);
      gp[c] += static_cast<float>(acc);
    }
  });
}

namespace {

// The exact GELU, x Phi(x), with erf and exp that vectorise (fast_math.h).
inline float gelu(float x) { return 0.5f * x * (1.0f + erfApprox(x * 0.70710678118654752f)); }
inline float geluGrad(float x) {
  const float cdf = 0.5f * (1.0f + erfApprox(x * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * expApprox(-0.5f * x * x);
  return cdf + x * pdf;
}
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float siluGrad(float x) {
  const float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}
inline float relu6(float x) { return std::min(std::max(x, 0.0f), 6.0f); }
inline float hardSigmoid(float x) { return relu6(x + 3.0f) / 6.0f; }
// PyTorch's: 0 below -3, 1 above 3, x / 3 + 1/2 between (the ends included).
inline float hardSwishGrad(float x) {
  return x < -3.0f ? 0.0f : x <= 3.0f ? x / 3.0f + 0.5f : 1.0f;
}

// Kernels over one range, on plain local pointers: captured references would make the
// compiler reload them after every store instead of vectorising. Inputs and outputs of
// activations must not overlap (Backend's contract).
TANDEM_CLONES void activationRange(Activation kind, const float* __restrict x, float* __restrict y,
                                   int64_t n) {
  switch (kind) {
    case Activation::kReLU:
      for (int64_t i = 0; i < n; ++i) y[i] = std::max(x[i], 0.0f);
      break;
    case Activation::kGELU:
      for (int64_t i = 0; i < n; ++i) y[i] = gelu(x[i]);
      break;
    case Activation::kTanh:
      for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
      break;
    case Activation::kSigmoid:
      for (int64_t i = 0; i < n; ++i) y[i] = sigmoid(x[i]);
      break;
    case Activation::kSiLU:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid(x[i]);
      break;
    case Activation::kReLU6:
      for (int64_t i = 0; i < n; ++i) y[i] = relu6(x[i]);
      break;
    case Activation::kHardSigmoid:
      for (int64_t i = 0; i < n; ++i) y[i] = hardSigmoid(x[i]);
      break;
    case Activation::kHardSwish:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] * hardSigmoid(x[i]);
      break;
  }
}

// `s` is x for GELU, SiLU, hard sigmoid and hard swish, y for the others.
TANDEM_CLONES void activationBackwardRange(Activation kind, const float* __restrict s,
                                           const float* __restrict dy, float* __restrict dx,
                                           int64_t n) {
  switch (kind) {
    case Activation::kReLU:  // branch-free: the signs of real data defeat prediction
      for (int64_t i = 0; i < n; ++i) {
        const float g = dy[i];  // loaded unconditionally so the select vectorises
        dx[i] = s[i] > 0.0f ? g : 0.0f;
      }
      break;
    case Activation::kGELU:
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * geluGrad(s[i]);
      break;
    case Activation::kTanh:
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (1.0f - s[i] * s[i]);
      break;
    case Activation::kSigmoid:
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * s[i] * (1.0f - s[i]);
      break;
    case Activation::kSiLU:
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * siluGrad(s[i]);
      break;
    case Activation::kReLU6:  // y in (0, 6) exactly where x is
      for (int64_t i = 0; i < n; ++i) {
        const float g = dy[i];
        dx[i] = s[i] > 0.0f && s[i] < 6.0f ? g : 0.0f;
      }
      break;
    case Activation::kHardSigmoid:
      for (int64_t i = 0; i < n; ++i) {
        const float g = dy[i] / 6.0f;
        dx[i] = s[i] > -3.0f && s[i] < 3.0f ? g : 0.0f;
      }
      break;
    case Activation::kHardSwish:
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * hardSwishGrad(s[i]);
      break;
  }
}

}  // namespace

void CpuBackend::activation(Activation kind, const Tensor& x, const Tensor& y) {
  backends::checkSameCount(x, y, "cpu", "activation");
  const float* xp = f32(x);
  float* yp = f32(y);
  pool_.parallelFor(x.numel(), kGrain,
                    [=](int64_t b, int64_t e) { activationRange(kind, xp + b, yp + b, e - b); });
}

void CpuBackend::activationBackward(Activation kind, const Tensor& x, const Tensor& y,
                                    const Tensor& dy, const Tensor& dx) {
  backends::checkSameCount(dy, dx, "cpu", "activationBackward");
  float* gx = f32(dx);
  const float* gy = f32(dy);
  const float* sp = activationGradFromInput(kind) ? f32(x) : f32(y);
  pool_.parallelFor(dx.numel(), kGrain, [=](int64_t b, int64_t e) {
    activationBackwardRange(kind, sp + b, gy + b, gx + b, e - b);
  });
}

void CpuBackend::dropout(const Tensor& x, float p, uint64_t seed, const Tensor& mask,
                         const Tensor& y) {
  backends::checkSameCount(x, y, "cpu", "dropout");
  backends::checkSameCount(x, mask, "cpu", "dropout");
  TANDEM_CHECK_MSG(p >= 0.0f && p < 1.0f, InvalidArgument,
                   "dropout probability " << p << " is not in [0, 1)");
  const float keep_scale = 1.0f / (1.0f - p);
  const float* xp = f32(x);
  float* mp = f32(mask);
  float* yp = f32(y);
  pool_.parallelFor(x.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float m = hashUniform(seed, static_cast<uint64_t>(i)) < p ? 0.0f : keep_scale;
      mp[i] = m;
      yp[i] = xp[i] * m;
    }
  });
}

void CpuBackend::sgdStep(const Tensor& param, const Tensor& grad, const Tensor& velocity,
                         const SgdStep& s) {
  backends::checkSameCount(param, grad, "cpu", "sgdStep");
  float* w = f32(param);
  const float* g = f32(grad);
  float* v = s.momentum != 0.0f ? f32(velocity) : nullptr;
  if (v) backends::checkSameCount(param, velocity, "cpu", "sgdStep");
  pool_.parallelFor(param.numel(), kGrain, [=](int64_t b, int64_t e) {
    sgdRange(w + b, g + b, v ? v + b : nullptr, e - b, s);
  });
}

void CpuBackend::adamwStep(const Tensor& param, const Tensor& grad, const Tensor& m,
                           const Tensor& v, const AdamWStep& s) {
  backends::checkSameCount(param, grad, "cpu", "adamwStep");
  backends::checkSameCount(param, m, "cpu", "adamwStep");
  backends::checkSameCount(param, v, "cpu", "adamwStep");
  TANDEM_CHECK_MSG(s.step >= 1, InvalidArgument, "adamw step count " << s.step << " must be >= 1");
  float* w = f32(param);
  const float* g = f32(grad);
  float* mp = f32(m);
  float* vp = f32(v);
  const float c1 = 1.0f / (1.0f - static_cast<float>(std::pow(s.beta1, s.step)));
  const float c2 = 1.0f / (1.0f - static_cast<float>(std::pow(s.beta2, s.step)));
  pool_.parallelFor(param.numel(), kGrain, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      w[i] -= s.lr * s.weight_decay * w[i];
      mp[i] = s.beta1 * mp[i] + (1.0f - s.beta1) * g[i];
      vp[i] = s.beta2 * vp[i] + (1.0f - s.beta2) * g[i] * g[i];
      w[i] -= s.lr * (mp[i] * c1) / (std::sqrt(vp[i] * c2) + s.eps);
    }
  });
}

}  // namespace tandem::cpu
