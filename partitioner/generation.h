// Generation across stages (`tandem generate JOB.yaml`, `tandem serve JOB.yaml`): what a
// token costs a plan, and the plan of fewest stages within the selection margin of the
// fastest, so that splitting a model is chosen only where it is predicted faster than
// one device by more than the cost model's error.
//
// How the stages run (core/pipeline/stage_decoder.h): one stage alone decodes the
// `in_flight` sequences as one batch, a step advancing each by a token (Layer::decodeEach:
// one pass over the weights); over p stages they travel as about p batches of
// b = ceil(in_flight / p) sequences, one message per batch and step, stage s decoding the
// batch's tokens at once and sending the activations on, the last one choosing the tokens
// and sending them back to stage 0 together. Each token is also reported to the
// coordinator. So, per token:
//   decode(d, [b, e), k)  = sum over the layers of the profile's decode time at k
//                           sequences at once (DeviceCosts::decode_s at 1, decode_batch_s
//                           at decode_batch: the line through them)
//   one stage             = k sequences / (decode(d, all, k) + k x report)
//   several stages        = the least of
//                           k / (sum of decode(d_s, stage s, b) + every hop's trip)
//                           (each batch's tokens go round the ring: p hops)
//                           b / (the busiest stage's decode(d_s, stage s, b) + its ends
//                           of its messages' CPU, b reports at the last)
//                           node cores / (the node's stages' busy time x threads)
//                           (stages sharing a node's cores)
//   a hop's trip          = its node pair's link latency + b x bytes / bandwidth + the
//                           message's CPU at both ends (CostModel::messageCpu)
//   report                = the last stage's end of a message to the coordinator
// A stage's memory is serving's (its weights and one token's working set) plus the
// key/value caches of the sequences in flight (DeviceCosts::cache_bytes, for the whole
// context). What it leaves out: the prefill of each prompt (a request's first token), two
// stages on one host sharing its memory bandwidth, and the ZeroMQ I/O threads' wake-ups
// beyond the measured message CPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "partitioner/plan.h"

namespace tandem::partitioner {

struct GenerationOptions {
  int64_t in_flight = 8;  // sequences decoding at once
  // Per layer, the bytes of its output for one token (what a stage ending there sends).
  std::vector<int64_t> token_bytes;
};

// A plan's predicted generation.
struct GenerationCost {
  double tokens_per_s = 0;  // every sequence in flight together
  double token_s = 0;       // one sequence's time from one of its tokens to the next
  std::string paced_by;     // "stage 1 decode", "the ring", "node a's cores"
};

// Seconds device `device` takes to decode one token of `sequences` sequences at once
// through layers [begin, end). InvalidArgument naming the device when its profile has no
// decoding times.
double decodeSeconds(const CostModel& cost, int device, size_t begin, size_t end,
                     int64_t sequences);

// `stages`: one device each, covering the layers in order.
GenerationCost priceGeneration(const CostModel& cost, const std::vector<Assignment>& stages,
                               const GenerationOptions& o);

// A generation plan and what its choice weighed.
struct GenerationPlan {
  Plan plan;  // priced by evaluate() (memory: serving's); samples_per_s is tokens_per_s
  GenerationCost predicted;
  // The fastest plan on one device, and the fastest of several stages (tokens_per_s 0:
  // none fits or the cluster has one device), for the run to print beside the choice.
  GenerationCost best_single, best_split;
  std::vector<Assignment> best_split_stages;
};

// Every device whose profile times decoding (the others are left out), alone, and every
// sequence of 2 to 4 of them (at most 4096 sequences) with
// the layers cut where its busiest stage is least busy (a dynamic programme over the
// cuts), each priced by priceGeneration; a plan that does not fit in memory (with the
// caches of `in_flight` sequences) or puts a layer on a device that lacks its ops is not
// taken. The plan of fewest stages within
// kSelectionMargin of the most tokens per second. InvalidArgument if nothing fits, or no
// device has decoding times.
GenerationPlan planGeneration(const CostModel& cost, const GenerationOptions& o);

}  // namespace tandem::partitioner
