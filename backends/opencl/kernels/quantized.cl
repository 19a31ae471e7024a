// Products with int8 weights (gemmQ8): y[m, n] = sum over groups g of scales[n, g] times
// the group's sum of x[m, k] w[n, k], one item per output, the groups in order.
__kernel void gemm_q8_f32(__global const float* x, ulong x_off, __global const char* w,
                          ulong w_off, __global const float* scales, ulong s_off,
                          __global float* y, ulong y_off, ulong m, ulong n, ulong k,
                          ulong group) {
  const size_t item = get_global_id(0);
  if (item >= m * n) return;
  const ulong row = item / n, col = item % n;
  __global const float* xr = x + x_off + row * k;
  __global const char* wr = w + w_off + col * k;
  __global const float* sr = scales + s_off + col * (k / group);
  float total = 0.0f;
  for (ulong g0 = 0, gi = 0; g0 < k; g0 += group, ++gi) {
    float sum = 0.0f;
    for (ulong i = g0; i < g0 + group; ++i) sum += xr[i] * (float)wr[i];
    total += sum * sr[gi];
  }
  y[y_off + item] = total;
}
