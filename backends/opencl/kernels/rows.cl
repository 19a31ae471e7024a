// Row-wise kernels: layer and RMS normalisation, rotary embedding, embedding lookup, softmax (attention's, with its
// causal mask) and softmax cross-entropy.
// One item per row (or per column for the sums over rows), accumulating in acc_t in
// the CPU reference's order.

// x, y [m, d]; mean, rstd [m].
__kernel void layer_norm_f32(__global const float* x, ulong x_off, __global const float* gamma,
                             ulong g_off, __global const float* beta, ulong b_off, float eps,
                             __global float* y, ulong y_off, __global float* mean, ulong mean_off,
                             __global float* rstd, ulong rstd_off, ulong m, ulong d) {
  const size_t r = get_global_id(0);
  if (r >= m) return;
  __global const float* row = x + x_off + r * d;
  acc_t s = 0;
  for (ulong i = 0; i < d; ++i) s += row[i];
  const acc_t mu = s / (acc_t)d;
  acc_t v = 0;
  for (ulong i = 0; i < d; ++i) v += (row[i] - mu) * (row[i] - mu);
  const float inv = (float)((acc_t)1 / sqrt(v / (acc_t)d + eps));
  const float muf = (float)mu;
  mean[mean_off + r] = muf;
  rstd[rstd_off + r] = inv;
  __global float* out = y + y_off + r * d;
  for (ulong i = 0; i < d; ++i)
    out[i] = (row[i] - muf) * inv * gamma[g_off + i] + beta[b_off + i];
}

// dx for each row.
__kernel void layer_norm_backward_dx_f32(__global const float* dy, ulong dy_off,
                                         __global const float* x, ulong x_off,
                                         __global const float* gamma, ulong g_off,
                                         __global const float* mean, ulong mean_off,
                                         __global const float* rstd, ulong rstd_off,
                                         __global float* dx, ulong dx_off, ulong m, ulong d) {
  const size_t r = get_global_id(0);
  if (r >= m) return;
  __global const float* row = x + x_off + r * d;
  __global const float* grow = dy + dy_off + r * d;
  const float mu = mean[mean_off + r], rs = rstd[rstd_off + r];
  acc_t sum_g = 0, sum_gx = 0;
  for (ulong i = 0; i < d; ++i) {
    const acc_t xhat = (row[i] - mu) * rs;
    const acc_t g = (acc_t)grow[i] * gamma[g_off + i];
    sum_g += g;
    sum_gx += g * xhat;
  }
  const acc_t mean_g = sum_g / (acc_t)d, mean_gx = sum_gx / (acc_t)d;
  for (ulong i = 0; i < d; ++i) {
    const acc_t xhat = (row[i] - mu) * rs;
    const acc_t g = (acc_t)grow[i] * gamma[g_off + i];
    dx[dx_off + r * d + i] = (float)(rs * (g - mean_g - xhat * mean_gx));
  }
}

// dgamma, dbeta accumulate column sums over the rows, in row order.
__kernel void layer_norm_backward_params_f32(__global const float* dy, ulong dy_off,
                                             __global const float* x, ulong x_off,
                                             __global const float* mean, ulong mean_off,
                                             __global const float* rstd, ulong rstd_off,
                                             __global float* dgamma, ulong dg_off,
                                             __global float* dbeta, ulong db_off, ulong m,
                                             ulong d) {
  const size_t i = get_global_id(0);
  if (i >= d) return;
  acc_t sg = 0, sb = 0;
  for (ulong r = 0; r < m; ++r) {
    const acc_t xhat = (x[x_off + r * d + i] - mean[mean_off + r]) * rstd[rstd_off + r];
    const float g = dy[dy_off + r * d + i];
    sg += (acc_t)g * xhat;
    sb += g;
  }
  dgamma[dg_off + i] += (float)sg;
  dbeta[db_off + i] += (float)sb;
}

