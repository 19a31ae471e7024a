// The settings a job file states and every one of its workers' assignments carries, each
// one struct: JobSpec (job.h) holds them as the job says, Assign (messages.h) as the
// worker runs them; stage_messages.cpp encodes and decodes each once.
#pragma once

#include <cstdint>
#include <string>

#include "core/optimizer.h"
#include "core/pipeline/schedule.h"
#include "core/wire_codec.h"

namespace tandem::runtime {

// How the run trains (a serving run keeps the batch and microbatches).
struct TrainSettings {
  int64_t epochs = 1;
  int64_t batch = 64;
  int64_t microbatches = 4;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  bool recompute = false;
  uint64_t seed = 1;
  OptimizerOptions optimizer;
  bool operator==(const TrainSettings&) const = default;
};

// Where the samples come from, read where the first stage runs.
struct DataSettings {
  std::string name = "fashion-mnist";       // or "text:PATH" (a language model)
  std::string dir;                          // empty: the Debian package's directory
  int64_t train_limit = 0, test_limit = 0;  // > 0: only the first so many samples
  bool operator==(const DataSettings&) const = default;
};

// What a stage's links carry and how long their blocking calls wait. In an assignment,
// `activations` is what its link to the next stage carries and `gradients` what its link
// to the previous one does; in a job, what every link carries unless the plan chooses.
struct WireSettings {
  WireCodec activations = WireCodec::kRaw, gradients = WireCodec::kRaw;
  int64_t timeout_s = 60;
  bool operator==(const WireSettings&) const = default;
};

}  // namespace tandem::runtime
