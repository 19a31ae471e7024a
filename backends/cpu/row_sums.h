// A row's sum in one fixed order, for the kernels that reduce (bias gradients): 8 running
// float sums (element i into lane i mod 8, in i's order) added up in double. The same in
// every clone (AVX2 or not) and whatever the thread count, so it vectorises without
// depending on the CPU.
#pragma once

#include <cstdint>

namespace tandem::cpu {

double sum8(const float* x, int64_t n);

}  // namespace tandem::cpu