// RMS norm: x, y [m, d]; rstd [m].
__kernel void rms_norm_f32(__global const float* x, ulong x_off, __global const float* gamma,
                           ulong g_off, float eps, __global float* y, ulong y_off,
                           __global float* rstd, ulong rstd_off, ulong m, ulong d) {
  const size_t r = get_global_id(0);
  if (r >= m) return;
  __global const float* row = x + x_off + r * d;
  acc_t ss = 0;
  for (ulong i = 0; i < d; ++i) ss += (acc_t)row[i] * row[i];
  const float inv = (float)((acc_t)1 / sqrt(ss / (acc_t)d + eps));
  rstd[rstd_off + r] = inv;
  __global float* out = y + y_off + r * d;
  for (ulong i = 0; i < d; ++i) out[i] = row[i] * inv * gamma[g_off + i];
}

// dx = rstd (g - xhat mean(g xhat)) per row, g = dy gamma, xhat = x rstd.
__kernel void rms_norm_backward_dx_f32(__global const float* dy, ulong dy_off,
                                       __global const float* x, ulong x_off,
                                       __global const float* gamma, ulong g_off,
                                       __global const float* rstd, ulong rstd_off,
                                       __global float* dx, ulong dx_off, ulong m, ulong d) {
  const size_t r = get_global_id(0);
  if (r >= m) return;
  __global const float* row = x + x_off + r * d;
  __global const float* grow = dy + dy_off + r * d;
  const float rs = rstd[rstd_off + r];
  acc_t sum_gx = 0;
  for (ulong i = 0; i < d; ++i) sum_gx += (acc_t)(grow[i] * gamma[g_off + i]) * (row[i] * rs);
  const float mean_gx = (float)(sum_gx / (acc_t)d);
  for (ulong i = 0; i < d; ++i)
    dx[dx_off + r * d + i] = rs * (grow[i] * gamma[g_off + i] - (row[i] * rs) * mean_gx);
}

// dgamma accumulates column sums of dy xhat over the rows, in row order.
__kernel void rms_norm_backward_params_f32(__global const float* dy, ulong dy_off,
                                           __global const float* x, ulong x_off,
                                           __global const float* rstd, ulong rstd_off,
                                           __global float* dgamma, ulong dg_off, ulong m,
                                           ulong d) {
  const size_t i = get_global_id(0);
  if (i >= d) return;
  acc_t sg = 0;
  for (ulong r = 0; r < m; ++r)
    sg += (acc_t)dy[dy_off + r * d + i] * (x[x_off + r * d + i] * rstd[rstd_off + r]);
  dgamma[dg_off + i] += (float)sg;
}

// Rotary embedding of the first `heads` of `all` heads per row, one item per (row, head,
// pair i < pairs): x, y [rows, all, 2 pairs]. The angle is the f32 product
// float(position) * inv_freq[i], as the CPU reference's.
__kernel void rope_f32(__global const float* x, ulong x_off, __global const int* positions,
                       ulong p_off, __global const float* inv_freq, ulong f_off, int inverse,
                       __global float* y, ulong y_off, ulong rows, ulong heads, ulong all,
                       ulong pairs) {
  const size_t k = get_global_id(0);
  if (k >= rows * heads * pairs) return;
  const ulong i = k % pairs, rh = k / pairs, r = rh / heads, h = rh % heads;
  const float a = (float)positions[p_off + r] * inv_freq[f_off + i];
  const float c = cos(a), s = inverse ? -sin(a) : sin(a);
  const ulong at = (r * all + h) * 2 * pairs + i;
  const float x0 = x[x_off + at], x1 = x[x_off + at + pairs];
  y[y_off + at] = x0 * c - x1 * s;
  y[y_off + at + pairs] = x1 * c + x0 * s;
}

// y[i, j] = table[ids[i], j]; the host has checked every id.
__kernel void embedding_f32(__global const int* ids, ulong ids_off, __global const float* table,
                            ulong t_off, __global float* y, ulong y_off, ulong m, ulong d) {
  const size_t k = get_global_id(0);
  if (k >= m * d) return;
  const ulong i = k / d, j = k % d;
  y[y_off + k] = table[t_off + (ulong)ids[ids_off + i] * d + j];
}

