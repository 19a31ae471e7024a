// Element-wise kernels over f32 buffers. A tensor is a view that may start inside its
// buffer, so every buffer comes with its element offset; n is the element count, and
// since launches round the global size up to the work-group size, each item checks
// its index.

__kernel void fill_f32(__global float* dst, ulong dst_off, ulong n, float value) {
  const size_t i = get_global_id(0);
  if (i < n) dst[dst_off + i] = value;
}

__kernel void fill_i32(__global int* dst, ulong dst_off, ulong n, int value) {
  const size_t i = get_global_id(0);
  if (i < n) dst[dst_off + i] = value;
}

// y = beta * y; beta 0 writes zeros (whatever y held, NaN included).
__kernel void scale_f32(__global float* y, ulong y_off, ulong n, float beta) {
  const size_t i = get_global_id(0);
  if (i < n) y[y_off + i] = beta == 0.0f ? 0.0f : beta * y[y_off + i];
}

// y = alpha * x + beta * y; beta 0 does not read y.
__kernel void axpby_f32(float alpha, __global const float* x, ulong x_off, float beta,
                        __global float* y, ulong y_off, ulong n) {
  const size_t i = get_global_id(0);
  if (i >= n) return;
  if (beta == 0.0f) {
    y[y_off + i] = alpha * x[x_off + i];
  } else if (beta == 1.0f) {
    y[y_off + i] += alpha * x[x_off + i];
  } else {
    y[y_off + i] = alpha * x[x_off + i] + beta * y[y_off + i];
  }
}

// out = a * b (out may alias a or b)
__kernel void mul_f32(__global const float* a, ulong a_off, __global const float* b,
                      ulong b_off, __global float* out, ulong out_off, ulong n) {
  const size_t i = get_global_id(0);
  if (i < n) out[out_off + i] = a[a_off + i] * b[b_off + i];
}

// partial[group] = sum of a[i] * b[i] over the items of this group's grid stride. The
// local size is a power of two; scratch holds one acc_t per item.
__kernel void dot_partial_f32(__global const float* a, ulong a_off, __global const float* b,
                              ulong b_off, ulong n, __global acc_t* partial,
                              __local acc_t* scratch) {
  const size_t lid = get_local_id(0), lsize = get_local_size(0);
  acc_t s = 0;
  for (size_t i = get_global_id(0); i < n; i += get_global_size(0))
    s += (acc_t)a[a_off + i] * (acc_t)b[b_off + i];
  scratch[lid] = s;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (size_t step = lsize / 2; step > 0; step /= 2) {
    if (lid < step) scratch[lid] += scratch[lid + step];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) partial[get_group_id(0)] = scratch[0];
}

// --- conversions (vload_half / vstore_half are core OpenCL, no cl_khr_fp16 needed) ---

__kernel void f32_to_f16(__global const float* src, ulong src_off, __global half* dst,
                         ulong dst_off, ulong n) {
  const size_t i = get_global_id(0);
  if (i < n) vstore_half_rte(src[src_off + i], dst_off + i, dst);
}

__kernel void f16_to_f32(__global const half* src, ulong src_off, __global float* dst,
                         ulong dst_off, ulong n) {
  const size_t i = get_global_id(0);
  if (i < n) dst[dst_off + i] = vload_half(src_off + i, src);
}

// Round to nearest even on the upper 16 bits; a NaN stays a quiet NaN.
__kernel void f32_to_bf16(__global const uint* src, ulong src_off, __global ushort* dst,
                          ulong dst_off, ulong n) {
  const size_t i = get_global_id(0);
  if (i >= n) return;
  uint x = src[src_off + i];
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu)) {
    dst[dst_off + i] = (ushort)((x >> 16) | 0x40u);
    return;
  }
  x += 0x7fffu + ((x >> 16) & 1u);
  dst[dst_off + i] = (ushort)(x >> 16);
}

