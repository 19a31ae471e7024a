#include "runtime/control/messages.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/flatbuffers_read.h"
#include "runtime/control/message_codec.h"

namespace tandem::runtime {

namespace fb = tandem::control;

namespace {

// The largest message a peer may send: a model slice or weights up to the channel's
// 16 MiB limit fit.
constexpr size_t kMaxMessageBytes = size_t{64} << 20;

using namespace detail;

flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Hello& m) {
  checkText("hello", "build", m.build, kMaxNameBytes);
  auto build = b.CreateString(m.build);
  auto nonce = b.CreateVector(m.nonce.data(), m.nonce.size());
  return fb::CreateHello(b, m.version.major, m.version.minor, m.version.patch, build, nonce)
      .Union();
}

flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Proof& m) {
  return fb::CreateProof(b, b.CreateVector(m.mac.data(), m.mac.size())).Union();
}

flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Refused& m) {
  checkText("refused", "message", m.message, kMaxTextBytes);
  return fb::CreateRefused(b, static_cast<fb::Refusal>(m.reason), b.CreateString(m.message))
      .Union();
}

flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const NodeInfo& m) {
  checkText("node info", "name", m.name, kMaxNameBytes);
  checkText("node info", "build", m.build, kMaxNameBytes);
  checkText("node info", "arch", m.arch, kMaxNameBytes);
  checkCount("node info", "devices", m.devices.size(), kMaxDevices);
  checkCount("node info", "cached weights", m.cached_weights.size(), kMaxCachedWeights);
  checkCount("node info", "datasets", m.datasets.size(), kMaxDatasets);
  std::vector<flatbuffers::Offset<fb::Device>> devices;
  for (const NodeDevice& d : m.devices) {
    checkText("node info", "device id", d.id, kMaxNameBytes);
    checkText("node info", "device name", d.name, kMaxNameBytes);
    devices.push_back(fb::CreateDevice(b, b.CreateString(d.id), b.CreateString(d.name),
                                       d.memory_bytes, d.compute_units, d.fp16));
  }
  for (const std::string& s : m.cached_weights) checkText("node info", "hash", s, kMaxNameBytes);
  for (const std::string& s : m.datasets) checkText("node info", "dataset", s, kMaxNameBytes);
  auto name = b.CreateString(m.name);
  auto bld = b.CreateString(m.build);
  auto arch = b.CreateString(m.arch);
  auto devs = b.CreateVector(devices);
  auto cached = b.CreateVectorOfStrings(m.cached_weights);
  auto datasets = b.CreateVectorOfStrings(m.datasets);
  return fb::CreateNodeInfo(b, name, bld, arch, m.cpus, m.memory_bytes, m.free_memory_bytes, m.load,
                            devs, cached, datasets, m.cpu_cores, m.cpu_quota)
      .Union();
}

flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Launch& m) {
  checkText("launch", "coordinator", m.coordinator, kMaxEndpointBytes);
  auto coordinator = b.CreateString(m.coordinator);
  return fb::CreateLaunch(b, m.slot, coordinator, b.CreateVector(m.key.data(), m.key.size()))
      .Union();
}

flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Launched& m) {
  return fb::CreateLaunched(b, m.slot, m.pid).Union();
}

flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const WorkerEnded& m) {
  checkText("worker ended", "how", m.how, kMaxTextBytes);
  return fb::CreateWorkerEnded(b, m.slot, b.CreateString(m.how), m.killed).Union();
}

flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const LinkTask& m) {
  checkText("link task", "bind_host", m.bind_host, kMaxNameBytes);
  checkText("link task", "peer", m.peer, kMaxEndpointBytes);
  auto host = b.CreateString(m.bind_host);
  auto peer = b.CreateString(m.peer);
  return fb::CreateLinkTask(b, m.pair, static_cast<int8_t>(m.kind), host, peer, m.message_bytes,
                            m.window, m.warmup, m.repeats, m.loaded)
      .Union();
}

flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const LinkResult& m) {
  checkText("link result", "endpoint", m.endpoint, kMaxEndpointBytes);
  checkText("link result", "host", m.host, kMaxNameBytes);
  return fb::CreateLinkResult(b, m.pair, b.CreateString(m.endpoint), m.bandwidth, m.latency_s,
                              m.rtt_median, m.rtt_min, m.rtt_max, m.rtt_repeats, m.host_cpu_s,
                              m.data_bytes, b.CreateString(m.host), m.process_cpu_s, m.loaded_cpu_s,
                              m.loaded_bytes)
      .Union();
}

flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Ping& m) {
  return fb::CreatePing(b, m.id, m.sent_ns).Union();
}

flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Pong& m) {
  return fb::CreatePong(b, m.id, m.ping_sent_ns, m.received_ns, m.sent_ns).Union();
}

flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const Leave& m) {
  checkText("leave", "reason", m.reason, kMaxTextBytes);
  return fb::CreateLeave(b, b.CreateString(m.reason)).Union();
}

flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const ErrorReply& m) {
  checkText("error", "message", m.message, kMaxTextBytes);
  return fb::CreateError(b, b.CreateString(m.message)).Union();
}

flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const ProfileTask& m) {
  checkText("profile task", "model_spec", m.model_spec, kMaxModelSpecBytes);
  checkCount("profile task", "devices", m.devices.size(), kMaxProfileDevices);
  std::vector<flatbuffers::Offset<fb::ProfileDevice>> devices;
  for (const ProfileDevice& d : m.devices) {
    checkText("profile task", "backend", d.backend, kMaxNameBytes);
    devices.push_back(fb::CreateProfileDevice(b, b.CreateString(d.backend), d.threads, d.load));
  }
  checkCount("profile task", "more_batches", m.more_batches.size(), kMaxMoreBatches);
  auto spec = b.CreateString(m.model_spec);
  auto devs = b.CreateVector(devices);
  flatbuffers::Offset<flatbuffers::Vector<int64_t>> more;
  if (!m.more_batches.empty()) more = b.CreateVector(m.more_batches);
  return fb::CreateProfileTask(b, spec, m.batch, m.warmup, m.repeats, devs, m.least_batch, more)
      .Union();
}

flatbuffers::Offset<void> build(flatbuffers::FlatBufferBuilder& b, const ProfileResult& m) {
  checkText("profile result", "profile", m.profile, kMaxProfileBytes);
  checkCount("profile result", "more", m.more.size(), kMaxMoreBatches);
  size_t total = m.profile.size();
  std::vector<flatbuffers::Offset<flatbuffers::String>> more;
  for (const std::string& p : m.more) {
    checkText("profile result", "more", p, kMaxProfileBytes);
    total += p.size();
    more.push_back(b.CreateString(p));
  }
  if (total > kMaxProfileResultBytes)
    throw InvalidArgument("control message 'profile result': its profiles take " +
                          std::to_string(total) + " bytes, over the limit of " +
                          std::to_string(kMaxProfileResultBytes));
  auto profile = b.CreateString(m.profile);
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> list;
  if (!more.empty()) list = b.CreateVector(more);
  return fb::CreateProfileResult(b, profile, m.cached, list).Union();
}

fb::Body bodyType(const Message& m) {
  static constexpr fb::Body kTypes[] = {
      fb::Body_Hello,          fb::Body_Proof,        fb::Body_Refused,     fb::Body_NodeInfo,
      fb::Body_Ping,           fb::Body_Pong,         fb::Body_Leave,       fb::Body_Error,
      fb::Body_Launch,         fb::Body_Launched,     fb::Body_WorkerEnded, fb::Body_LinkTask,
      fb::Body_LinkResult,     fb::Body_WorkerHello,  fb::Body_Assign,      fb::Body_WeightsRequest,
      fb::Body_WeightsChunk,   fb::Body_Ready,        fb::Body_Start,       fb::Body_GroupAddress,
      fb::Body_GroupAddresses, fb::Body_Progress,     fb::Body_EpochDone,   fb::Body_InferDone,
      fb::Body_StageReport,    fb::Body_Failed,       fb::Body_ProfileTask, fb::Body_ProfileResult,
      fb::Body_Checkpointed,   fb::Body_Answer,       fb::Body_Prompt,      fb::Body_PromptsDone,
      fb::Body_Token,          fb::Body_CancelPrompt, fb::Body_StageBusy};
  static_assert(std::size(kTypes) == std::variant_size_v<Message>);
  return kTypes[m.index()];
}

