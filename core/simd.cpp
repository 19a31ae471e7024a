#include "core/simd.h"

namespace tandem {

bool hasAvx2() {
#if TANDEM_X86
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
#else
  return false;
#endif
}

}  // namespace tandem
