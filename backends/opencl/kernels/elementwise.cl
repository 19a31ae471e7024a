// Element-wise kernels over f32 buffers. A tensor is a view that may start inside its
// buffer, so every buffer comes with its element offset; n is the element count, and
// since launches round the global size up to the work-group size, each item checks
// its index.

__kernel void fill_f32(__global float* dst, ulong dst_off, ulong n, float value) {
  const size_t i = get_global_id(0);
  if (i < n) dst[dst_off + i] = value;
}

// y = alpha * x + beta * y
__kernel void axpby_f32(float alpha, __global const float* x, ulong x_off, float beta,
                        __global float* y, ulong y_off, ulong n) {
  const size_t i = get_global_id(0);
  if (i < n) y[y_off + i] = alpha * x[x_off + i] + beta * y[y_off + i];
}

// out = a * b (out may alias a or b)
__kernel void mul_f32(__global const float* a, ulong a_off, __global const float* b,
                      ulong b_off, __global float* out, ulong out_off, ulong n) {
  const size_t i = get_global_id(0);
  if (i < n) out[out_off + i] = a[a_off + i] * b[b_off + i];
}
