// The Google Benchmark binaries' main: BENCHMARK_MAIN's, after the restart onto faster
// OpenBLAS kernels that tandem's own programs make (backends/cpu/blas_core.h), so that a
// benchmark measures the kernels the product runs.
#include <benchmark/benchmark.h>
#include "backends/cpu/blas_core.h"

int main(int argc, char** argv) {
  tandem::cpu::useFasterBlasCore(argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
