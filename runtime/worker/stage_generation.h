// A generation run's stage in a worker process (core/pipeline/stage_decoder.h): stage 0
// takes the prompts (and the cancels of those whose clients left) from the coordinator,
// the last stage sends it each token; the first and last stages' outer links carry the
// chosen tokens back.
#pragma once

#include <vector>

#include "core/comm/link.h"
#include "core/model.h"
#include "core/pipeline/tensor_stage.h"
#include "runtime/control/channel.h"
#include "runtime/control/messages.h"

namespace tandem::runtime {

void generateStage(Channel& coordinator, const Assign& a, Model& model, Link* prev, Link* next);

// The same for a tensor-split stage after the first (onTensorDecoders,
// core/pipeline/tensor_stage.h): rank 0 sends on and reports the tokens. Unsupported for
// stage 0, whose prompts and keep-alives follow the clock.
void generateTensorStage(Channel& coordinator, const Assign& a,
                         const std::vector<TensorRank>& ranks, Link* prev, Link* next);

}  // namespace tandem::runtime
