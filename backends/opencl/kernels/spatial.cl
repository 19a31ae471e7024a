// Spatial kernels: im2col/col2im for convolution, the [A, B, R] -> [B, A, R] transpose,
// pooling and batch normalisation over [N, C, H, W]. A window is passed as (channels, height, width, kh, kw,
// stride_h, stride_w, pad_h, pad_w, out_h, out_w).

#define WINDOW                                                                            \
  long channels, long height, long width, long kh, long kw, long stride_h, long stride_w, \
      long pad_h, long pad_w, long out_h, long out_w

// col [C*kh*kw, n*OH*OW], one item per entry.
__kernel void im2col_f32(__global const float* x, ulong x_off, __global float* col,
                         ulong col_off, long n, WINDOW) {
  const long ohw = out_h * out_w, cols = n * ohw;
  const long k = get_global_id(0);
  if (k >= channels * kh * kw * cols) return;
  const long row = k / cols, rest = k % cols;
  const long s = rest / ohw, pix = rest % ohw, oy = pix / out_w, ox = pix % out_w;
  const long c = row / (kh * kw), ki = (row / kw) % kh, kj = row % kw;
  const long iy = oy * stride_h - pad_h + ki, ix = ox * stride_w - pad_w + kj;
  float v = 0.0f;
  if (iy >= 0 && iy < height && ix >= 0 && ix < width)
    v = x[x_off + ((s * channels + c) * height + iy) * width + ix];
  col[col_off + k] = v;
}

// dx [n, C, H, W] = the sum of col's entries that read each pixel, one item per pixel,
// gathered in the reference's order (kernel row, then kernel column).
__kernel void col2im_f32(__global const float* col, ulong col_off, __global float* dx,
                         ulong dx_off, long n, WINDOW) {
  const long k = get_global_id(0);
  if (k >= n * channels * height * width) return;
  const long ix = k % width, iy = (k / width) % height;
  const long c = (k / (width * height)) % channels, s = k / (width * height * channels);
  const long ohw = out_h * out_w, cols = n * ohw;
  float sum = 0.0f;
  for (long ki = 0; ki < kh; ++ki) {
    const long ty = iy + pad_h - ki;
    if (ty < 0 || ty % stride_h != 0 || ty / stride_h >= out_h) continue;
    const long oy = ty / stride_h;
    for (long kj = 0; kj < kw; ++kj) {
      const long tx = ix + pad_w - kj;
      if (tx < 0 || tx % stride_w != 0 || tx / stride_w >= out_w) continue;
      const long row = (c * kh + ki) * kw + kj;
      sum += col[col_off + row * cols + s * ohw + oy * out_w + tx / stride_w];
    }
  }
  dx[dx_off + k] = sum;
}

// src [a, b, r] -> dst [b, a, r], one item per element.
__kernel void transpose01_f32(__global const float* src, ulong src_off, __global float* dst,
                              ulong dst_off, ulong a, ulong b, ulong r) {
  const size_t k = get_global_id(0);
  if (k >= a * b * r) return;
  const ulong e = k % r, idx = k / r, j = idx / a, i = idx % a;
  dst[dst_off + k] = src[src_off + (i * b + j) * r + e];
}

// One item per output; argmax is the flat index inside the input plane, the first
// maximum winning.
__kernel void max_pool_f32(__global const float* x, ulong x_off, __global float* y, ulong y_off,
                           __global int* argmax, ulong a_off, long n, WINDOW) {
  const long k = get_global_id(0);
  if (k >= n * channels * out_h * out_w) return;
  const long ox = k % out_w, oy = (k / out_w) % out_h, plane_idx = k / (out_w * out_h);
  __global const float* in = x + x_off + plane_idx * height * width;
  const long y0 = max(0L, oy * stride_h - pad_h), y1 = min(height, oy * stride_h - pad_h + kh);
  const long x0 = max(0L, ox * stride_w - pad_w), x1 = min(width, ox * stride_w - pad_w + kw);
  float best = in[y0 * width + x0];
  long best_at = y0 * width + x0;
  for (long iy = y0; iy < y1; ++iy) {
    for (long ix = x0; ix < x1; ++ix) {
      const float v = in[iy * width + ix];
      if (v > best) {
        best = v;
        best_at = iy * width + ix;
      }
    }
  }
  y[y_off + k] = best;
  argmax[a_off + k] = (int)best_at;
}

