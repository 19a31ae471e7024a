#include "partitioner/simulate.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/error.h"

namespace tandem::partitioner {

namespace {

// Steps simulated back to back: the first fills an empty pipeline with empty burst
// budgets, which idle stages refill; the last one's length is the steady step.
constexpr int kSteps = 5;
// Rounds of the node-sharing fixed point (predictStep) at most.
constexpr int kSharingRounds = 12;
// What the messages leave of a node's cores at the least, as a share: a node whose messages
// alone would take every core still computes, slowly (and the step says so).
constexpr double kLeastCoresLeft = 0.05;

// One direction of a link between neighbouring stages: messages queue, one on the wire at
// a time.
struct Wire {
  double free_at = 0;
  double seconds_per_byte = 0, latency_s = 0;
  // Sends `bytes` at `now`: when it arrives.
  double send(double now, double bytes) {
    const double start = std::max(now, free_at);
    free_at = start + bytes * seconds_per_byte;
    return free_at + latency_s;
  }
};

// A device's burst budget (DeviceCosts::burst_ratio, burst_budget_s): a token bucket of
// full-speed seconds, refilled at `ratio` per second up to `capacity`, drained while it
// runs at full speed; empty, it runs at the sustained rate. `refill` (at most 1) is the
// share of the quota's refill left to compute: the node's messages spend the rest.
struct Burst {
  double ratio = 1, capacity = 0, tokens = 0, last = 0, refill = 1;
  bool bursts() const { return ratio < 1 && capacity > 0; }
  // Wall seconds for `work` sustained seconds of compute starting at `now`.
  double run(double now, double work) {
    if (!bursts()) return work;
    const double r = ratio * refill;  // what the quota gives compute, per second
    tokens = std::min(capacity, tokens + r * std::max(0.0, now - last));
    const double burst = work * ratio;  // full-speed seconds it needs
    double wall = burst;
    if (tokens >= burst * (1 - r)) {
      tokens -= burst * (1 - r);
    } else {
      const double fast = tokens / (1 - r);  // full-speed seconds the budget covers
      wall = fast + (burst - fast) / r;
      tokens = 0;
    }
    last = now + wall;
    return wall;
  }
};

// One model chunk of a stage (every stage has one, an interleaved stage several).
struct Chunk {
  // Sustained seconds of compute per microbatch.
  double forward = 0, backward = 0, weight = 0;
  double out_bytes = 0, in_bytes = 0;  // activation sent on, gradient sent back (wire bytes)
  // Seconds the stage's thread spends sending each (CostModel::sendTime): the wire
  // starts after it, and the stage's next action waits for it.
  double out_send_s = 0, in_send_s = 0;
};

struct Stage {
  std::vector<Chunk> chunks;
  // Sustained seconds once per step: the replicas' allreduce and the optimizer's update.
  double step = 0, update = 0;
  // To the next stage, to the one before; an interleaved plan's stages are a ring (the
  // last stage's chunks pass on to the first stage's next chunks).
  Wire next, prev;
  Burst burst;
  std::vector<Action> actions;  // kSteps steps, microbatches numbered on across them
  int node = 0;
  double threads = 0;  // of its node's cores, while it computes (DeviceCosts::host_threads)
};

// One run of the stages' lists: when each step ended (its last stage to finish), and each
// stage's compute time in them. `stretch` multiplies each stage's compute (sharing).
struct Run {
  std::vector<double> ends;
  std::vector<double> busy;
};

Run runStages(std::vector<Stage> st, int64_t m, const std::vector<double>& stretch,
              ScheduleKind schedule) {
  const int p = static_cast<int>(st.size());
  std::vector<size_t> pc(st.size(), 0);
  std::vector<double> clock(st.size(), 0);
  Run r{std::vector<double>(kSteps, 0), std::vector<double>(st.size(), 0)};
  std::vector<int> steps_done(st.size(), 0);
  // When each message arrives (-1: not sent yet), per virtual stage (chunk c of stage s
  // is c * p + s): activations into it, gradients into it (from the one after).
  const size_t chunks = st.front().chunks.size();
  const auto all = static_cast<size_t>(kSteps * m);
  std::vector<std::vector<double>> act(st.size() * chunks, std::vector<double>(all, -1));
  std::vector<std::vector<double>> grad = act;
  // Runs stage s's next action; false when it waits for a message not yet sent.
  auto advance = [&](int s) {
    const auto i = static_cast<size_t>(s);
    Stage& x = st[i];
    double& now = clock[i];
    const Action& a = x.actions[pc[i]];
    const auto k = static_cast<size_t>(a.microbatch);
    const auto c = static_cast<size_t>(a.chunk);
    const size_t v = c * st.size() + i;  // the virtual stage
    const Chunk& h = x.chunks[c];
    double work = -1;
    switch (a.type) {
      case ActionType::kRecvActivation:
        if (act[v][k] < 0) return false;
        now = std::max(now, act[v][k]);
        break;
      case ActionType::kRecvGradient:
        if (grad[v][k] < 0) return false;
        now = std::max(now, grad[v][k]);
        break;
      case ActionType::kSendActivation:
        now += h.out_send_s;
        act[v + 1][k] = x.next.send(now, h.out_bytes);
        break;
      case ActionType::kSendGradient:
        now += h.in_send_s;
        grad[v - 1][k] = x.prev.send(now, h.in_bytes);
        break;
      case ActionType::kForward:
        work = h.forward;
        break;
      case ActionType::kBackward:
        work = h.backward;
        break;
      case ActionType::kWeightGradient:
        work = h.weight;
        break;
      case ActionType::kStep:
        now += x.step;  // waiting on the other replicas, not computing
        work = x.update;
        break;
    }
    if (work >= 0) {
      const double wall = x.burst.run(now, work * stretch[i]);
      now += wall;
      r.busy[i] += wall;
    }
    if (a.type == ActionType::kStep) {
      r.ends[static_cast<size_t>(steps_done[i])] =
          std::max(r.ends[static_cast<size_t>(steps_done[i])], now);
      ++steps_done[i];
    }
    ++pc[i];
    return true;
  };
  // Sends never block, so running every stage as far as it can, in turns, completes
  // (the schedules are validated deadlock-free; a stuck round means a bad list).
  for (;;) {
    bool progress = false, done = true;
    for (int s = 0; s < p; ++s) {
      const auto i = static_cast<size_t>(s);
      while (pc[i] < st[i].actions.size() && advance(s)) progress = true;
      done = done && pc[i] == st[i].actions.size();
    }
    if (done) break;
    TANDEM_CHECK_MSG(progress, InvalidArgument,
                     "predictStep: the " << scheduleName(schedule) << " lists for " << p
                                         << " stages do not complete");
  }
  return r;
}

// The plan's stages (p of them; an interleaved plan's chunks grouped by stage) with their
// chunks' times, the wires between them, and kSteps steps of `schedule`'s lists.
std::vector<Stage> planStages(const CostModel& cost, const Plan& plan, int p, int64_t m,
                              ScheduleKind schedule) {
  const int chunks = plan.chunks;
  const int n = static_cast<int>(plan.stages.size());
  std::vector<Stage> st(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) {
    Stage& x = st[static_cast<size_t>(s)];
    const PlanStage& first = plan.stages[static_cast<size_t>(s)];
    // Unequal replicas (shares) run at the pace of the one whose part of a round is
    // slowest, on its node; equal ones share each microbatch k ways.
    // A tensor-split stage runs each microbatch on all its ranks at once, each its part.
    const std::vector<int> types = cost.typesOf(first.at.devices);
    const CostModel::Pace pace =
        first.at.tensor           ? CostModel::Pace{0, 1}
        : first.at.shares.empty() ? CostModel::Pace{0, 1 / static_cast<double>(types.size())}
                                  : cost.pace(types, first.at.shares, first.at.begin, first.at.end);
    const int t = types[static_cast<size_t>(pace.replica)];
    const double k = 1 / pace.factor;
    const std::vector<Action> one = stageActions(schedule, s, p, m, chunks);
    const bool splits = std::any_of(one.begin(), one.end(), [](const Action& a) {
      return a.type == ActionType::kWeightGradient;
    });
    x.chunks.resize(static_cast<size_t>(chunks));
    for (int c = 0; c < chunks; ++c) {
      const PlanStage& ps = plan.stages[static_cast<size_t>(c * p + s)];
      Chunk& h = x.chunks[static_cast<size_t>(c)];
      if (ps.at.tensor) {  // interleaved stages are never split: one chunk
        const CostModel::TensorStage ts =
            cost.tensorStage(types, ps.at.shares, ps.at.begin, ps.at.end);
        h.forward = ts.forward;
        h.weight = splits ? ts.weight - ts.first_weight : 0;
        h.backward = ts.backward - h.weight;
        x.update += ts.update;
        continue;
      }
      h.forward = cost.forward(t, ps.at.begin, ps.at.end) / k;
      const double whole = cost.backward(t, ps.at.begin, ps.at.end) / k;
      h.weight = splits ? cost.deferredWeightGradient(t, ps.at.begin, ps.at.end) / k : 0;
      h.backward = whole - h.weight;
      if (ps.at.shares.empty()) {
        x.step += cost.allreduce(t, ps.at.begin, ps.at.end, static_cast<int>(ps.at.devices.size()));
        x.update += cost.update(t, ps.at.begin, ps.at.end);
      } else {  // every replica updates its copy; the step waits for the slowest
        x.step += cost.allreduce(types, ps.at.begin, ps.at.end);
        x.update += cost.update(types, ps.at.begin, ps.at.end);
      }
    }
    const DeviceCosts& d = cost.deviceOf(t);
    // The budget starts empty: a stage kept busy never refills it, one that idles does
    // within a step, and the last step is measured.
    x.burst = {d.burst_ratio, d.burst_budget_s, 0, 0, 1};
    x.node = d.node;
    // Its times are what it sustains on the node (under a CPU quota, at the quota's rate):
    // computing, it keeps at most the node's cores busy, however many threads it has.
    const double cores = cost.nodeCores(d.node);
    // A tensor-split stage's ranks compute at once, each its own device's threads (each
    // profiled alone there): two one-thread ranks on one core take twice their times. A
    // CPU profiled with neighbours beside it (host_threads 0) has them in its times, but
    // not its own stage's other ranks: they count its threads.
    auto threads = [&](const DeviceCosts& r) {
      const double own =
          first.at.tensor && r.host_threads == 0 && r.backend == "cpu" ? r.threads : r.host_threads;
      return cores > 0 ? std::min(own, cores) : own;
    };
    x.threads = 0;
    for (const int u : first.at.tensor ? types : std::vector<int>{t})
      x.threads += threads(cost.deviceOf(u));
    for (int step = 0; step < kSteps; ++step)
      for (Action a : one) {
        a.microbatch += step * m;
        x.actions.push_back(a);
      }
  }
  // The wires between neighbouring chunks: each stage's to the next (the last stage's to
  // the first, for an interleaved plan's next chunks) and back.
  for (int v = 0; v + 1 < n; ++v) {
    const PlanStage& ps = plan.stages[static_cast<size_t>(v)];
    Stage& x = st[static_cast<size_t>(v % p)];
    Stage& y = st[static_cast<size_t>((v + 1) % p)];
    const int t = cost.typeOf(ps.at.devices.front());
    const int u = cost.typeOf(plan.stages[static_cast<size_t>(v + 1)].at.devices.front());
    const LinkCosts& there = cost.linkCosts(t, u);
    const LinkCosts& back = cost.linkCosts(u, t);
    const auto bytes = static_cast<double>(cost.problem().layers[ps.at.end - 1].output_bytes);
    Chunk& out = x.chunks[static_cast<size_t>(v / p)];
    out.out_bytes = bytes * ps.next.activation_ratio;
    out.out_send_s = cost.sendTime(x.node, out.out_bytes);
    x.next = {0, 1 / there.bandwidth, there.latency_s};
    Chunk& in = y.chunks[static_cast<size_t>((v + 1) / p)];
    in.in_bytes = bytes * ps.next.gradient_ratio;
    in.in_send_s = cost.sendTime(y.node, in.in_bytes);
    y.prev = {0, 1 / back.bandwidth, back.latency_s};
  }
  return st;
}

}  // namespace

StepPrediction predictStep(const CostModel& cost, const Plan& plan) {
  return predictStep(cost, plan, cost.options().schedule);
}

StepPrediction predictStep(const CostModel& cost, const Plan& plan, ScheduleKind schedule) {
  TANDEM_CHECK_MSG(cost.training(), InvalidArgument,
                   "a training step is predicted for the training objective only");
  TANDEM_CHECK_MSG(isTraining(schedule), InvalidArgument,
                   "a training step needs a training schedule, not " << scheduleName(schedule));
  const CostOptions& o = cost.options();
  const int chunks = plan.chunks;
  const int n = static_cast<int>(plan.stages.size());  // virtual stages (chunks)
  TANDEM_CHECK_MSG(n > 0 && chunks >= 1 && n % chunks == 0, InvalidArgument,
                   "a plan of " << n << " stages in chunks of " << chunks);
  const int p = n / chunks;
  // An interleaved plan runs interleaved 1F1B whatever the options say; one chunk per
  // stage is 1F1B.
  if (chunks > 1) schedule = ScheduleKind::kInterleaved1F1B;
  if (chunks == 1 && schedule == ScheduleKind::kInterleaved1F1B) schedule = ScheduleKind::k1F1B;
  const int64_t m = o.microbatches;
  std::vector<Stage> st = planStages(cost, plan, p, m, schedule);
  // The messages' CPU on each node per step (CostModel::messageCpuAtEnd): each link
  // between chunks carries m activations and m gradients, each end's node charged for its
  // own end of each.
  std::vector<double> messages(cost.problem().node_names.size(), 0);
  for (int v = 0; v + 1 < n; ++v) {
    const Stage& x = st[static_cast<size_t>(v % p)];
    const Stage& y = st[static_cast<size_t>((v + 1) % p)];
    const int a = x.node, z = y.node;
    const double mb = static_cast<double>(m);
    // The activation goes a -> z, its gradient z -> a.
    const double forward = x.chunks[static_cast<size_t>(v / p)].out_bytes;
    const double backward = y.chunks[static_cast<size_t>((v + 1) / p)].in_bytes;
    for (const auto& [bytes, from, to] : {std::tuple{forward, a, z}, std::tuple{backward, z, a}}) {
      messages[static_cast<size_t>(a)] += mb * cost.messageCpuAtEnd(a, from, to, bytes);
      messages[static_cast<size_t>(z)] += mb * cost.messageCpuAtEnd(z, from, to, bytes);
    }
  }
  // Stages on one node's host devices share its cores, with the messages' CPU there: when
  // the threads they keep busy, over a step on average, outnumber the cores, each computes
  // that much slower. The slowdown changes the step, which changes how busy they are: a
  // few damped rounds.
  std::vector<double> stretch(static_cast<size_t>(p), 1.0);
  Run run = runStages(st, m, stretch, schedule);
  for (int round = 0; round < kSharingRounds; ++round) {
    const double step = run.ends[kSteps - 1] - run.ends[kSteps - 2];
    if (!(step > 0)) break;
    // Threads present on each node on average (processor sharing: a stretched action
    // keeps its threads there longer, each getting a share of the cores). The messages'
    // CPU comes off the cores first (the transport's threads wake, do a little and sleep
    // again, which the scheduler serves before a thread that computes on): the stages
    // share what is left of them.
    std::vector<double> demand(messages.size(), 0);
    for (size_t s = 0; s < st.size(); ++s)
      demand[static_cast<size_t>(st[s].node)] += run.busy[s] / kSteps / step * st[s].threads;
    bool changed = false;
    for (size_t s = 0; s < st.size(); ++s) {
      const auto node = static_cast<size_t>(st[s].node);
      const double cores = cost.nodeCores(st[s].node);
      const double left = std::max(cores - messages[node] / step, kLeastCoresLeft * cores);
      // Under a quota the budget's refill pays for the messages (what they leave of the
      // quota refills it); elsewhere they stretch the stages' compute.
      Burst& burst = st[s].burst;
      const double shared = burst.bursts() ? cores : left;
      const double want =
          cores > 0 && st[s].threads > 0 ? std::max(1.0, demand[node] / shared) : 1.0;
      const double next = 0.5 * (stretch[s] + want);
      changed = changed || std::abs(next - stretch[s]) > 1e-3 * stretch[s];
      stretch[s] = next;
      if (burst.bursts() && cores > 0) {
        const double refill = 0.5 * (burst.refill + left / cores);
        changed = changed || std::abs(refill - burst.refill) > 1e-3 * burst.refill;
        burst.refill = refill;
      }
    }
    if (!changed) break;
    run = runStages(st, m, stretch, schedule);
  }
  StepPrediction r;
  r.step_s = run.ends[kSteps - 1] - run.ends[kSteps - 2];
  double busy = 0;
  for (const double b : run.busy) {
    r.busy_s.push_back(b / kSteps);
    busy += b / kSteps;
  }
  r.samples_per_s = r.step_s > 0 ? static_cast<double>(m * o.microbatch_size) / r.step_s : 0;
  r.bubble = r.step_s > 0 ? std::max(0.0, 1 - busy / (p * r.step_s)) : 0;
  return r;
}

}  // namespace tandem::partitioner
