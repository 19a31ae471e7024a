// The split algorithms. Each returns a plan priced by evaluate() (plan.h).
//
// exactPlan — dynamic programming over (first layer of the rest, devices the rest uses
//   counted per type, the type of the rest's first stage, stages in the rest), choosing
//   the next stage's end, replica count and the type after it. Devices of one type are
//   interchangeable, so counting them per type loses nothing (PipeEdge); knowing how many
//   stages remain gives each stage its 1F1B stash depth. Every contiguous split, device
//   order, replication and tensor split over devices of one type (CostOptions::max_tensor:
//   a stage on k devices is k replicas or k tensor ranks) is covered, so the result is
//   optimal under the cost model.
//   Time O(L^2 * T^2 * C * R * K) with L layers, T types, C = prod(n_t + 1) count
//   vectors, R = D (devices) when replicating else 1, K = max replicas; memory
//   O(L * T * C * R). A heuristic plan's objective bounds the search: a stage already
//   as slow as the best known plan ends the scan over longer stages.
//
// heuristicPlan — for a fixed sequence of (type, replicas) the best split is a smaller
//   DP over (stage, first layer), O(p * L * span). A local search over sequences
//   (swap neighbours, change a stage's type, drop or insert a stage, add or remove a
//   replica or tensor rank, make a stage tensor-split or whole, split a stage over its
//   devices and another stage's of its type, dropping that one), started from the fastest devices in speed and in node order, keeps the
//   first improvement until none is left or `max_passes` is reached.
//
// The throughput objectives minimise the slowest stage or link; kInferLatency minimises
// the sum of forward compute and link times along the chain (Neurosurgeon for k
// devices), plus the input's trip from the source device when one is named.
#pragma once

#include <string>
#include <vector>

#include "partitioner/plan.h"

namespace tandem::partitioner {

struct SearchOptions {
  std::string algorithm = "auto";  // "exact", "heuristic" or "auto"
  // auto: exact when its state count L * T * C * R is at most this.
  double exact_state_limit = 4e6;
  int max_passes = 200;  // heuristic local-search passes
};

// The exact DP's state count for `cost`, for choosing between the two.
double exactStates(const CostModel& cost);

Plan exactPlan(const CostModel& cost, const Plan* bound = nullptr);
Plan heuristicPlan(const CostModel& cost, const SearchOptions& o = {});
// The heuristic, then (within exact_state_limit, or when asked) the exact search.
Plan bestPlan(const CostModel& cost, const SearchOptions& o = {});

// The plan to run. Serving: bestPlan. Training: the search's split has the slowest stage
// as short as any, but a step also fills and drains the pipeline, and a device that
// shortens the slowest stage a little can lengthen the step (prima.cpp's Halda leaves
// such devices out). So every split is priced by its step: stepPlan's first; then, while
// it makes the predicted step (predictStep, simulate.h) no longer than kSelectionMargin
// over the fastest step priced so far, the device whose absence helps most (or costs
// least) is left out and the rest searched again, the split moved by refineByStep (one
// search per device type in use each round; at most 64 searches); then
// the whole model on each single device is priced too, the fastest of them taken when it
// is within kSelectionMargin of the fastest plan. So a device stays in the plan only when
// it is predicted to shorten the step by more than the cost model's error: never predicted
// slower than the best single device, nor more than the margin slower than the fastest
// plan found. Every device it does not use is in `left_out`, with why.
//
// Where the options choose codecs per link (CostOptions::choose_activation_codec, ...), the
// split is searched with the links at the options' codecs and at the cheapest candidate,
// each then given per-link codecs by chooseCodecs; the faster plan wins.
Plan choosePlan(const CostModel& cost, const SearchOptions& o = {});

// `plan`'s split with its cuts moved and neighbouring stages' devices swapped while the
// predicted step (predictStep, simulate.h) gets shorter: the search paces the slowest
// stage, but a step also fills and drains the pipeline and pays for every message's CPU on
// its node, so of two splits with about the same slowest stage the one sending less, or
// filling faster, wins. Each pass tries every cut at offsets 1..8 layers either way, then
// half again as far each (12, 18, ...), keeping the best place; then each neighbouring
// pair's devices swapped; passes repeat until nothing improves (at most 512 plans priced).
// Replicas' shares are balanced again for their new layers; a split a device cannot run or
// does not fit in memory is never taken. Training only; an interleaved plan (chunks > 1)
// or one stage is returned as it is. The algorithm gains " + step" when a cut moved.
Plan refineByStep(const CostModel& cost, const Plan& plan);

// Training: the shortest predicted step of the search's split (bestPlan) and the
// baselines' (baselinePlans), each moved by refineByStep; serving: bestPlan. Every device
// may be used; choosePlan then decides which to leave out.
Plan stepPlan(const CostModel& cost, const SearchOptions& o = {});

// Per-link codecs for `plan`'s split: every link starts from the most exact candidates;
// then each link in turn takes the most exact pair (activations, gradients) whose predicted
// step is within kCodecTolerance of the fastest pair's on that link (twice over the links:
// one link's choice moves the others' bottleneck). A slow link gets compressed where that
// shortens the step; a link that does not limit it stays exact. An interleaved plan's
// links are those between its stages (the last stage's to the first too), each one
// codec pair for every chunk that crosses it. Returns `plan` itself when the options
// choose no codec.
inline constexpr double kCodecTolerance = 0.02;
// How much faster a plan must be predicted to be to use more devices than another
// (choosePlan): about the cost model's mean error (docs/partitioner.md, plan fidelity:
// 14% over 59 plans). On a CPU + H200 node a CNN split predicted 2.4% faster than the GPU
// alone ran 0.76x of it; on emulated unequal nodes splits predicted 14-16% faster than the
// fast node alone ran 0.89x of it.
inline constexpr double kSelectionMargin = 0.15;
// Of plans for the same batch priced under different options (microbatch counts,
// schedules), the index of the one to run: the fewest devices among those within
// kSelectionMargin of the most samples per second, the most samples per second among
// those. choosePlan applies the margin within one set of options; this applies it across
// them, so a split at 16 microbatches predicted a little faster than one device at 1 does
// not win by less than the model's error. Plans that do not fit are never picked; -1 when
// none fits.
int pickAcrossOptions(const std::vector<const Plan*>& plans);
Plan chooseCodecs(const CostModel& cost, const Plan& plan);

// Interleaved 1F1B over `base`'s stages (two or more, one device each): the model cut
// into stages x `chunks` chunks, chunk k on stage k % p's device, the cuts chosen so the
// slowest chunk (or link between chunks) is as short as any (a DP over chunk and layer,
// O(stages x chunks x layers^2)); priced by evaluate with `chunks`, so its step is
// interleaved 1F1B's. InvalidArgument when `base` cannot be interleaved (one stage,
// replicas, fewer layers than chunks). The plan keeps `base`'s algorithm and left_out.
Plan interleavedPlan(const CostModel& cost, const Plan& base, int chunks);

// Equal layers, equal parameters and memory-proportional (exo's) splits over every
// device in the cluster's order (the first min(devices, layers) of them).
std::vector<Plan> baselinePlans(const CostModel& cost);

// InvalidArgument naming the layer, its bytes and the largest device memory when some
// layer fits on no device even alone.
void checkEveryLayerFits(const CostModel& cost);

// Why no split fits (`algorithm`: "exact", "heuristic"): the model's layers and devices,
// the bytes it holds at least (its weights, with their gradients and optimizer state when
// training) and what the devices have in all.
std::string noSplitFits(const CostModel& cost, const std::string& algorithm);

}  // namespace tandem::partitioner