// One item per input element, gathering from the windows that hold it in output order:
// the reference scatters in that order, so each element's sum is the same. An argmax
// outside its window (maxPool writes none; the CPU would still scatter one inside the
// plane) or outside the plane matches no element.
__kernel void max_pool_backward_f32(__global const float* dy, ulong dy_off,
                                    __global const int* argmax, ulong a_off, __global float* dx,
                                    ulong dx_off, long n, WINDOW) {
  const long k = get_global_id(0);
  if (k >= n * channels * height * width) return;
  const long ix = k % width, iy = (k / width) % height, p = k / (width * height);
  const long ohw = out_h * out_w, at = iy * width + ix;
  // Windows oy hold row iy where oy * stride_h - pad_h <= iy < oy * stride_h - pad_h + kh.
  const long ylo = iy + pad_h - kh + 1, xlo = ix + pad_w - kw + 1;
  const long oy0 = ylo <= 0 ? 0 : (ylo + stride_h - 1) / stride_h;
  const long ox0 = xlo <= 0 ? 0 : (xlo + stride_w - 1) / stride_w;
  const long oy1 = min((iy + pad_h) / stride_h, out_h - 1);
  const long ox1 = min((ix + pad_w) / stride_w, out_w - 1);
  float s = 0.0f;
  for (long oy = oy0; oy <= oy1; ++oy)
    for (long ox = ox0; ox <= ox1; ++ox) {
      const long o = p * ohw + oy * out_w + ox;
      if (argmax[a_off + o] == at) s += dy[dy_off + o];
    }
  dx[dx_off + k] = s;
}

// Average with padding counted as zeros (divisor kh * kw), one item per output.
__kernel void avg_pool_f32(__global const float* x, ulong x_off, __global float* y, ulong y_off,
                           long n, WINDOW) {
  const long k = get_global_id(0);
  if (k >= n * channels * out_h * out_w) return;
  const long ox = k % out_w, oy = (k / out_w) % out_h, plane_idx = k / (out_w * out_h);
  __global const float* in = x + x_off + plane_idx * height * width;
  float s = 0.0f;
  for (long ki = 0; ki < kh; ++ki) {
    const long iy = oy * stride_h - pad_h + ki;
    if (iy < 0 || iy >= height) continue;
    for (long kj = 0; kj < kw; ++kj) {
      const long ix = ox * stride_w - pad_w + kj;
      if (ix >= 0 && ix < width) s += in[iy * width + ix];
    }
  }
  y[y_off + k] = s * (1.0f / (float)(kh * kw));
}

// One item per input pixel, gathering the outputs whose windows cover it in output
// order (the order in which the reference scatters them).
__kernel void avg_pool_backward_f32(__global const float* dy, ulong dy_off, __global float* dx,
                                    ulong dx_off, long n, WINDOW) {
  const long k = get_global_id(0);
  if (k >= n * channels * height * width) return;
  const long ix = k % width, iy = (k / width) % height, plane_idx = k / (width * height);
  __global const float* g = dy + dy_off + plane_idx * out_h * out_w;
  const float inv = 1.0f / (float)(kh * kw);
  float s = 0.0f;
  // Outputs oy with oy * stride_h - pad_h <= iy < oy * stride_h - pad_h + kh.
  const long ty = iy + pad_h - kh + 1, tx = ix + pad_w - kw + 1;
  const long oy0 = ty <= 0 ? 0 : (ty + stride_h - 1) / stride_h;
  const long ox0 = tx <= 0 ? 0 : (tx + stride_w - 1) / stride_w;
  const long oy1 = min(out_h - 1, (iy + pad_h) / stride_h);
  const long ox1 = min(out_w - 1, (ix + pad_w) / stride_w);
  for (long oy = oy0; oy <= oy1; ++oy)
    for (long ox = ox0; ox <= ox1; ++ox) s += g[oy * out_w + ox] * inv;
  dx[dx_off + k] = s;
}

// --- depthwise convolution: w [C, kh, kw]; the CPU reference's order of sums ---