__kernel void bf16_to_f32(__global const ushort* src, ulong src_off, __global uint* dst,
                          ulong dst_off, ulong n) {
  const size_t i = get_global_id(0);
  if (i < n) dst[dst_off + i] = ((uint)src[src_off + i]) << 16;
}

__kernel void f32_to_i32(__global const float* src, ulong src_off, __global int* dst,
                         ulong dst_off, ulong n) {
  const size_t i = get_global_id(0);
  if (i < n) dst[dst_off + i] = convert_int_rte(src[src_off + i]);
}

__kernel void i32_to_f32(__global const int* src, ulong src_off, __global float* dst,
                         ulong dst_off, ulong n) {
  const size_t i = get_global_id(0);
  if (i < n) dst[dst_off + i] = (float)src[src_off + i];
}

// --- activations: one kernel per function (a per-element switch defeats vectorisers) ---

float gelu(float x) { return 0.5f * x * (1.0f + erf(x * 0.70710678118654752f)); }

float gelu_grad(float x) {
  const float cdf = 0.5f * (1.0f + erf(x * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * exp(-0.5f * x * x);
  return cdf + x * pdf;
}

// SiLU's derivative: s (1 + x (1 - s)), s = sigmoid(x).
float silu_grad(float x) {
  const float s = 1.0f / (1.0f + exp(-x));
  return s * (1.0f + x * (1.0f - s));
}

// PyTorch's hard sigmoid, ReLU6(x + 3) / 6, with the CPU's comparisons (NaN passes).
float relu6(float x) { return x < 0.0f ? 0.0f : x > 6.0f ? 6.0f : x; }
float hard_sigmoid(float x) { return relu6(x + 3.0f) / 6.0f; }
float hard_swish_grad(float x) {
  return x < -3.0f ? 0.0f : x <= 3.0f ? x / 3.0f + 0.5f : 1.0f;
}

// NAME_f32: y = F(x); NAME_backward_f32: dx = dy * F'(s), where s is x for GELU, SiLU and
// the hard ones, y for the others (Backend::activationBackward).
#define ACTIVATION(NAME, F, DF)                                                             \
  __kernel void NAME##_f32(__global const float* x, ulong x_off, __global float* y,        \
                           ulong y_off, ulong n) {                                          \
    const size_t i = get_global_id(0);                                                      \
    if (i >= n) return;                                                                     \
    const float v = x[x_off + i];                                                           \
    y[y_off + i] = F;                                                                       \
  }                                                                                         \
  __kernel void NAME##_backward_f32(__global const float* s, ulong s_off,                   \
                                    __global const float* dy, ulong dy_off,                 \
                                    __global float* dx, ulong dx_off, ulong n) {            \
    const size_t i = get_global_id(0);                                                      \
    if (i >= n) return;                                                                     \
    const float v = s[s_off + i], g = dy[dy_off + i];                                       \
    dx[dx_off + i] = DF;                                                                    \
  }

// ReLU as the reference's std::max(x, 0): NaN and -0 pass through.
ACTIVATION(relu, v < 0.0f ? 0.0f : v, v > 0.0f ? g : 0.0f)
ACTIVATION(gelu, gelu(v), g * gelu_grad(v))
ACTIVATION(tanh, tanh(v), g * (1.0f - v * v))
ACTIVATION(sigmoid, 1.0f / (1.0f + exp(-v)), g * v * (1.0f - v))
ACTIVATION(silu, v * (1.0f / (1.0f + exp(-v))), g * silu_grad(v))
ACTIVATION(relu6, relu6(v), v > 0.0f && v < 6.0f ? g : 0.0f)
ACTIVATION(hardsigmoid, hard_sigmoid(v), v > -3.0f && v < 3.0f ? g / 6.0f : 0.0f)
ACTIVATION(hardswish, v * hard_sigmoid(v), g * hard_swish_grad(v))

