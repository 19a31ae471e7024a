// Pipeline schedules as data: for stage s of p with m microbatches, the ordered list of
// actions that stage runs in one step (one batch). A stage executor interprets the list;
// validateSchedule proves a set of lists complete and deadlock-free before anything runs.
//
// Conventions: microbatch numbers are 0..m-1 within a step. Sends never block (the
// transport buffers them, bounded by its high-water marks); receives wait for the
// matching send. Backwards run in ascending microbatch order in every schedule, so each
// parameter accumulates its gradient in the same order as single-device accumulation,
// which makes a pipeline bitwise equal to it.
//
// Training stages after the first split each backward: "backward k" computes the input
// gradient, "send gradient k" passes it upstream at once, and "weight gradient k" then
// accumulates the parameter gradients while the previous stage already works on it
// (the B/W split of zero-bubble pipelines, Qi et al. 2023). The first stage sends no
// gradient and runs whole backwards, but in ZB-H1, where its backward leaves the weight
// gradients of all but its first layer to their own action. In the unit-time model a
// weight gradient takes no time unless asked (validateSchedule's weight_ticks).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

enum class ActionType : uint8_t {
  kForward,
  kBackward,        // the input's gradient; with a kWeightGradient later, only that
  kWeightGradient,  // the parameter gradients of a backward already run (zero-bubble "W")
  kSendActivation,  // to stage s + 1 (with the microbatch's labels)
  kRecvActivation,  // from stage s - 1
  kSendGradient,    // to stage s - 1
  kRecvGradient,    // from stage s + 1
  kStep,            // the optimizer step, after every backward
};

struct Action {
  ActionType type;
  int64_t microbatch = 0;  // unused by kStep
  // Interleaved schedules: which of the stage's model chunks (0 for every other kind).
  // Chunk c of stage s is virtual stage c * p + s: its activations go to virtual stage
  // c * p + s + 1 (stage s + 1's chunk c, or stage 0's chunk c + 1 after the last stage).
  int32_t chunk = 0;
  bool operator==(const Action&) const = default;
};

enum class ScheduleKind : uint8_t {
  kGPipe,        // all forwards, then all backwards: stashes m microbatches
  k1F1B,         // PipeDream-Flush: p - s warm-up forwards, then alternate: stashes <= p - s
  kForwardOnly,  // inference and evaluation: forwards streamed through
  // Zero bubble H1 (Qi et al. 2023): every stage splits its backwards (the first stage's
  // too: its backward then only leaves the weight gradients) and runs a weight gradient
  // only when nothing else is ready, so input gradients go upstream first and weight
  // gradients fill what 1F1B leaves idle; each stage holds at most min(p, m) microbatches
  // until their weight gradients — 1F1B's peak, which only its first stage reaches. Built
  // by running the stages in unit time (forward, backward and weight gradient one tick
  // each) choosing, at each free tick, a backward whose gradient is in, else a forward
  // within the limit whose activation is in, else the oldest weight gradient pending.
  kZeroBubbleH1,
  // Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM): each stage holds v model
  // chunks, not one contiguous range (chunk c of stage s is virtual stage c*p + s), so a
  // forward runs in v shorter pieces and the pipeline fills v times faster: the bubble
  // falls from (p-1)/(m+p-1) to (p-1)/(v*m+p-1) of stage time. Forwards go in groups of
  // p microbatches, chunk 0's group, then chunk 1's, ...; backwards the same with the
  // chunks in reverse; stage s warms up with 2*(p-s-1) + (v-1)*p forwards, then
  // alternates, then drains. When p does not divide m the last group is smaller, and
  // where the lists would then deadlock (validateSchedule says) every forward goes first.
  // The executor runs it on stages with StageRange::chunks (jobs: `chunks:`).
  kInterleaved1F1B,
};

std::string_view scheduleName(ScheduleKind kind);
// "gpipe", "1f1b", "zb-h1", "interleaved", "forward"; InvalidArgument naming the choices
// otherwise.
ScheduleKind parseSchedule(std::string_view name);
bool isTraining(ScheduleKind kind);
// Interleaved 1F1B's warm-up at stage s of p with v chunks: 2(p-s-1) + (v-1)p forwards
// before the first backward (at most all v m of them).
int64_t interleavedWarmup(int stage, int stages, int chunks);

// Stage `stage`'s actions (0-based, of `stages`) for `microbatches` microbatches; `chunks`
// model chunks per stage (interleaved, and forward-only on interleaved stages, which then
// forwards in interleaved 1F1B's order; 1 for every other kind). InvalidArgument naming
// what is wrong.
std::vector<Action> stageActions(ScheduleKind kind, int stage, int stages, int64_t microbatches,
                                 int chunks = 1);
// Every stage's list, index = stage.
std::vector<std::vector<Action>> scheduleActions(ScheduleKind kind, int stages,
                                                 int64_t microbatches, int chunks = 1);

// "forward 3", "send gradient 0", "step"; a chunk after the first is named: "forward 3
// of chunk 1".
std::string describe(const Action& a);

struct ScheduleReport {
  // Per stage: most microbatches whose activations it held at once — forwarded and not
  // yet through their backward, or their weight gradient on a stage that splits.
  std::vector<int64_t> peak_stash;
  // Unit-time simulation (a forward takes 1 tick, a backward `backward_ticks`, a weight
  // gradient `weight_ticks` — a stage without weight gradients runs whole backwards of
  // backward_ticks + weight_ticks —, transfers are instant): per stage, per tick, the
  // compute action running (or none).
  struct Cell {
    bool busy = false;
    ActionType type = ActionType::kForward;
    int64_t microbatch = 0;
    int32_t chunk = 0;
  };
  std::vector<std::vector<Cell>> ticks;
  int64_t makespan = 0;  // ticks until the last stage finishes
  double bubble = 0;     // idle share of stages x makespan
};

// Runs the lists against each other (with chunks when an action names one: the model is
// then 1 + the largest chunk times the stages' virtual stages, each chunk of each stage
// checked as a stage of its own, the stage's clock and stash shared by its chunks).
// Throws InvalidArgument naming the stage and action if a list is incomplete (a microbatch never
// forwarded or backward, no step or two, a send without its receive or the reverse), out of order
// (a backward before its forward, a send before what it sends exists, a step before the last
// backward), or if the stages deadlock (naming each stuck stage and what it waits for). `training`
// says whether backwards and the step are required.
ScheduleReport validateSchedule(const std::vector<std::vector<Action>>& lists, int64_t microbatches,
                                bool training, int backward_ticks = 1, int weight_ticks = 0);

// The bubble each schedule's paper gives for unit ticks (forward, backward and weight
// gradient one tick each): (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(3m+p-1) for ZB-H1
// (its bubble is (p-1)(F+B-W) of stage time, against 1F1B's (p-1)(F+B+W)), and
// (p-1)/(v*m+p-1) for interleaved 1F1B with v chunks (a chunk's forward one tick).
double bubbleFormula(ScheduleKind kind, int stages, int64_t microbatches, int chunks = 1);

// Text: each stage's action list, then a diagram with stages as rows and ticks as
// columns ("F3" forward of microbatch 3, "B3" its backward, "W3" its weight gradient,
// ".." idle) — GPipe and 1F1B with a backward one tick and weight gradients inside it, as
// their papers draw them; ZB-H1 with weight gradients a tick of their own (and the first
// stage's whole backward two) — then the bubble beside the formula.
// Interleaved: a cell names the chunk by a letter after the microbatch ("F3a", "B3b").
std::string renderSchedule(ScheduleKind kind, int stages, int64_t microbatches, int chunks = 1);

}  // namespace tandem