LinkResult readLinkResult(const fb::LinkResult* r) {
  const char* m = "link result";
  LinkResult out{r->pair(),
                 text(m, "endpoint", r->endpoint(), kMaxEndpointBytes),
                 r->bandwidth(),
                 r->latency_s(),
                 r->rtt_median(),
                 r->rtt_min(),
                 r->rtt_max(),
                 r->rtt_repeats(),
                 r->host_cpu_s(),
                 r->data_bytes(),
                 text(m, "host", r->host(), kMaxNameBytes),
                 r->process_cpu_s(),
                 r->loaded_cpu_s(),
                 r->loaded_bytes()};
  nonNegative(m, "pair", out.pair);
  nonNegative(m, "data_bytes", out.data_bytes);
  nonNegative(m, "loaded_bytes", out.loaded_bytes);
  for (double v : {out.bandwidth, out.latency_s, out.rtt_median, out.rtt_min, out.rtt_max,
                   out.host_cpu_s, out.process_cpu_s, out.loaded_cpu_s})
    if (!(v >= 0 && std::isfinite(v))) bad(m, "a measurement is not a finite, non-negative number");
  if (out.rtt_repeats < 0) bad(m, "rtt_repeats is negative");
  return out;
}

NodeInfo readNodeInfo(const fb::NodeInfo* n) {
  const char* m = "node info";
  NodeInfo out;
  out.name = text(m, "name", n->name(), kMaxNameBytes);
  out.build = text(m, "build", n->build(), kMaxNameBytes);
  out.arch = text(m, "arch", n->arch(), kMaxNameBytes);
  out.cpus = n->cpus();
  if (out.cpus < 0) bad(m, "cpus is negative (" + std::to_string(out.cpus) + ")");
  out.memory_bytes = n->memory_bytes();
  out.free_memory_bytes = n->free_memory_bytes();
  nonNegative(m, "memory_bytes", out.memory_bytes);
  nonNegative(m, "free_memory_bytes", out.free_memory_bytes);
  out.load = n->load();
  if (!std::isfinite(out.load) || out.load < 0)
    bad(m, "load " + std::to_string(out.load) + " is not a finite, non-negative number");
  out.cpu_cores = n->cpu_cores();
  out.cpu_quota = n->cpu_quota();
  for (const auto& [field, v] :
       {std::pair{"cpu_cores", out.cpu_cores}, {"cpu_quota", out.cpu_quota}})
    if (!std::isfinite(v) || v < 0 || v > 65536)
      bad(m, std::string(field) + " " + std::to_string(v) + " is not a core count");
  if (const auto* devices = n->devices()) {
    if (devices->size() > kMaxDevices)
      bad(m, std::to_string(devices->size()) + " devices exceed the limit of " +
                 std::to_string(kMaxDevices));
    for (const fb::Device* d : *devices) {
      NodeDevice info;
      info.id = text(m, "device id", d->id(), kMaxNameBytes);
      info.name = text(m, "device name", d->name(), kMaxNameBytes);
      info.memory_bytes = d->memory_bytes();
      nonNegative(m, "device memory_bytes", info.memory_bytes);
      info.compute_units = d->compute_units();
      if (info.compute_units < 0) bad(m, "a device's compute_units is negative");
      info.fp16 = d->fp16();
      out.devices.push_back(std::move(info));
    }
  }
  auto strings = [&](const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* v,
                     const char* field, size_t limit) {
    std::vector<std::string> list;
    if (!v) return list;
    if (v->size() > limit)
      bad(m, std::to_string(v->size()) + " " + field + " exceed the limit of " +
                 std::to_string(limit));
    for (const flatbuffers::String* s : *v) list.push_back(text(m, field, s, kMaxNameBytes));
    return list;
  };
  out.cached_weights = strings(n->cached_weights(), "cached weights", kMaxCachedWeights);
  out.datasets = strings(n->datasets(), "datasets", kMaxDatasets);
  return out;
}

}  // namespace

