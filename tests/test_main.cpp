// Every test binary's main. The programs the tests start (tandem, tandemd, stage
// processes) restart onto faster OpenBLAS kernels where the CPU runs wider instructions
// than OpenBLAS picked (backends/cpu/blas_core.h); the tests' own computations must run
// the same kernels to compare bitwise with theirs, so a test binary restarts the same way.
#include <gtest/gtest.h>
#include "backends/cpu/blas_core.h"

int main(int argc, char** argv) {
  tandem::cpu::useFasterBlasCore(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
