// The cost model: what a stage (a contiguous layer range on one device type, maybe
// replicated) costs in time per microbatch and in memory per device, and what a link
// between two stages costs. Every algorithm (exact, heuristic, baselines, brute force
// in the tests) prices plans through this one class, so their objectives compare exactly.
//
// Devices that are interchangeable — same node, same memory, same per-layer times — form
// a type; the exact search counts devices per type instead of naming them (PipeEdge).
//
// Time per microbatch (seconds):
//   compute(t, [b, e))   = sum of forward (+ backward when training) times on type t
//                          (infinite where t lacks an op of one of the layers)
//   stage(t, [b, e), k)  = compute / k + (allreduce + update) / m
//                          (k replicas, m microbatches; update: the optimizer's, once a
//                          step over the stage's parameters, on every replica)
//   allreduce            = ring over the k replicas' node link:
//                          2(k-1)/k * gradient bytes / bandwidth + 2(k-1) * latency
//   link(e, u -> v)      = out bytes * activation ratio / bandwidth + latency
//                          (+ the same for the gradient coming back when training)
// The pipeline's pace is its slowest stage or link (they run concurrently); latency is
// the sum along the chain instead.
//
// Memory per device (bytes), training:
//   weights + gradients + optimizer state (a multiple of the weights)
//   + in-flight microbatches' stash: m for GPipe, min(m, r) for 1F1B where r counts the
//     stages from this one to the last, min(m, p) for ZB-H1 (every stage holds up to what
//     1F1B's first does); each is what the layers keep for backward (with
//     recompute: the stage input only, plus one microbatch's stash while recomputing);
//     a replica holds ceil(in-flight / k) of them; of these, the one whose backward runs
//     holds at its peak, instead of its whole stash, the stash of the layers up to the
//     one running, that layer's input and output gradients and its scratch (the largest
//     over the stage's layers: a CNN's widest activation, twice)
//   + transport buffers: `transport_buffers` messages per direction on each link.
// Serving: weights + the largest layer input + output (+ its scratch) + transport buffers.
//
// A tensor-split stage (Assignment::tensor): layers [b, e) over k ranks on one node,
// threads of one process, rank r with its share f_r of every split layer's features (1/k
// each on devices of one type; by speed on unequal ones: CostModel::balancedTensorShares)
// (core/layers/tensor_split.h; what splits: Problem::tensor_roles). Per microbatch, each
// layer taking its slowest rank's part (the ranks meet at every all-reduce):
//   forward   = whole layers' forward + split layers' forward x f_r
//               + one group all-reduce of each row layer's output and, per block,
//               tensor_allreduces of its output
//   backward  = the same of the backward, the all-reduces of each column layer's input
//               gradient (none where the first stage computes none) and the blocks'
//   update    = the whole layers' and f_r of the split layers' parameters, the slowest rank's
//   memory    = rank r's: as one device, less (1 - f_r) of the split layers' weights,
//               gradients and optimizer state (their stash is priced whole: a column part
//               keeps its whole input), against its own device
//   all-reduce of B bytes = the node's measured line fixed + per_byte * B at 2 ranks, the
//               fixed part (the ranks' meetings) times k - 1 for k ranks; not measured:
//               the ring above over the node's `local` link.
#pragma once

#include <cstdint>
#include <vector>

#include "partitioner/problem.h"

namespace tandem::partitioner {

struct DeviceType {
  std::vector<int> devices;  // indices into Problem::devices, ascending
  int node = 0;
  int64_t memory_bytes = 0;
};

class CostModel {
 public:
  explicit CostModel(Problem problem);  // validates it

  const Problem& problem() const { return problem_; }
  const CostOptions& options() const { return problem_.options; }
  size_t layers() const { return problem_.layers.size(); }
  const std::vector<DeviceType>& types() const { return types_; }
  // A type's first device (every device of a type has the same costs).
  const DeviceCosts& deviceOf(int type) const;
  int typeOf(int device) const { return type_of_[static_cast<size_t>(device)]; }
  // The types of a stage's devices (its replicas'), in order.
  std::vector<int> typesOf(const std::vector<int>& devices) const;
  bool training() const { return options().objective == Objective::kTrainThroughput; }