std::string ProtocolVersion::str() const {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

const char* refusalName(Refusal r) {
  switch (r) {
    case Refusal::kBadMessage:
      return "bad message";
    case Refusal::kVersion:
      return "version mismatch";
    case Refusal::kAuth:
      return "authentication failed";
    case Refusal::kBusy:
      return "busy";
  }
  return "?";
}

const char* runModeName(RunMode mode) {
  switch (mode) {
    case RunMode::kTrain:
      return "train";
    case RunMode::kInfer:
      return "infer";
    case RunMode::kGenerate:
      return "generate";
  }
  return "?";
}

const char* messageName(const Message& m) {
  static constexpr const char* kNames[] = {"hello",           "proof",         "refused",
                                           "node info",       "ping",          "pong",
                                           "leave",           "error",         "launch",
                                           "launched",        "worker ended",  "link task",
                                           "link result",     "worker hello",  "assign",
                                           "weights request", "weights chunk", "ready",
                                           "start",           "group address", "group addresses",
                                           "progress",        "epoch done",    "infer done",
                                           "stage report",    "failed",        "profile task",
                                           "profile result",  "checkpointed",  "answer",
                                           "prompt",          "prompts done",  "token",
                                           "cancel prompt",   "stage busy"};
  static_assert(std::size(kNames) == std::variant_size_v<Message>);
  return kNames[m.index()];
}

std::vector<uint8_t> encodeMessage(const Message& m) {
  flatbuffers::FlatBufferBuilder b(256);
  const auto body = std::visit([&](const auto& v) { return build(b, v); }, m);
  fb::FinishMessageBuffer(b, fb::CreateMessage(b, bodyType(m), body));
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

namespace {

// The tasks a coordinator gives a node's daemon beside runs (link and profile tasks) and
// their results.
Message readTaskMessage(const fb::Message* msg) {
  switch (msg->body_type()) {
    case fb::Body_LinkTask: {
      const fb::LinkTask* t = msg->body_as_LinkTask();
      const char* m = "link task";
      LinkTask out;
      out.pair = t->pair();
      nonNegative(m, "pair", out.pair);
      if (t->kind() < 0 || t->kind() > 3) bad(m, "unknown kind " + std::to_string(t->kind()));
      out.kind = static_cast<LinkTaskKind>(t->kind());
      out.bind_host = text(m, "bind_host", t->bind_host(), kMaxNameBytes);
      if (out.bind_host.empty() || out.bind_host.find_first_of(" /*") != std::string::npos)
        bad(m, "bind_host '" + out.bind_host + "' is not a host");
      out.peer = text(m, "peer", t->peer(), kMaxEndpointBytes);
      out.message_bytes = t->message_bytes();
      if (out.message_bytes < 4 || out.message_bytes > (int64_t{1} << 30) || out.message_bytes % 4)
        bad(m, "message_bytes " + std::to_string(out.message_bytes) +
                   " is not a multiple of 4 from 4 to 1 GiB");
      out.window = t->window();
      out.warmup = t->warmup();
      out.repeats = t->repeats();
      out.loaded = t->loaded();
      if (out.window < 1 || out.window > 1024 || out.warmup < 0 || out.warmup > 1000 ||
          out.repeats < 1 || out.repeats > 10000)
        bad(m, "window, warmup or repeats out of range");
      return out;
    }
    case fb::Body_LinkResult:
      return readLinkResult(msg->body_as_LinkResult());
    case fb::Body_ProfileTask: {
      const fb::ProfileTask* t = msg->body_as_ProfileTask();
      const char* m = "profile task";
      ProfileTask out;
      out.model_spec = text(m, "model_spec", t->model_spec(), kMaxModelSpecBytes);
      out.batch = t->batch();
      out.warmup = t->warmup();
      out.repeats = t->repeats();
      if (out.batch < 1 || out.batch > 65536)
        bad(m, "batch " + std::to_string(out.batch) + " is not from 1 to 65536");
      if (out.warmup < 0 || out.warmup > 1000 || out.repeats < 1 || out.repeats > 10000)
        bad(m, "warmup or repeats out of range");
      out.least_batch = t->least_batch();
      if (out.least_batch < 0 || out.least_batch > out.batch)
        bad(m, "least batch " + std::to_string(out.least_batch) + " is not from 0 to the batch (" +
                   std::to_string(out.batch) + ")");
      const auto* devices = t->devices();
      if (!devices || devices->size() == 0 || devices->size() > kMaxProfileDevices)
        bad(m, "it must name 1 to " + std::to_string(kMaxProfileDevices) + " devices");
      for (const fb::ProfileDevice* d : *devices) {
        ProfileDevice pd{text(m, "backend", d->backend(), kMaxNameBytes), d->threads(), d->load()};
        if (pd.backend.empty()) bad(m, "a device without a backend");
        if (pd.threads < 1 || pd.threads > 1024 || pd.load < 0 || pd.load > 256)
          bad(m, "device '" + pd.backend + "': threads or load out of range");
        out.devices.push_back(std::move(pd));
      }
      if (const auto* more = t->more_batches()) {
        if (more->size() > kMaxMoreBatches)
          bad(m, "it asks " + std::to_string(more->size()) + " more batches, over " +
                     std::to_string(kMaxMoreBatches));
        // Copied out: a crafted buffer may misalign the vector (core/flatbuffers_read.h).
        for (const int64_t b : copyInt64s(more)) {
          if (b < 1 || b > 65536)
            bad(m, "more batch " + std::to_string(b) + " is not from 1 to 65536");
          if (b == out.batch || std::find(out.more_batches.begin(), out.more_batches.end(), b) !=
                                    out.more_batches.end())
            bad(m, "batch " + std::to_string(b) + " is asked twice");
          out.more_batches.push_back(b);
        }
      }
      return out;
    }
    case fb::Body_ProfileResult: {
      const fb::ProfileResult* r = msg->body_as_ProfileResult();
      const char* m = "profile result";
      ProfileResult out{text(m, "profile", r->profile(), kMaxProfileBytes), r->cached(), {}};
      if (const auto* more = r->more()) {
        if (more->size() > kMaxMoreBatches)
          bad(m, "it holds " + std::to_string(more->size()) + " more profiles, over " +
                     std::to_string(kMaxMoreBatches));
        size_t total = out.profile.size();
        for (const flatbuffers::String* p : *more) {
          out.more.push_back(text(m, "more", p, kMaxProfileBytes));
          total += out.more.back().size();
        }
        if (total > kMaxProfileResultBytes)
          bad(m, "its profiles take " + std::to_string(total) + " bytes, over " +
                     std::to_string(kMaxProfileResultBytes));
      }
      const size_t profiles = 1 + out.more.size();
      if (out.cached < 0 || static_cast<size_t>(out.cached) > kMaxProfileDevices * profiles)
        bad(m, "cached " + std::to_string(out.cached) + " is out of range");
      return out;
    }
    default:
      throw FormatError("bad control message: not a task");
  }
}

}  // namespace

Message decodeMessage(std::span<const uint8_t> bytes) {
  if (bytes.size() < 8)
    throw FormatError("bad control message: " + std::to_string(bytes.size()) +
                      " bytes is too short");
  if (bytes.size() > kMaxMessageBytes)
    throw FormatError("bad control message: " + std::to_string(bytes.size()) +
                      " bytes exceeds the cap of " + std::to_string(kMaxMessageBytes));
  // The verifier needs the buffer aligned as FlatBuffers lays it out; frames arrive in
  // byte vectors at any offset, so copy into 8-byte-aligned storage.
  std::vector<uint64_t> aligned((bytes.size() + 7) / 8);
  std::memcpy(aligned.data(), bytes.data(), bytes.size());
  const auto* data = reinterpret_cast<const uint8_t*>(aligned.data());
  if (!fb::MessageBufferHasIdentifier(data))
    throw FormatError("bad control message: missing the 'TDC1' identifier");
  flatbuffers::Verifier verifier(data, bytes.size(), /*max_depth=*/8, /*max_tables=*/8192);
  if (!fb::VerifyMessageBuffer(verifier))
    throw FormatError("bad control message: failed FlatBuffers verification");
  const fb::Message* msg = fb::GetMessage(data);
  // The verifier lets a union's value be absent while its type is set (found by the
  // fuzzer): every body_as_* below would be null.
  if (msg->body_type() != fb::Body_NONE && !msg->body())
    throw FormatError("bad control message: a '" + std::string(fb::EnumNameBody(msg->body_type())) +
                      "' without its body");
  switch (msg->body_type()) {
    case fb::Body_Hello: {
      const fb::Hello* h = msg->body_as_Hello();
      Hello out;
      out.version = {h->major(), h->minor(), h->patch()};
      out.build = text("hello", "build", h->build(), kMaxNameBytes);
      out.nonce = exactBytes<kNonceBytes>("hello", "nonce", h->nonce());
      return out;
    }
    case fb::Body_Proof:
      return Proof{exactBytes<kMacBytes>("proof", "mac", msg->body_as_Proof()->mac())};
    case fb::Body_Refused: {
      const fb::Refused* r = msg->body_as_Refused();
      if (r->reason() < fb::Refusal_MIN || r->reason() > fb::Refusal_MAX)
        bad("refused", "unknown reason " + std::to_string(r->reason()));
      return Refused{static_cast<Refusal>(r->reason()),
                     text("refused", "message", r->message(), kMaxTextBytes)};
    }
    case fb::Body_NodeInfo:
      return readNodeInfo(msg->body_as_NodeInfo());
    case fb::Body_Ping: {
      const fb::Ping* p = msg->body_as_Ping();
      return Ping{p->id(), p->sent_ns()};
    }
    case fb::Body_Pong: {
      const fb::Pong* p = msg->body_as_Pong();
      return Pong{p->id(), p->ping_sent_ns(), p->received_ns(), p->sent_ns()};
    }
    case fb::Body_Leave:
      return Leave{text("leave", "reason", msg->body_as_Leave()->reason(), kMaxTextBytes)};
    case fb::Body_Error:
      return ErrorReply{text("error", "message", msg->body_as_Error()->message(), kMaxTextBytes)};
    case fb::Body_Launch: {
      const fb::Launch* l = msg->body_as_Launch();
      Launch out;
      out.slot = l->slot();
      if (out.slot < 0) bad("launch", "slot is negative (" + std::to_string(out.slot) + ")");
      out.coordinator = text("launch", "coordinator", l->coordinator(), kMaxEndpointBytes);
      out.key = exactBytes<32>("launch", "key", l->key());
      return out;
    }
    case fb::Body_Launched: {
      const fb::Launched* l = msg->body_as_Launched();
      if (l->slot() < 0 || l->pid() < 0) bad("launched", "a negative slot or pid");
      return Launched{l->slot(), l->pid()};
    }
    case fb::Body_WorkerEnded: {
      const fb::WorkerEnded* w = msg->body_as_WorkerEnded();
      if (w->slot() < 0) bad("worker ended", "slot is negative");
      return WorkerEnded{w->slot(), text("worker ended", "how", w->how(), kMaxTextBytes),
                         w->killed()};
    }
    case fb::Body_LinkTask:
    case fb::Body_LinkResult:
    case fb::Body_ProfileTask:
    case fb::Body_ProfileResult:
      return readTaskMessage(msg);
    case fb::Body_WorkerHello:
    case fb::Body_Assign:
    case fb::Body_WeightsRequest:
    case fb::Body_WeightsChunk:
    case fb::Body_Ready:
    case fb::Body_Start:
    case fb::Body_GroupAddress:
    case fb::Body_GroupAddresses:
    case fb::Body_Progress:
    case fb::Body_EpochDone:
    case fb::Body_InferDone:
    case fb::Body_StageReport:
    case fb::Body_Failed:
    case fb::Body_Checkpointed:
    case fb::Body_Answer:
    case fb::Body_Prompt:
    case fb::Body_PromptsDone:
    case fb::Body_Token:
    case fb::Body_CancelPrompt:
    case fb::Body_StageBusy:
      return readStageMessage(msg);
    default:
      throw FormatError("bad control message: unknown body type " +
                        std::to_string(static_cast<int>(msg->body_type())));
  }
}

}  // namespace tandem::runtime
