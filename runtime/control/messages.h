// Control messages as typed values, and their FlatBuffers form (schema/control.fbs):
// those of the handshake and of a node daemon (encoded in messages.cpp) and those between
// a coordinator and a stage worker (stage_messages.cpp).
// decodeMessage treats its input as hostile: the FlatBuffers Verifier first, then every
// field against the limits below; anything else raises FormatError naming the message
// and the field. encodeMessage(decodeMessage(b)) decodes to an equal value.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "core/optimizer.h"
#include "core/pipeline/executor.h"
#include "core/pipeline/schedule.h"
#include "runtime/control/job_settings.h"

namespace tandem::runtime {

// The protocol's version: peers whose major differs refuse each other, naming both.
struct ProtocolVersion {
  uint16_t major = 0, minor = 0, patch = 0;
  std::string str() const;
  bool operator==(const ProtocolVersion&) const = default;
};
inline constexpr ProtocolVersion kProtocolVersion{3, 8, 0};

// Field limits, enforced on decode (and on encode, so we never send what a peer refuses).
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
inline constexpr size_t kMaxNameBytes = 128;
inline constexpr size_t kMaxTextBytes = 1024;
inline constexpr size_t kMaxDevices = 64;
inline constexpr size_t kMaxCachedWeights = 4096;
inline constexpr size_t kMaxDatasets = 64;

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

struct Hello {
  ProtocolVersion version;
  std::string build;
  Nonce nonce{};
  bool operator==(const Hello&) const = default;
};

struct Proof {
  Mac mac{};
  bool operator==(const Proof&) const = default;
};

enum class Refusal : uint8_t { kBadMessage = 0, kVersion = 1, kAuth = 2, kBusy = 3 };
const char* refusalName(Refusal r);

struct Refused {
  Refusal reason = Refusal::kBadMessage;
  std::string message;
  bool operator==(const Refused&) const = default;
};

struct NodeDevice {
  std::string id, name;
  int64_t memory_bytes = 0;
  int32_t compute_units = 0;
  bool fp16 = false;
  bool operator==(const NodeDevice&) const = default;
};

struct NodeInfo {
  std::string name, build, arch;
  int32_t cpus = 0;
  int64_t memory_bytes = 0, free_memory_bytes = 0;
  float load = 0;
  std::vector<NodeDevice> devices;
  std::vector<std::string> cached_weights, datasets;
  float cpu_cores = 0;  // what it may keep busy: its CPUs, or its CPU quota if lower
  float cpu_quota = 0;  // its control groups' CPU quota in cores; 0: none
  bool operator==(const NodeInfo&) const = default;
};

struct Ping {
  uint64_t id = 0;
  int64_t sent_ns = 0;
  bool operator==(const Ping&) const = default;
};

struct Pong {
  uint64_t id = 0;
  int64_t ping_sent_ns = 0, received_ns = 0, sent_ns = 0;
  bool operator==(const Pong&) const = default;
};

struct Leave {
  std::string reason;
  bool operator==(const Leave&) const = default;
};

struct ErrorReply {
  std::string message;
  bool operator==(const ErrorReply&) const = default;
};

// --- between a coordinator and a node daemon: workers on the node ------------------

struct Launch {
  int32_t slot = 0;
  std::string coordinator;  // HOST:PORT as the node reaches the coordinator
  std::array<uint8_t, 32> key{};
  bool operator==(const Launch&) const = default;
};

struct Launched {
  int32_t slot = 0;
  int64_t pid = 0;
  bool operator==(const Launched&) const = default;
};

struct WorkerEnded {
  int32_t slot = 0;
  std::string how;
  bool killed = false;
  bool operator==(const WorkerEnded&) const = default;
};

// --- between a coordinator and a node daemon: measuring links ----------------------

enum class LinkTaskKind : uint8_t { kOpen = 0, kServe = 1, kMeasure = 2, kLocal = 3 };

struct LinkTask {
  int64_t pair = 0;
  LinkTaskKind kind = LinkTaskKind::kOpen;
  std::string bind_host = "127.0.0.1", peer;
  int64_t message_bytes = int64_t{4} << 20;
  int32_t window = 4, warmup = 2, repeats = 10;
  // Loaded runs after the bandwidth runs (core/profile/link_probe.h), at both ends (3.6).
  bool loaded = false;
  bool operator==(const LinkTask&) const = default;
};

struct LinkResult {
  int64_t pair = 0;
  std::string endpoint;
  double bandwidth = 0, latency_s = 0, rtt_median = 0, rtt_min = 0, rtt_max = 0;
  int32_t rtt_repeats = 0;
  // What the end's host spent busy while the data went (LinkMeasurement::host_cpu_s; the
  // echo side's from its first data message), the bytes sent, and the host's boot id
  // (hostBootId): two ends on one host read the same CPUs. 0, 0, "": before 3.2.
  double host_cpu_s = 0;
  int64_t data_bytes = 0;
  std::string host = {};
  // What the end's own process spent meanwhile (LinkMeasurement::process_cpu_s, EchoCpu):
  // what a CPU quota there is charged. 0: before 3.6.
  double process_cpu_s = 0;
  // What the loaded runs' messages cost the end while it computed, and the bytes the
  // measuring end sent in them (LinkMeasurement::loaded_cpu_s): 0, 0 without them.
  double loaded_cpu_s = 0;
  int64_t loaded_bytes = 0;
  bool operator==(const LinkResult&) const = default;
};

// --- between a coordinator and a node daemon: profiling a model (node_profile.h) ----

inline constexpr size_t kMaxProfileBytes = size_t{4} << 20;
inline constexpr size_t kMaxProfileDevices = 64;
// Batches one task measures besides its own (ProfileTask::more_batches), and what their
// profiles may take together with the first.
inline constexpr size_t kMaxMoreBatches = 15;
inline constexpr size_t kMaxProfileResultBytes = size_t{12} << 20;

struct ProfileDevice {
  std::string backend = "cpu";
  int32_t threads = 1, load = 0;
  bool operator==(const ProfileDevice&) const = default;
};

struct ProfileTask {
  std::string model_spec;
  int64_t batch = 8;
  int32_t warmup = 3, repeats = 10;
  std::vector<ProfileDevice> devices;
  // 0: every device is measured at `batch`. Else a device whose measurement at `batch`
  // would take too long is measured at a smaller one, halving down to this
  // (profileBatch in node_profile.h); its profile says which.
  int64_t least_batch = 0;
  // Other batches measured in the same task (a plan pricing several microbatch counts),
  // each as its own profile; they share the first batch's sustained window, update and
  // message measurements, which do not depend on the batch (node_profile.h). Each from 1
  // to 65536, none twice nor `batch`; at most kMaxMoreBatches.
  std::vector<int64_t> more_batches = {};
  bool operator==(const ProfileTask&) const = default;
};

struct ProfileResult {
  std::string profile;                 // tandem-profile JSON
  int32_t cached = 0;                  // devices that came from the node's cache, over every batch
  std::vector<std::string> more = {};  // one profile per ProfileTask::more_batches, in order
  bool operator==(const ProfileResult&) const = default;
};

// --- between a coordinator and a stage worker (stage_worker.h) ---------------------

inline constexpr size_t kMaxModelSpecBytes = size_t{1} << 20;
inline constexpr size_t kMaxEndpointBytes = 256;
inline constexpr int kMaxStages = 1024;
inline constexpr int kMaxReplicas = 64;
inline constexpr size_t kMaxSpans = size_t{1} << 20;

// What a run does with its stages: train them, stream the test set forward through
// them (inference), or generate text from prompts.
enum class RunMode : uint8_t { kTrain, kInfer, kGenerate };
const char* runModeName(RunMode mode);  // "train", "infer", "generate"

// One stage worker's whole task (schema/control.fbs, table Assign).
struct Assign {
  std::string job, model_spec;
  int32_t stage = 0, stages = 1, replica = 0, replicas = 1, prev_replicas = 0, next_replicas = 0;
  // The stage's layers (and chunks), the device this worker runs them on, its threads.
  // With 2 or more chunks, stage 0's prev link is the last stage's next, as when
  // generating.
  StageSlice slice;
  TrainSettings train;
  DataSettings data;
  WireSettings wire;  // activations to the next stage, gradients to the previous
  RunMode mode = RunMode::kTrain;
  bool record_spans = false, save = false;
  std::string bind_host = "127.0.0.1";
  std::string transport = "tcp";
  std::string weights_hash;  // a model file to start from (contentHash), or empty
  int64_t weights_bytes = 0;
  bool encrypt = false;  // CurveZMQ on the links, keys from the run's key
  CheckpointSettings checkpoint;
  // Inference streams: the first test sample to answer (a multiple of the batch; a
  // stream resumed after a failure starts there), and the requests (microbatches) per
  // second the first stage feeds (0: as fast as the pipeline takes them).
  int64_t infer_from = 0;
  double request_rate = 0;
  // Generation (core/pipeline/stage_decoder.h): stage 0 takes `prompt`s, the last stage
  // sends `token`s; with 2 or more stages, stage 0's prev link is the last stage's next
  // (the chosen tokens come back over it). Sequences stage 0 keeps going at once.
  int32_t in_flight = 8;
  bool operator==(const Assign&) const = default;
};

// Whether the worker given `a` sends its slice at checkpoints: replica 0 of each stage
// (replicas hold the same weights), when the run checkpoints at all.
inline bool sendsCheckpoints(const Assign& a) {
  return a.checkpoint.every_steps > 0 && a.replica == 0;
}

inline constexpr size_t kMaxWeightsChunk = size_t{4} << 20;
inline constexpr int64_t kMaxWeightsBytes = int64_t{64} << 30;

struct WeightsRequest {
  std::string hash;
  bool operator==(const WeightsRequest&) const = default;
};

struct WeightsChunk {
  std::string hash;
  int64_t offset = 0, total = 0;
  std::vector<uint8_t> bytes;
  bool operator==(const WeightsChunk&) const = default;
};

struct WorkerHello {
  int32_t slot = 0;
  int64_t pid = 0;
  bool operator==(const WorkerHello&) const = default;
};

struct Ready {
  std::vector<std::string> prev, next;
  std::string device;
  int64_t train_samples = -1, test_samples = -1;  // -1: not the first stage
  bool operator==(const Ready&) const = default;
};

struct Start {
  std::vector<std::string> prev, next;
  int64_t train_samples = 0, test_samples = 0;
  bool operator==(const Start&) const = default;
};

struct GroupAddress {
  std::string address;
  bool operator==(const GroupAddress&) const = default;
};

struct GroupAddresses {
  std::vector<std::string> addresses;
  bool operator==(const GroupAddresses&) const = default;
};

struct Progress {
  int64_t epoch = 0, step = 0, steps = 0;
  double loss = 0, samples_per_s = 0, elapsed_s = 0;
  bool operator==(const Progress&) const = default;
};

struct EpochDone {
  int64_t epoch = 0;
  double loss = 0, seconds = 0, samples_per_s = 0, test_loss = 0, test_accuracy = 0;
  bool operator==(const EpochDone&) const = default;
};

struct InferDone {
  int64_t samples = 0;
  double loss = 0, accuracy = 0, seconds = 0;
  bool operator==(const InferDone&) const = default;
};

// The last stage's answer to one request of an inference stream (each replica of the
// last stage sends its own requests'): a microbatch of the test set from sample `first`,
// its outputs (`count` rows of `columns`), summed loss and rows predicted right.
inline constexpr size_t kMaxAnswerValues = size_t{1} << 21;
struct Answer {
  int64_t first = 0, count = 0;
  int32_t columns = 0;
  std::vector<float> outputs;
  double loss_sum = 0;
  int64_t correct = 0;
  bool operator==(const Answer& o) const {  // bitwise, so NaN outputs compare too
    return first == o.first && count == o.count && columns == o.columns &&
           outputs.size() == o.outputs.size() &&
           std::memcmp(outputs.data(), o.outputs.data(), outputs.size() * sizeof(float)) == 0 &&
           std::memcmp(&loss_sum, &o.loss_sum, sizeof loss_sum) == 0 && correct == o.correct;
  }
};

struct StageReport {
  StageCounters counters;
  double run_s = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  std::vector<Span> spans;
  // The trained slice (a model file), when asked: sent before the report as weights
  // chunks (chunks.h) of this content hash and size.
  std::string model_hash;
  int64_t model_bytes = 0;
  int64_t weights_shipped = 0;  // starting weights received from the coordinator (bytes)
  double weights_ship_s = 0;
  bool weights_cached = false, weights_corrupted = false;
  // Training: the mean step, from one step's end to the next's on this stage (a step
  // flushes the pipeline, so every stage sees the same period), over `steps_timed` steps:
  // the first and the last of each epoch are left out (the start, a partial batch). The
  // mean, not the median: a node under a CPU quota runs a few fast steps and then waits
  // out its period, and only the mean says what it keeps up.
  double step_mean_s = 0;
  int64_t steps_timed = 0;
  // The worker's resident memory before its model was built, and at its peak.
  int64_t start_rss_bytes = 0, peak_rss_bytes = 0;
  // The most its backend held for live tensors (Backend::memoryUse); -1: not counted.
  int64_t peak_tensor_bytes = -1;
  // Training: its parameters' values, the most gradient bytes it held at once and its
  // optimizer state at the end (a sharded replica's shards); -1: not counted.
  int64_t weight_bytes = -1, gradient_peak_bytes = -1, state_bytes = -1;
  // The worker's CPU time over the training epochs, every thread (compute, the links' I/O,
  // the control channel): beside counters.compute_cpu_s, what a stage costs its node
  // beyond its layers' work (a CPU quota pays for all of it).
  double process_cpu_s = 0;
  // A tensor-split stage's ranks 1.. (counters: rank 0's), over the same epochs; at most
  // kMaxTensorRanks - 1.
  std::vector<StageCounters> tensor_ranks;
  bool operator==(const StageReport&) const = default;
};

// Generation: a request to stage 0 (prompt token ids, new tokens, sampling), the end of
// the requests, and a token the last stage chose (with the logit it was chosen by).
inline constexpr size_t kMaxPromptTokens = size_t{1} << 20;
inline constexpr int64_t kMaxRequestId = (int64_t{1} << 31) - 1;
struct Prompt {
  int64_t id = 0;
  std::vector<int32_t> tokens;
  int64_t count = 1;
  float temperature = 0;
  int64_t top_k = 0;
  uint64_t seed = 1;
  float top_p = 1;  // in (0, 1]
  bool operator==(const Prompt&) const = default;
};

struct PromptsDone {
  bool operator==(const PromptsDone&) const = default;
};

struct CancelPrompt {
  int64_t id = 0;
  bool operator==(const CancelPrompt&) const = default;
};

struct Token {
  int64_t id = 0, index = 0;
  int32_t token = 0;
  float logit = 0;
  bool operator==(const Token& o) const {  // bitwise, so a NaN logit compares too
    return id == o.id && index == o.index && token == o.token &&
           std::memcmp(&logit, &o.logit, sizeof logit) == 0;
  }
};

struct StageBusy {
  int64_t steps = 0, rows = 0;
  double busy_s = 0, elapsed_s = 0;
  bool operator==(const StageBusy&) const = default;
};

struct Failed {
  std::string message;
  bool operator==(const Failed&) const = default;
};

// A stage's slice at a checkpoint, sent just before as weights chunks (chunks.h).
struct Checkpointed {
  int64_t step = 0;
  std::string hash;
  int64_t bytes = 0;
  // Replicas of the whole model with shares (3.5): how each batch is cut from this step
  // on (StageTrainer::sharesSettled), so that a run resumed here cuts it alike; empty
  // otherwise, and while the replicas are still measuring (a run resumed then measures
  // again).
  std::vector<double> shares;
  bool operator==(const Checkpointed&) const = default;
};

using Message =
    std::variant<Hello, Proof, Refused, NodeInfo, Ping, Pong, Leave, ErrorReply, Launch, Launched,
                 WorkerEnded, LinkTask, LinkResult, WorkerHello, Assign, WeightsRequest,
                 WeightsChunk, Ready, Start, GroupAddress, GroupAddresses, Progress, EpochDone,
                 InferDone, StageReport, Failed, ProfileTask, ProfileResult, Checkpointed, Answer,
                 Prompt, PromptsDone, Token, CancelPrompt, StageBusy>;

// "hello", "proof", ... for messages.
const char* messageName(const Message& m);

std::vector<uint8_t> encodeMessage(const Message& m);
Message decodeMessage(std::span<const uint8_t> bytes);

}  // namespace tandem::runtime
