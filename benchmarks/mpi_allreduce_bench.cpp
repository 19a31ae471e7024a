// Open MPI's MPI_Allreduce (sum of fp32) for collective_bench, which starts it under
// mpirun: mpi_allreduce_bench COUNT ITERS WARMUPS [CONGESTION]. Rank 0 prints "seconds S",
// the median seconds per allreduce after WARMUPS untimed ones (what collective_bench gives
// its own), each run starting at a barrier. CONGESTION (a name, or "system" to leave them
// be): the congestion control of the rank's loopback TCP connections once the first
// allreduce has made them (the tcp BTL connects lazily), as collective_bench gives every
// other tcp column.
#include <mpi.h>

#include "benchmarks/bench_args.h"
#include "transport/context.h"
#include "transport/local_tcp.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  // The same malloc treatment as collective_bench's other workers (equal conditions).
  tandem::transport::keepFreedMemory();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc != 4 && argc != 5) {
    if (rank == 0)
      std::fprintf(stderr, "usage: mpi_allreduce_bench COUNT ITERS WARMUPS [CONGESTION]\n");
    MPI_Finalize();
    return 2;
  }
  const long count = static_cast<long>(
      tandem::bench::wholeNumber("mpi_allreduce_bench", "COUNT", argv[1], 0, (1L << 31) - 1));
  const int iters = static_cast<int>(
      tandem::bench::wholeNumber("mpi_allreduce_bench", "ITERS", argv[2], 1, 1'000'000));
  const int warmups = static_cast<int>(
      tandem::bench::wholeNumber("mpi_allreduce_bench", "WARMUPS", argv[3], 0, 1'000'000));
  std::vector<float> data(static_cast<size_t>(count));
  for (long i = 0; i < count; ++i)
    data[static_cast<size_t>(i)] = static_cast<float>((i + rank) % 7);
  std::vector<double> t;
  for (int i = 0; i < warmups + iters; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    if (i >= warmups) t.push_back(MPI_Wtime() - t0);
    if (i == 0 && argc == 5 && std::string(argv[4]) != "system") {
      tandem::transport::chooseLocalCongestionForAll(argv[4]);
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }
  std::sort(t.begin(), t.end());
  if (rank == 0) std::printf("seconds %.9f\n", t[t.size() / 2]);
  MPI_Finalize();
  return 0;
}