  // Whether type `type` runs every layer of [begin, end) (DeviceCosts::lacks); where it
  // does not, compute() and stage() are infinite, so a search never chooses it.
  bool runs(int type, size_t begin, size_t end) const;
  // "layer 3 (linear): lacks gemm on i8" for the first layer of [begin, end) it cannot
  // run; "" when it runs them all.
  std::string lacking(int type, size_t begin, size_t end) const;
  // `tensor` > 1 in these: the stage tensor-split over that many ranks of `type` (above);
  // infinite where nothing in [begin, end) splits or a layer has fewer features than ranks
  // is not known here (the run refuses it: checkTensorSplit).
  double compute(int type, size_t begin, size_t end, int tensor = 1) const;
  // The parts of compute, one microbatch on one device: the layers' forward (with the
  // loss on the last layer), their whole backward, and of that backward the share that
  // computes parameter gradients ("weight gradient", which stages after the first run
  // after sending the input's gradient on). Profiles time whole backwards; a layer with
  // parameters is taken to spend half of it on them (the weight GEMM is as large as the
  // input's), a layer without none. A range from layer 0 (the first stage) computes no
  // input gradient below firstWhole(): the layers before it run no backward, and it runs
  // its backward without the input gradient (DeviceCosts::first_backward_s), whole —
  // Sequence::backward and backwardInput in core/layers/sequence.h. (A model without
  // parameters, which trains nothing, is priced as its profile times it.)
  double forward(int type, size_t begin, size_t end, int tensor = 1) const;
  double backward(int type, size_t begin, size_t end, int tensor = 1) const;
  double weightGradient(int type, size_t begin, size_t end, int tensor = 1) const;
  // Of that, what a schedule that splits the backward runs after sending the input's
  // gradient on: all of it, but the first stage runs its first layers whole in the
  // backward, through the first with parameters (firstWhole()).
  double deferredWeightGradient(int type, size_t begin, size_t end, int tensor = 1) const;
  // What a tensor split of [begin, end) makes of each of its layers: Problem::tensor_roles
  // from `begin`, a pair whose row layer lies at or past `end` whole; all whole when the
  // problem has no roles.
  std::vector<TensorKind> tensorRoles(size_t begin, size_t end) const;
  bool tensorSplits(size_t begin, size_t end) const;
  // One all-reduce of `bytes` among `ranks` ranks of a tensor group on node `node`.
  double groupAllreduce(int node, double bytes, int ranks) const;
  // A tensor-split stage of layers [begin, end) over ranks on devices of `types` (one per
  // rank, all on one node), each with its `shares` of every split layer's features (one
  // per rank; empty: equal), per microbatch as above; `forward` and `backward` include
  // their all-reduces.
  struct TensorStage {
    double forward = 0, backward = 0, weight = 0;
    double first_weight = 0;  // of `weight`, the first stage's first layer with parameters'
    double allreduce_forward = 0, allreduce_backward = 0;
    double update = 0;        // once a step, the slowest rank's (0 when not serving)
    int64_t split_state = 0;  // the split layers' weights, with gradients and state training
    bool splits = false;      // something in the range splits
    double compute(bool training) const { return forward + (training ? backward : 0); }
  };
  TensorStage tensorStage(const std::vector<int>& types, const std::vector<double>& shares,
                          size_t begin, size_t end) const;
  // A tensor-split stage's all-reduces per microbatch (equal ranks): forward's and backward's.
  double tensorAllreduce(int type, size_t begin, size_t end, int tensor) const;
  // Shares that make every rank's part of [begin, end)'s split layers take equal time: in
  // proportion to each one's speed on them, the fastest's 1.
  std::vector<double> balancedTensorShares(const std::vector<int>& types, size_t begin,
                                           size_t end) const;
  double allreduce(int type, size_t begin, size_t end, int replicas) const;
  // Unequal replicas (`types` one per replica, `shares` their shares of the work): a round
  // of R microbatches, one per replica, each of R x share / sum(shares) times the mean
  // size, takes the time of the replica whose part of it is slowest (times scaled
  // linearly with the size, from the profiles at the mean microbatch). `pace` is that
  // replica's index and its factor on its type's times per microbatch (the size factor
  // over R, which the round's R microbatches share).
  struct Pace {
    int replica = 0;
    double factor = 1;
  };
  Pace pace(const std::vector<int>& types, const std::vector<double>& shares, size_t begin,
            size_t end) const;
  // Their gradients' allreduce: a ring through the replicas' nodes in order, paced by
  // its slowest link, or by the CPU the messages cost the node with the least of it (a
  // quarter-core node's quota) where that is longer.
  double allreduce(const std::vector<int>& types, size_t begin, size_t end) const;
  // Shares that make every replica's part of a round take equal time: in proportion to
  // each one's speed on [begin, end).
  std::vector<double> balancedShares(const std::vector<int>& types, size_t begin, size_t end) const;
  // The optimizer's update of layers [begin, end) once per step (0 when not training).
  double update(int type, size_t begin, size_t end, int tensor = 1) const;
  // Replicas on `types` each update their copy; the step waits for the slowest.
  double update(const std::vector<int>& types, size_t begin, size_t end) const;
  // Unequal replicas' microbatch sizes over the mean: R x share / sum(shares) each.
  static std::vector<double> replicaSizes(const std::vector<double>& shares);
  double stage(int type, size_t begin, size_t end, int replicas, int tensor = 1) const;
  // The link carrying layer end-1's output from type `from` to type `to`.
  double link(size_t end, int from, int to) const;
  // The same with these codecs' ratios on the link.
  double link(size_t end, int from, int to, double activation_ratio, double gradient_ratio) const;
  // The cores a node's host devices share (0: not known).
  double nodeCores(int node) const;
  // CPU seconds a message of `bytes` from node `from_node` to `to_node` costs, both ends
  // together, as node `node` (one of the two) measured it: its fixed cost per message plus
  // its cost per byte, or the link's measured cost per byte where that is higher (a
  // slow or shaped link's packets cost the hosts more than loopback's). 0: not known.
  double messageCpu(int node, int from_node, int to_node, double bytes) const;
  // What node `node`'s own end of that message costs it: half its fixed cost and of its
  // own cost per byte, or its end's part of the link's (LinkCosts::sender_share for the
  // sender, the rest for the receiver) where that is higher.
  double messageCpuAtEnd(int node, int from_node, int to_node, double bytes) const;
  // Wall seconds a stage's thread on node `node` spends sending a message of `bytes`
  // (MessageCpuCost::send; 0: not known).
  double sendTime(int node, double bytes) const;
  // The link from type `from`'s node to type `to`'s (within a node: its `local` link).
  const LinkCosts& linkCosts(int from, int to) const;
  // Latency objective: the input's trip from the source device to type `to` (0 when
  // there is no source or `to` is the source's type).
  double sourceLink(int to) const;
  // `stages_to_end` counts this stage and those after it (1F1B stash depth); `stages` all
  // of the plan's (ZB-H1's depth, min(m, stages); 0 where the search does not know it yet:
  // then m, which no plan exceeds).
  // `scale`: the stage's microbatches are that times the mean size (an unequal replica's).
  // `tensor` > 1: one rank's of a stage tensor-split over that many.
  int64_t memory(size_t begin, size_t end, int stages_to_end, int replicas, int stages = 0,
                 double scale = 1, int tensor = 1) const;
  int64_t paramBytes(size_t begin, size_t end) const;
  // What layers [begin, end) hold whatever the split: weights, and when training their
  // gradients and optimizer state. A lower bound on any stage's memory that holds them.
  int64_t stateBytes(size_t begin, size_t end) const;
  // The same of `param_bytes` of weights.
  int64_t stateBytesOf(int64_t param_bytes) const;
  // The model's first layer with parameters (layers() if none): the first stage's
  // backward of layers [0, firstWhole()] is whole, with no input gradient.
  size_t firstWhole() const { return first_param_; }
  // Bytes entering layer `layer` (the model input for layer 0).
  int64_t inputBytes(size_t layer) const;

