// A device profile: what `tandem profile` measures and the partitioner reads. Per
// device, its facts, a GEMM throughput summary and, per layer of one model at one
// batch size, the forward and backward time (median and spread over repeats after
// warm-up), the activation and parameter bytes and the FLOPs.
//
// A profile may also hold the links between the nodes of a cluster, measured by
// `tandem profile --links` (with or without devices).
//
// On disk it is JSON, schema "tandem-profile" version 6 (docs/profile.md, with the
// JSON Schema in docs/profile.schema.json). parseProfile() checks every field's
// presence and type, reads versions 1 (no loss, no links), 2 (no sustained
// measurement), 3 (no optimizer update), 4 and 5 (no ops lacked) too and refuses others,
// naming the field.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/model.h"
#include "core/profile/measure.h"

namespace tandem {

inline constexpr int kProfileVersion = 6;
inline constexpr double kThrottleNoise = 1.5;

struct LayerProfile {
  int64_t index = 0;
  std::string type;
  Shape output;              // with the batch dimension
  Spread forward, backward;  // seconds
  // On the model's first layer with parameters, where it is not layer 0: its backward
  // without the input gradient, as the first stage runs it (nothing below it wants that
  // gradient; for a linear layer about half its backward). No repeats elsewhere, and in
  // profiles before it was measured (an optional field of version 6).
  Spread backward_no_input;
  int64_t activation_bytes = 0;  // the layer's output at this batch size
  int64_t param_bytes = 0;
  int64_t flops = 0;  // forward, per sample
  // Version 6: the ops (with their dtypes) the device's backend lacks to train this layer
  // (Backend::supports; the last layer's include the loss), and whether it runs its
  // forward all the same (serving). A layer it lacks its own ops for is not timed (zero
  // times, no repeats); the partitioner never places a layer with lacks there. Empty: it
  // runs the layer.
  std::vector<OpUse> lacks;
  bool forward_runs = true;
  // Optional within version 6: a language model's decoding of one new token through this
  // layer (Layer::decodeEach) for one sequence, and for DeviceProfile::decode_batch
  // sequences at once, each with DeviceProfile::decode_context tokens in its cache, timed
  // in order through the layers (timeDecode, measure.h). No repeats: not measured (a
  // model that does not decode token by token, profiles before it was measured).
  Spread decode, decode_batch;
  // With them: the bytes one sequence's decoding state holds in this layer (its key/value
  // cache, allocated for the whole context; 0 for a layer without one).
  int64_t cache_bytes = 0;
};

struct GemmPoint {
  int64_t n = 0;      // n x n x n sgemm
  double gflops = 0;  // median
};

// What a device keeps up over time, beside what it bursts to. Each layer is timed in runs
// far shorter than a CPU quota's period (a cgroup's `cpu.max`: 100 ms by default), and
// the median keeps the runs the quota did not stall: a node capped at a quarter of a core
// would profile as fast as an uncapped one. So whole training passes also run back to back
// for a window that crosses many periods, and the partitioner multiplies every layer's
// time by scale(): what the layers take when run on and on, as a stage runs them.
struct Sustained {
  double pass_s = 0;        // wall seconds per pass over the window; 0: not measured
  double burst_pass_s = 0;  // the per-layer medians and the loss, summed
  double window_s = 0;      // how long the passes ran
  int passes = 0;
  double cpu_cores = 0;       // cores the process could keep busy (its CPUs, its quota)
  double quota_cores = 0;     // its control groups' CPU quota in cores; 0: none
  double quota_period_s = 0;  // the quota's period; 0: none
  // CPU seconds per pass over the window, the process's every thread (what the passes cost
  // the quota); 0: not measured (profiles before it was).
  double cpu_pass_s = 0;
  // pass_s / burst_pass_s; 1 when not measured.
  double scale() const;
  // What the partitioner multiplies a layer's median by: scale() under a CPU quota; without
  // one, scale() only beyond kThrottleNoise — on a shared machine an unthrottled window
  // drifts from the medians by tens of percent (measured 0.76-1.40 on this VM), and the
  // medians are the steadier figure there; a badly throttled device (a hot board, a
  // burstable VM out of credits) shows beyond that.
  double throttle() const;
};

struct Profile;

struct DeviceProfile {
  DeviceInfo device;
  std::vector<GemmPoint> gemm;
  std::vector<LayerProfile> layers;
  // The training loss (softmax cross-entropy) forward and backward on the last layer's
  // output, which the last stage adds to its layers. Zero when not measured (version 1,
  // or a model whose output is not [batch, classes]).
  Spread loss;
  Sustained sustained;  // version 3; not measured in earlier versions
  // Version 4: one optimizer update of every parameter of the model (the gradients
  // zeroed, then the step), as a stage runs it once per training step, per optimizer
  // kind ("sgd" with momentum, "adamw"); seconds, median and spread over the repeats.
  // Empty: not measured.
  std::map<std::string, Spread> update;
  // Version 5: the batch this device was measured at where it is not the profile's (a
  // node's daemon measures a fast device at a large microbatch and a slow one at a
  // smaller: runtime/node/node_profile.h); 0: the profile's. Its layers' times,
  // activation bytes, loss and sustained passes are at this batch.
  int64_t batch = 0;
  // The batch the layers were measured at: `batch`, or else the profile's.
  int64_t batchIn(const Profile& p) const;
  // Where its layers' decoding was timed (LayerProfile::decode): the tokens each
  // sequence's cache held and the sequences of decode_batch; 0: not measured.
  int64_t decode_context = 0, decode_batch = 0;
  bool decodes() const { return decode_batch > 0; }
};

// One measured link: from == to is within a node (two processes there).
struct LinkProfile {
  std::string from, to;
  double bandwidth = 0;  // bytes per second, one way
  double latency_s = 0;  // half the median round trip
  Spread round_trip;     // seconds
  // The CPU its bytes cost both ends together, per byte: what the ends' processes spent
  // while the bandwidth runs went, over their bytes, or what its messages cost them
  // beside a computation (the loaded runs, core/profile/link_probe.h) where that is
  // higher; from daemons before protocol 3.6, the hosts' busy CPU over the bandwidth runs
  // (a host both ends share counted once). 0: not measured (before 3.2, or no tick passed).
  double cpu_s_per_byte = 0;
  // Of that CPU, the part the sending end (`from`: the data went from it to `to`) spent,
  // in (0, 1), from the same runs; 0: not known (the hosts' figure, or profiles before it),
  // taken as half. A quota node is charged for its own end of each message.
  double sender_share = 0;
};

// What a message costs a node's CPU: sent and received over the transport the stages use,
// both ends in one process on the node's loopback, one message at a time each way (as a
// pipeline's activations and gradients go), CPU seconds of the whole process per message
// of `bytes` — both ends together, every thread (the transport's I/O threads too).
struct MessageCpu {
  int64_t bytes = 0;
  double cpu_s = 0;
  // Version 6: wall seconds the sending stage's own thread spends in the send call (the
  // tensor encoded and handed to the transport), per message: a stage computes nothing
  // meanwhile. 0: not measured.
  double send_s = 0;
};

// What an all-reduce costs the ranks of a tensor group in one process (the in-process group,
// transport/local_group.h): `ranks` threads each summing a buffer of `bytes` f32 bytes with
// the others, all arriving together; median wall seconds per all-reduce.
struct GroupAllreduce {
  int ranks = 0;
  int64_t bytes = 0;
  double seconds = 0;
};

struct LinkSet {
  std::string transport;      // "tcp"
  int64_t message_bytes = 0;  // each data message of the bandwidth runs
  int warmup = 0, repeats = 0;
  std::vector<LinkProfile> links;
};

struct Profile {
  // Model, input, batch, warm-up and repeats describe `devices`; absent (empty, 0) in a
  // profile of links only.
  std::string model;  // the model's name
  Shape input;        // one sample
  int64_t batch = 0;
  int warmup = 0, repeats = 0;
  int load = 0;  // model copies training beside the measured one (tandem profile --load)
  std::vector<DeviceProfile> devices;
  // Version 4, measured by a node's daemon: at a few message sizes, ascending. Empty:
  // not measured (`tandem profile` without daemons, earlier versions).
  std::vector<MessageCpu> message_cpu;
  std::optional<LinkSet> links;
  // Optional within version 6, measured by a node's daemon and `tandem profile`: at a few
  // sizes, ascending.
  // Empty: not measured (the partitioner prices a tensor group's all-reduces at the
  // node's `local` link then).
  std::vector<GroupAllreduce> group_allreduce = {};
};

struct ProfileOptions {
  int64_t batch = 64;
  int warmup = 3;
  int repeats = 10;
  std::vector<int64_t> gemm_sizes = {256, 512, 1024};
  uint64_t seed = 1;
  // The sustained window's least length (seconds): under a CPU quota at least 40 of its
  // periods, at most 4 s; at least 2 passes. 0: no sustained measurement.
  double sustain_s = 0.5;
  // Whether the optimizers' update is timed (DeviceProfile::update); it does not depend
  // on the batch, so one measurement serves a model's profiles at several batches.
  bool update = true;
  // Whether a language model's decoding is timed (LayerProfile::decode), at half its
  // context for one sequence and for `decode_batch` at once.
  bool decode = true;
  int64_t decode_batch = 4;
};

// Measures `spec` on `backend` (builds its own copy of the model there).
DeviceProfile profileDevice(const ModelSpec& spec, Backend& backend, const ProfileOptions& o);

std::string profileToJson(const Profile& p);
// `where` names the source in errors (a file path).
Profile parseProfile(const std::string& json, const std::string& where);

// The profile of `device` ("cpu", "opencl:0") in `profile`, checked to be of `model`:
// its name, layer count and every layer's type. InvalidArgument beginning with `where`
// (the profile's path, and where it was named) otherwise.
const DeviceProfile& deviceProfile(const Profile& profile, const Model& model,
                                   const std::string& device, const std::string& where);

}  // namespace tandem
