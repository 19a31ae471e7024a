// Seeded synthetic partitioning problems: layers of random size and cost, devices of a
// few kinds (speed and memory) spread over nodes, and a random link matrix. The tests
// check the algorithms on them and the planning benchmark times them; researchers can
// use them to study splits without a cluster.
#pragma once

#include <cstdint>

#include "partitioner/problem.h"

namespace tandem::partitioner {

struct RandomProblemOptions {
  int layers = 8;
  int devices = 3;
  int kinds = 3;  // devices are copies of this many kinds (speed, memory)
  int nodes = 3;  // devices are spread over this many nodes, round robin
  // Device memory as a multiple of what the whole model needs on one device: below 1
  // the model must be split.
  double memory_min = 0.3, memory_max = 2.0;
  uint64_t seed = 1;
  CostOptions cost;
};

Problem randomProblem(const RandomProblemOptions& o);

}  // namespace tandem::partitioner