// One item per output: its taps in (ki, kj) order, from 0.
__kernel void depthwise_conv2d_f32(__global const float* x, ulong x_off, __global const float* w,
                                   ulong w_off, __global float* y, ulong y_off, long n, WINDOW) {
  const long k = get_global_id(0);
  if (k >= n * channels * out_h * out_w) return;
  const long ox = k % out_w, oy = (k / out_w) % out_h, plane_idx = k / (out_w * out_h);
  __global const float* in = x + x_off + plane_idx * height * width;
  __global const float* wk = w + w_off + (plane_idx % channels) * kh * kw;
  float s = 0.0f;
  for (long ki = 0; ki < kh; ++ki) {
    const long iy = oy * stride_h - pad_h + ki;
    if (iy < 0 || iy >= height) continue;
    for (long kj = 0; kj < kw; ++kj) {
      const long ix = ox * stride_w - pad_w + kj;
      if (ix >= 0 && ix < width) s += wk[ki * kw + kj] * in[iy * width + ix];
    }
  }
  y[y_off + k] = s;
}

// One item per input pixel, gathering in the order the reference scatters: outputs oy
// ascending, then taps kj ascending.
__kernel void depthwise_conv2d_backward_data_f32(__global const float* dy, ulong dy_off,
                                                 __global const float* w, ulong w_off,
                                                 __global float* dx, ulong dx_off, long n,
                                                 WINDOW) {
  const long k = get_global_id(0);
  if (k >= n * channels * height * width) return;
  const long ix = k % width, iy = (k / width) % height, plane_idx = k / (width * height);
  __global const float* g = dy + dy_off + plane_idx * out_h * out_w;
  __global const float* wk = w + w_off + (plane_idx % channels) * kh * kw;
  float s = 0.0f;
  for (long oy = 0; oy < out_h; ++oy) {
    const long ki = iy + pad_h - oy * stride_h;
    if (ki < 0 || ki >= kh) continue;
    for (long kj = 0; kj < kw; ++kj) {
      const long t = ix + pad_w - kj;
      if (t < 0 || t % stride_w != 0 || t / stride_w >= out_w) continue;
      s += wk[ki * kw + kj] * g[oy * out_w + t / stride_w];
    }
  }
  dx[dx_off + k] = s;
}

// One item per weight (channel, tap): each sample's share over its outputs in order,
// added in the batch's order.
__kernel void depthwise_conv2d_backward_weight_f32(__global const float* x, ulong x_off,
                                                   __global const float* dy, ulong dy_off,
                                                   __global float* dw, ulong dw_off, long n,
                                                   WINDOW) {
  const long k = get_global_id(0);
  if (k >= channels * kh * kw) return;
  const long kj = k % kw, ki = (k / kw) % kh, ch = k / (kw * kh);
  float d = dw[dw_off + k];
  for (long smp = 0; smp < n; ++smp) {
    __global const float* in = x + x_off + (smp * channels + ch) * height * width;
    __global const float* g = dy + dy_off + (smp * channels + ch) * out_h * out_w;
    float share = 0.0f;
    for (long oy = 0; oy < out_h; ++oy) {
      const long iy = oy * stride_h - pad_h + ki;
      if (iy < 0 || iy >= height) continue;
      for (long ox = 0; ox < out_w; ++ox) {
        const long ix = ox * stride_w - pad_w + kj;
        if (ix >= 0 && ix < width) share += in[iy * width + ix] * g[oy * out_w + ox];
      }
    }
    d += share;
  }
  dw[dw_off + k] = d;
}

// --- batch normalisation: x viewed as [samples, c, r] ---

// The reduction of bias_grad_f32 over one channel's values, in a work-group per channel:
// sum_j f(j) for j < samples * r, f given as an expression of the value's index `at`.
#define CHANNEL_SUM(result, expr)                                      \
  {                                                                    \
    acc_t t_ = 0;                                                      \
    for (ulong j = lid; j < count; j += lsize) {                       \
      const ulong s_ = j / r;                                          \
      const ulong at = (s_ * c + ch) * r + (j - s_ * r);               \
      t_ += (expr);                                                    \
    }                                                                  \
    scratch[lid] = t_;                                                 \
    barrier(CLK_LOCAL_MEM_FENCE);                                      \
    for (size_t step = lsize / 2; step > 0; step /= 2) {               \
      if (lid < step) scratch[lid] += scratch[lid + step];             \
      barrier(CLK_LOCAL_MEM_FENCE);                                    \
    }                                                                  \
    result = scratch[0];                                               \
    barrier(CLK_LOCAL_MEM_FENCE);                                      \
  }

