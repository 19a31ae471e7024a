// A generation run's stage in a worker process (core/pipeline/stage_decoder.h): stage 0
// takes the prompts (and the cancels of those whose clients left) from the coordinator,
// the last stage sends it each token; the first and last stages' outer links carry the
// chosen tokens back.
#pragma once

#include "core/comm/link.h"
#include "core/model.h"
#include "runtime/control/channel.h"
#include "runtime/control/messages.h"

namespace tandem::runtime {

void generateStage(Channel& coordinator, const Assign& a, Model& model, Link* prev, Link* next);

}  // namespace tandem::runtime
