// Prepended to every kernel file. Accumulations run in double where the device has
// cl_khr_fp64 (the host then passes -DTANDEM_FP64), as the CPU reference does, else
// in float. No contraction of a * b + c into fma: results stay close to the reference,
// which does not contract either.
#pragma OPENCL FP_CONTRACT OFF

#ifdef TANDEM_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double acc_t;
#else
typedef float acc_t;
#endif