// core/random.h's mix64 and hashUniform, bit for bit, so masks match every backend.
ulong mix64(ulong x) {
  x += 0x9e3779b97f4a7c15ul;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ul;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebul;
  return x ^ (x >> 31);
}

__kernel void dropout_f32(__global const float* x, ulong x_off, float p, ulong seed,
                          float keep_scale, __global float* mask, ulong mask_off,
                          __global float* y, ulong y_off, ulong n) {
  const size_t i = get_global_id(0);
  if (i >= n) return;
  const float u = (float)(mix64(seed ^ mix64((ulong)i)) >> 40) * (1.0f / 16777216.0f);
  const float m = u < p ? 0.0f : keep_scale;
  mask[mask_off + i] = m;
  y[y_off + i] = x[x_off + i] * m;
}

// y viewed as [N, C, R]: y[i] += bias[(i / r) % c].
__kernel void add_bias_f32(__global float* y, ulong y_off, __global const float* bias,
                           ulong b_off, ulong n, ulong c, ulong r) {
  const size_t i = get_global_id(0);
  if (i < n) y[y_off + i] += bias[b_off + (i / r) % c];
}

// db[ch] += sum over n, r of dy[n, ch, r]: one work-group per channel (a power-of-two
// local size), each item summing every local-size-th of the channel's n * r values in
// acc_t, then a tree sum in local memory: a fixed order, and the whole GPU busy where a
// few channels each sum many values (a convolution's bias over the batch's pixels).
__kernel void bias_grad_f32(__global const float* dy, ulong dy_off, __global float* db,
                            ulong db_off, ulong samples, ulong c, ulong r,
                            __local acc_t* scratch) {
  const size_t ch = get_group_id(0), lid = get_local_id(0), lsize = get_local_size(0);
  acc_t t = 0;
  const ulong count = samples * r;
  for (ulong j = lid; j < count; j += lsize) {
    const ulong s = j / r;
    t += dy[dy_off + (s * c + ch) * r + (j - s * r)];
  }
  scratch[lid] = t;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (size_t step = lsize / 2; step > 0; step /= 2) {
    if (lid < step) scratch[lid] += scratch[lid + step];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) db[db_off + ch] += (float)scratch[0];
}

// --- optimizers ---

// mode 0: plain SGD; 1: momentum; 2: Nesterov momentum (PyTorch's formulas).
__kernel void sgd_f32(__global float* w, ulong w_off, __global const float* g, ulong g_off,
                      __global float* v, ulong v_off, ulong n, float lr, float mom, float wd,
                      int mode) {
  const size_t i = get_global_id(0);
  if (i >= n) return;
  const float wi = w[w_off + i];
  const float d = g[g_off + i] + wd * wi;
  if (mode == 0) {
    w[w_off + i] = wi - lr * d;
    return;
  }
  const float vi = mom * v[v_off + i] + d;
  v[v_off + i] = vi;
  w[w_off + i] = wi - lr * (mode == 2 ? d + mom * vi : vi);
}

// AdamW with decoupled weight decay; c1, c2 are the bias corrections 1 / (1 - beta^t).
__kernel void adamw_f32(__global float* w, ulong w_off, __global const float* g, ulong g_off,
                        __global float* m, ulong m_off, __global float* v, ulong v_off, ulong n,
                        float lr, float beta1, float beta2, float eps, float wd, float c1,
                        float c2) {
  const size_t i = get_global_id(0);
  if (i >= n) return;
  float wi = w[w_off + i];
  const float gi = g[g_off + i];
  wi -= lr * wd * wi;
  const float mi = beta1 * m[m_off + i] + (1.0f - beta1) * gi;
  const float vi = beta2 * v[v_off + i] + (1.0f - beta2) * gi * gi;
  m[m_off + i] = mi;
  v[v_off + i] = vi;
  w[w_off + i] = wi - lr * (mi * c1) / (sqrt(vi * c2) + eps);
}
