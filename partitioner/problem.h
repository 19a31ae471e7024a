// What the partitioner decides from, as plain numbers: per-layer times on each device
// (one microbatch), per-layer bytes, device memories and the links between nodes.
// Built from a model, a profile and a cluster file by makeProblem (cluster.h), or by
// hand in tests and benchmarks. Units: seconds, bytes, bytes per second.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/pipeline/schedule.h"

namespace tandem::partitioner {

enum class Objective {
  kTrainThroughput,  // training: minimise the slowest stage or link per microbatch
  kInferThroughput,  // serving a stream: the same, forward only
  kInferLatency,     // one request: minimise the sum of forward compute and link times
};
const char* objectiveName(Objective o);
Objective parseObjective(const std::string& name);  // "train", "infer", "latency"

struct LayerBytes {
  std::string type;          // for plans and messages: "conv2d", "linear", ...
  int64_t param_bytes = 0;   // weights and biases
  int64_t output_bytes = 0;  // the activation it passes on, one microbatch
  int64_t stash_bytes = 0;   // what its forward keeps for its backward, one microbatch
  // Scratch its forward or backward holds beside its input and output, one microbatch
  // (Layer::workspaceBytes).
  int64_t workspace_bytes = 0;
  // A block that splits inside itself (attention, SwiGLU, transformer, llama, residual):
  // the all-reduces its forward runs once tensor-split, as many in its backward, each of
  // about its output (TensorSplitBlock::tensorAllreduces); 0 for other layers.
  int tensor_allreduces = 0;
};

// What a tensor split makes of a layer (TensorRole::Kind, core/layers/tensor_split.h).
enum class TensorKind : uint8_t { kWhole, kColumn, kRow, kSlice, kBlock };

// An all-reduce among a tensor group's ranks in one process: fixed_s + per_byte_s * bytes
// for 2 ranks (the line through a profile's GroupAllreduce points).
struct GroupAllreduceCost {
  double fixed_s = 0, per_byte_s = 0;
  bool measured() const { return fixed_s > 0 || per_byte_s > 0; }
};

struct DeviceCosts {
  std::string name;  // "node/device", e.g. "jetson/opencl:0"
  int node = 0;      // index into Problem::node_names; links are per node pair
  int64_t memory_bytes = 0;
  // Per layer, one microbatch: forward and backward seconds on this device, as it
  // sustains them when kept busy.
  std::vector<double> forward_s, backward_s;
  // How `tandem run` starts a stage on it (carried into plans, not used for costs).
  std::string backend = "cpu";
  int threads = 1;
  // A device under a CPU quota runs at full speed until its share of a period is spent,
  // then waits: in bursts it takes `burst_ratio` of the sustained times (1: no bursts),
  // and it holds up to `burst_budget_s` seconds of full-speed running in reserve (the
  // quota's share of a period), refilled at burst_ratio per second. A stage that idles
  // between microbatches (the pipeline's fill and drain) runs them faster than it could
  // keep up. The simulation of a step uses these (simulate.h); the search's pace does not.
  double burst_ratio = 1;
  double burst_budget_s = 0;
  // Threads of its node's CPU cores it keeps busy while it computes (the CPU backend's
  // threads, an OpenCL CPU device's compute units; 0: it computes elsewhere, a GPU, or its
  // profile already had its neighbours running beside it). Stages on one node's host
  // devices share Problem::node_cores (simulate.h).
  double host_threads = 0;
  // The optimizer's update once per training step (gradients zeroed, then the step), per
  // parameter byte a stage holds, as it sustains it (the profile's update_s for the job's
  // optimizer over the model's parameter bytes, scaled like the layers). 0: not measured.
  double update_s_per_param_byte = 0;
  // Per layer, what its backend lacks to run it ("lacks gemm on i8": Backend::supports),
  // empty where it runs it; an empty list: it runs every layer. The search never places
  // a layer on a device that lacks one of its ops.
  std::vector<std::string> lacks = {};
  // The model's first layer with parameters, as the first stage runs it: its backward
  // without the input gradient, which nothing below it wants (the profile's
  // backward_no_input_s, scaled like the layers). Negative: not measured, priced as the
  // weight-gradient half of its backward_s (as CostModel::weightGradient prices it). The
  // first layer's backward_s has no input gradient already (nothing to send it to).
  double first_backward_s = -1;
  // Per layer, a language model's decoding of one token (generation.h): for one sequence
  // and for `decode_batch` sequences at once (the profile's decode_s and decode_batch_s,
  // scaled like the layers by what the device sustains). Empty: not measured.
  std::vector<double> decode_s = {}, decode_batch_s = {};
  int64_t decode_batch = 0;
  // With them, per layer: the bytes one sequence's key/value cache holds there (for the
  // whole context), which every sequence in flight holds on the stage.
  std::vector<int64_t> cache_bytes = {};
};

// The CPU a message costs its node's cores (both ends together): fixed + per_byte * bytes
// (the line through a profile's MessageCpu points).
struct MessageCpuCost {
  double fixed_s = 0, per_byte_s = 0;
  double of(double bytes) const { return fixed_s + per_byte_s * bytes; }
  // The sending stage's own thread, in the send call (the line through MessageCpu's
  // send_s): it computes nothing meanwhile. 0: not measured.
  double send_fixed_s = 0, send_per_byte_s = 0;
  double send(double bytes) const { return send_fixed_s + send_per_byte_s * bytes; }
};

struct LinkCosts {
  double bandwidth = 0;  // bytes per second
  double latency_s = 0;  // per message
  // The CPU its bytes cost both ends' hosts, per byte (LinkProfile::cpu_s_per_byte; 0:
  // not measured): CostModel::messageCpu.
  double cpu_s_per_byte = 0;
  // Of that, the sending end's part (LinkProfile::sender_share; half where not measured).
  double sender_share = 0.5;
};

// A codec a link may carry tensors in: its name ("fp16") and the wire bytes per fp32 byte
// it sends (measured with the transport's codec by the caller: the partitioner does not
// know the transport).
struct CodecChoice {
  std::string name;
  double ratio = 1;
};

struct CostOptions {
  Objective objective = Objective::kTrainThroughput;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int64_t microbatches = 4;              // per training step (m)
  int64_t microbatch_size = 16;          // samples in one microbatch
  bool recompute = false;                // stash only each stage's input, recompute in backward
  double optimizer_state_per_param = 1;  // bytes of optimizer state per parameter byte
  // Replicated stages' ZeRO stage (a job's `zero:`): from 1 each replica holds 1/R of the
  // optimizer state. (Stage 2's gradients live whole through a pipeline step's backwards,
  // so its peak is stage 1's.)
  int zero = 0;
  std::string optimizer = "sgd";  // whose update the profiles' update_s prices
  // Bytes on the wire per fp32 byte, after the link's codec (fp16: 0.5), and the codecs'
  // names, for every link unless chosen per link.
  double activation_ratio = 1, gradient_ratio = 1;
  std::string activation_codec = "fp32", gradient_codec = "fp32";
  // Per-link codecs (choosePlan): each link's activations and/or gradients get the most
  // exact of `codecs` (listed most exact first) whose predicted step is within
  // kCodecTolerance of the fastest codec's on that link.
  bool choose_activation_codec = false, choose_gradient_codec = false;
  std::vector<CodecChoice> codecs;
  int transport_buffers = 2;  // messages each link may queue per direction
  int max_replicas = 1;       // > 1: a stage may be replicated over devices of one type
  // > 1 (training): a stage may be tensor-split over up to this many devices of one type
  // on one node, its ranks threads of the stage's process (Assignment::tensor).
  int max_tensor = 1;
  int source = -1;  // latency: the device the input arrives at (-1: any)
};

struct Problem {
  std::vector<LayerBytes> layers;
  int64_t input_bytes = 0;  // the model's input, one microbatch
  std::vector<std::string> node_names;
  std::vector<DeviceCosts> devices;
  std::vector<std::vector<LinkCosts>> links;  // [from node][to node]; the diagonal: within a node
  // Per node: the CPU cores its host devices share (its CPUs, or its quota when lower);
  // empty or 0: not known, no sharing priced.
  std::vector<double> node_cores;
  // Per node: what a message costs its cores; a message between stages is charged half
  // to the sender's node and half to the receiver's, where the cores are known
  // (simulate.h). Empty: not measured.
  std::vector<MessageCpuCost> node_message_cpu;
  // Per node: a tensor group's all-reduce there (Profile::group_allreduce). Empty or not
  // measured: priced at the node's `local` link (links[node][node]).
  std::vector<GroupAllreduceCost> node_group_allreduce;
  // Tensor parallelism: per first layer b, what a split of layers [b, L) makes of each
  // (findTensorSplit), tensor_roles[b][i - b] for layer i. A stage [b, e) takes these with
  // a pair whose row layer lies at or past e whole (CostModel::tensorRoles). Empty: nothing
  // splits (a problem made by hand without them).
  std::vector<std::vector<TensorKind>> tensor_roles;
  CostOptions options;
};

// InvalidArgument naming what is inconsistent (sizes, a device without times for every
// layer, a non-positive bandwidth, a node index out of range).
void validate(const Problem& p);

}  // namespace tandem::partitioner