// dtable[ids[i], j] += dy[i, j], one item per column j, positions in order, so repeated
// ids accumulate without races and in the reference's order.
__kernel void embedding_backward_f32(__global const int* ids, ulong ids_off,
                                     __global const float* dy, ulong dy_off,
                                     __global float* dtable, ulong t_off, ulong m, ulong d) {
  const size_t j = get_global_id(0);
  if (j >= d) return;
  for (ulong i = 0; i < m; ++i)
    dtable[t_off + (ulong)ids[ids_off + i] * d + j] += dy[dy_off + i * d + j];
}

// Per row of logits [n, c]: loss = log sum exp - (x[label] - max); with_grad writes
// dlogits = (softmax - onehot) * grad_scale. The host has checked every label.
__kernel void softmax_xent_f32(__global const float* logits, ulong l_off,
                               __global const int* labels, ulong lab_off, float grad_scale,
                               __global float* losses, ulong loss_off, __global float* dlogits,
                               ulong dl_off, int with_grad, ulong n, ulong c) {
  const size_t r = get_global_id(0);
  if (r >= n) return;
  __global const float* row = logits + l_off + r * c;
  float mx = row[0];
  for (ulong j = 1; j < c; ++j) mx = fmax(mx, row[j]);
  acc_t sum = 0;
  for (ulong j = 0; j < c; ++j) sum += exp((acc_t)(row[j] - mx));
  const acc_t log_sum = log(sum);
  const int label = labels[lab_off + r];
  losses[loss_off + r] = (float)(log_sum - (row[label] - mx));
  if (!with_grad) return;
  __global float* g = dlogits + dl_off + r * c;
  for (ulong j = 0; j < c; ++j) {
    const acc_t p = exp((acc_t)(row[j] - mx) - log_sum);
    g[j] = (float)((p - (j == (ulong)label ? (acc_t)1 : (acc_t)0)) * grad_scale);
  }
}

// Softmax per row of x viewed as [n, tq, tk]; with causal, row i of each block sees keys
// [0, tk - tq + i] and the rest of its y is 0. y may alias x.
__kernel void softmax_f32(__global const float* x, ulong x_off, __global float* y, ulong y_off,
                          int causal, ulong rows, ulong tq, ulong tk) {
  const size_t r = get_global_id(0);
  if (r >= rows) return;
  __global const float* row = x + x_off + r * tk;
  __global float* out = y + y_off + r * tk;
  const ulong seen = causal ? tk - tq + r % tq + 1 : tk;
  float mx = row[0];
  for (ulong j = 1; j < seen; ++j) mx = fmax(mx, row[j]);
  acc_t sum = 0;
  for (ulong j = 0; j < seen; ++j) {
    const float e = exp(row[j] - mx);  // row may alias out: read before the write
    out[j] = e;
    sum += e;
  }
  const float inv = (float)((acc_t)1 / sum);
  for (ulong j = 0; j < seen; ++j) out[j] *= inv;
  for (ulong j = seen; j < tk; ++j) out[j] = 0.0f;
}

// dx = y * (dy - sum(dy * y)) per row; dx may alias dy.
__kernel void softmax_backward_f32(__global const float* y, ulong y_off, __global const float* dy,
                                   ulong dy_off, __global float* dx, ulong dx_off, ulong rows,
                                   ulong tk) {
  const size_t r = get_global_id(0);
  if (r >= rows) return;
  __global const float* yr = y + y_off + r * tk;
  __global const float* gr = dy + dy_off + r * tk;
  acc_t dot = 0;
  for (ulong j = 0; j < tk; ++j) dot += (acc_t)gr[j] * yr[j];
  __global float* out = dx + dx_off + r * tk;
  for (ulong j = 0; j < tk; ++j) out[j] = (float)(yr[j] * (gr[j] - dot));
}