// mean[ch] and the biased var[ch] of channel ch.
__kernel void batch_norm_stats_f32(__global const float* x, ulong x_off, __global float* mean,
                                   ulong mean_off, __global float* var, ulong var_off,
                                   ulong samples, ulong c, ulong r, __local acc_t* scratch) {
  const size_t ch = get_group_id(0), lid = get_local_id(0), lsize = get_local_size(0);
  const ulong count = samples * r;
  acc_t s, q;
  CHANNEL_SUM(s, (acc_t)x[x_off + at]);
  const acc_t mu = s / (acc_t)count;
  CHANNEL_SUM(q, ((acc_t)x[x_off + at] - mu) * ((acc_t)x[x_off + at] - mu));
  if (lid == 0) {
    mean[mean_off + ch] = (float)mu;
    var[var_off + ch] = (float)(q / (acc_t)count);
  }
}

float batch_norm_rstd(float var, float eps) { return (float)((acc_t)1 / sqrt((acc_t)var + eps)); }

// y = (x - mean) * (rstd * gamma) + beta, one item per value.
__kernel void batch_norm_f32(__global const float* x, ulong x_off, __global const float* gamma,
                             ulong g_off, __global const float* beta, ulong b_off, float eps,
                             __global const float* mean, ulong mean_off,
                             __global const float* var, ulong var_off, __global float* y,
                             ulong y_off, ulong c, ulong r, ulong total) {
  const size_t i = get_global_id(0);
  if (i >= total) return;
  const ulong ch = (i / r) % c;
  const float scale = batch_norm_rstd(var[var_off + ch], eps) * gamma[g_off + ch];
  y[y_off + i] = (x[x_off + i] - mean[mean_off + ch]) * scale + beta[b_off + ch];
}

// Per channel: sums[2 ch] = sum dy, sums[2 ch + 1] = sum dy * xhat; dbeta and dgamma
// accumulate them.
__kernel void batch_norm_backward_sums_f32(__global const float* dy, ulong dy_off,
                                           __global const float* x, ulong x_off,
                                           __global const float* mean, ulong mean_off,
                                           __global const float* var, ulong var_off, float eps,
                                           __global float* dgamma, ulong dg_off,
                                           __global float* dbeta, ulong db_off,
                                           __global float* sums, ulong sums_off, ulong samples,
                                           ulong c, ulong r, __local acc_t* scratch) {
  const size_t ch = get_group_id(0), lid = get_local_id(0), lsize = get_local_size(0);
  const ulong count = samples * r;
  const float mu = mean[mean_off + ch], inv = batch_norm_rstd(var[var_off + ch], eps);
  acc_t sg, sgx;
  CHANNEL_SUM(sg, (acc_t)dy[dy_off + at]);
  CHANNEL_SUM(sgx, (acc_t)dy[dy_off + at] * ((x[x_off + at] - mu) * inv));
  if (lid == 0) {
    sums[sums_off + 2 * ch] = (float)(sg / (acc_t)count);
    sums[sums_off + 2 * ch + 1] = (float)(sgx / (acc_t)count);
    dgamma[dg_off + ch] += (float)sgx;
    dbeta[db_off + ch] += (float)sg;
  }
}

// dx = gamma rstd (dy - mean(dy) - xhat mean(dy xhat)), one item per value.
__kernel void batch_norm_backward_dx_f32(__global const float* dy, ulong dy_off,
                                         __global const float* x, ulong x_off,
                                         __global const float* gamma, ulong g_off,
                                         __global const float* mean, ulong mean_off,
                                         __global const float* var, ulong var_off, float eps,
                                         __global const float* sums, ulong sums_off,
                                         __global float* dx, ulong dx_off, ulong c, ulong r,
                                         ulong total) {
  const size_t i = get_global_id(0);
  if (i >= total) return;
  const ulong ch = (i / r) % c;
  const float mu = mean[mean_off + ch], inv = batch_norm_rstd(var[var_off + ch], eps);
  const float k = gamma[g_off + ch] * inv;
  dx[dx_off + i] = k * (dy[dy_off + i] - sums[sums_off + 2 * ch] -
                        (x[x_off + i] - mu) * inv * sums[sums_off + 2 * ch + 1]);
}
