#include "backends/cpu/blas_core.h"
#include <cblas.h>
#include <unistd.h>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tandem::cpu {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

VectorClass cpuClass() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  // libgcc's checks include the OS saving the wider registers (XCR0), not only CPUID.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return VectorClass::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return VectorClass::kAvx2;
  if (__builtin_cpu_supports("avx")) return VectorClass::kAvx;
#endif
  return VectorClass::kSse;
}

}  // namespace

VectorClass coreClass(const std::string& core) {
  const std::string c = lower(core);
  for (const char* name : {"skylakex", "cooperlake", "sapphirerapids"})
    if (c == name) return VectorClass::kAvx512;
  for (const char* name : {"haswell", "zen"})
    if (c == name) return VectorClass::kAvx2;
  for (const char* name : {"sandybridge", "bulldozer", "piledriver", "steamroller", "excavator"})
    if (c == name) return VectorClass::kAvx;
  return VectorClass::kSse;  // Prescott, Core2, Penryn, Nehalem, Atom, Opteron, Barcelona, ...
}

BlasCoreFacts blasCoreFacts() {
  BlasCoreFacts f;
  f.loaded_core = blasCoreName();
  const char* config = openblas_get_config();
  f.dynamic_arch = config != nullptr && std::strstr(config, "DYNAMIC_ARCH") != nullptr;
  f.cpu = cpuClass();
  f.core_requested = std::getenv("OPENBLAS_CORETYPE") != nullptr;
  return f;
}

std::string fasterBlasCore(const BlasCoreFacts& facts) {
  if (!facts.dynamic_arch || facts.core_requested) return "";
  if (static_cast<int>(coreClass(facts.loaded_core)) >= static_cast<int>(facts.cpu)) return "";
  switch (facts.cpu) {
    case VectorClass::kAvx512:
      return "SKYLAKEX";
    case VectorClass::kAvx2:
      return "HASWELL";
    case VectorClass::kAvx:
      return "SANDYBRIDGE";
    case VectorClass::kSse:
      break;
  }
  return "";
}

void useFasterBlasCore(char** argv) {
#if defined(__x86_64__)
  if (argv == nullptr || argv[0] == nullptr) return;
  const std::string core = fasterBlasCore(blasCoreFacts());
  if (core.empty() || setenv("OPENBLAS_CORETYPE", core.c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Still here: the restart failed. Run on with what is loaded (children too), and say so.
  const int error = errno;
  unsetenv("OPENBLAS_CORETYPE");
  std::fprintf(stderr,
               "%s: could not restart with OPENBLAS_CORETYPE=%s (%s); running on OpenBLAS's "
               "%s kernels\n",
               argv[0], core.c_str(), std::strerror(error), blasCoreName().c_str());
#else
  (void)argv;
#endif
}

std::string blasCoreName() {
  const char* name = openblas_get_corename();
  return name != nullptr ? std::string(name) : std::string("unknown");
}

}  // namespace tandem::cpu
