// Training-step cases shared by the benchmark binary and the peer comparison: the model
// (a spec inline or a file under examples/models), the batch, and the thread counts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::bench {

struct StepCase {
  std::string name;       // also the PyTorch peer's model name
  std::string spec_yaml;  // the model spec
  int64_t batch;
};

// 784-1024-1024-10 MLP (not an example model; only the benchmark uses it).
inline const char* kMlpWideYaml = R"(name: mlp-wide
input: [1, 28, 28]
layers:
  - flatten
  - linear: {out: 1024}
  - relu
  - linear: {out: 1024}
  - relu
  - linear: {out: 10}
)";

}  // namespace tandem::bench