 private:
  // tensorStage over `tensor` equal ranks of `type`.
  TensorStage equalTensor(int type, size_t begin, size_t end, int tensor) const;
  double linkTime(int64_t bytes, double ratio, int from_node, int to_node) const;
  // Node `node`'s measured message cost (zeros when not measured).
  MessageCpuCost ownMessageCpu(int node) const;
  // What a range [0, end) saves of the backward prefix sums: the backward of the layers
  // before firstWhole() and the first one's input gradient.
  double firstSaving(int type, size_t end) const;

  Problem problem_;
  std::vector<DeviceType> types_;
  std::vector<int> type_of_;
  // Per type, prefix sums over layers of the time a stage spends per microbatch, and of
  // the forward, backward and weight-gradient parts.
  std::vector<std::vector<double>> time_prefix_, forward_prefix_, backward_prefix_, weight_prefix_;
  std::vector<int64_t> param_prefix_, stash_prefix_;
  size_t first_param_ = 0;
  // Per type, the first layer with parameters' backward without the input gradient.
  std::vector<double> first_backward_;
  // Per type, prefix counts of the layers it cannot run.
  std::vector<std::vector<int>> lack_prefix_;
  // Sparse table of max(input + output + scratch bytes) over layer ranges (serving memory).
  std::vector<std::vector<int64_t>> working_max_;
  // The same of each layer's stash prefix (through it) plus its input and output: what
  // a microbatch holds while that layer's backward runs.
  std::vector<std::vector<int64_t>> backward_max_;
  // A sparse table over `values` (level w: the max over 2^w from each index), and the max
  // over [begin, end) from it.
  static std::vector<std::vector<int64_t>> rangeMaxTable(std::vector<int64_t> values);
  static int64_t rangeMax(const std::vector<std::vector<int64_t>>& table, size_t begin, size_t end);
};

}  // namespace tandem::partitioner
