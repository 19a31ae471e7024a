// Which OpenBLAS kernels the process runs, and a restart onto faster ones.
//
// OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernel set ("core") once, while
// the library loads, before main, from the CPU's model number. A model it does not know
// gets a fallback: Debian 12's 0.3.21 gave a virtualised Intel Xeon that runs AVX-512
// ("Intel(R) Xeon(R) Processor") the Prescott set, SSE3 only, at a fraction of the sgemm
// rate its SkylakeX set reaches there (docs/benchmarks.md). The only way to choose is
// OPENBLAS_CORETYPE, read at load; so a program restarts itself once with that variable
// set, at the top of main, before it starts a thread, when the CPU runs a wider
// instruction set than the loaded kernels use. Child processes (stage processes, a
// daemon's workers) inherit the variable and load the same set: the processes of a run on
// one host compute bitwise alike. A set someone named in OPENBLAS_CORETYPE is kept.
#pragma once

#include <string>

namespace tandem::cpu {

// The vector instruction classes OpenBLAS's x86-64 kernel sets are written for.
enum class VectorClass { kSse = 0, kAvx = 1, kAvx2 = 2, kAvx512 = 3 };

// What decides the choice: read from the process (blasCoreFacts) or given by a test.
struct BlasCoreFacts {
  std::string loaded_core;              // openblas_get_corename(): "Prescott", "Haswell", ...
  bool dynamic_arch = false;            // the library holds several sets (DYNAMIC_ARCH)
  VectorClass cpu = VectorClass::kSse;  // the widest class the CPU and OS run
  bool core_requested = false;          // OPENBLAS_CORETYPE is set (by a user or a restart)
};

BlasCoreFacts blasCoreFacts();

// The class a kernel set (as openblas_get_corename() names it) is written for.
VectorClass coreClass(const std::string& core);

// The OPENBLAS_CORETYPE value to restart with, or "" to keep the loaded set: the set for
// the CPU's class (SKYLAKEX, HASWELL, SANDYBRIDGE) where the loaded set's class is lower,
// the library can switch, and nobody has named a set.
std::string fasterBlasCore(const BlasCoreFacts& facts);

// Call first thing in main, before any thread exists: restarts the program
// (/proc/self/exe, the same argv and environment plus OPENBLAS_CORETYPE) when
// fasterBlasCore names a set, else returns. If the restart fails it says so on stderr
// and returns: the program runs on, on the loaded set. A no-op off x86-64.
void useFasterBlasCore(char** argv);

// The kernel set this process runs (openblas_get_corename()).
std::string blasCoreName();

}  // namespace tandem::cpu
