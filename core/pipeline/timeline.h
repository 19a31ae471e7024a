// Timeline output of a pipeline run from the stages' spans: a Chrome trace (JSON; opens
// in Perfetto or chrome://tracing) and an SVG with a row per stage, boxes coloured by
// forward/backward and labelled by microbatch, idle time left blank.
#pragma once

#include <string>
#include <vector>

#include "core/pipeline/executor.h"

namespace tandem {

struct StageSpans {
  int stage = 0;
  std::vector<Span> spans;
  int replica = -1;  // which replica of a replicated stage (-1: the stage has one)
};

// Every span; times in microseconds from the earliest span. Stages are threads of one
// process named "stage s" (or "stage s.r", replica r of a replicated stage).
std::string chromeTrace(const std::vector<StageSpans>& stages);

// The forwards, backwards and optimizer steps within [begin_s, end_s) (steady-clock
// seconds, as in Span), scaled to `width` pixels.
std::string timelineSvg(const std::vector<StageSpans>& stages, double begin_s, double end_s,
                        int width = 1200);

}  // namespace tandem
