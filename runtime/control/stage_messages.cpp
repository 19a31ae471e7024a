// The messages between a coordinator and a stage worker: encoders, and a decoder that
// checks every field (ranges, lengths, the stage and replica arithmetic) before any of it
// is used to build a model or open a link.
#include <cmath>
#include <cstring>
#include <limits>

#include "core/flatbuffers_read.h"
#include "runtime/control/files.h"
#include "runtime/control/message_codec.h"

namespace tandem::runtime::detail {

namespace {

using B = flatbuffers::FlatBufferBuilder;
using Strings = flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>;

flatbuffers::Offset<Strings> endpoints(B& b, const char* message,
                                       const std::vector<std::string>& list) {
  checkCount(message, "endpoints", list.size(), static_cast<size_t>(kMaxReplicas));
  for (const std::string& e : list) checkText(message, "endpoint", e, kMaxEndpointBytes);
  return b.CreateVectorOfStrings(list);
}

std::vector<std::string> readEndpoints(const char* message, const char* field, const Strings* v) {
  std::vector<std::string> out;
  if (!v) return out;
  if (v->size() > static_cast<size_t>(kMaxReplicas))
    bad(message, std::to_string(v->size()) + " " + field + " endpoints exceed the limit of " +
                     std::to_string(kMaxReplicas));
  for (const flatbuffers::String* s : *v) out.push_back(text(message, field, s, kMaxEndpointBytes));
  return out;
}

Assign readAssign(const fb::Assign* a) {
  const char* m = "assign";
  Assign out;
  out.job = text(m, "job", a->job(), kMaxNameBytes);
  out.model_spec = text(m, "model_spec", a->model_spec(), kMaxModelSpecBytes);
  out.stages = a->stages();
  range(m, "stages", out.stages, 1, kMaxStages);
  out.stage = a->stage();
  range(m, "stage", out.stage, 0, out.stages - 1);
  out.replicas = a->replicas();
  range(m, "replicas", out.replicas, 1, kMaxReplicas);
  out.replica = a->replica();
  range(m, "replica", out.replica, 0, out.replicas - 1);
  // Generation and interleaved stages link the first stage and the last (one replica each).
  if (a->infer() && a->generate()) bad(m, "a stage cannot both infer and generate");
  out.mode = a->generate() ? RunMode::kGenerate : a->infer() ? RunMode::kInfer : RunMode::kTrain;
  const bool generates = out.mode == RunMode::kGenerate;
  // Copied out: a crafted buffer may misalign the vector (core/flatbuffers_read.h).
  const std::vector<int64_t> chunk_bounds = copyInt64s(a->chunks());
  const size_t chunk_values = chunk_bounds.size();
  if (chunk_values % 2 != 0 || chunk_values > 2 * 64 || chunk_values == 2)
    bad(m, std::to_string(chunk_values) +
               " chunk bounds: expected begin, end pairs of 2 to 64 chunks, or none");
  const bool interleaved = chunk_values > 0;
  const bool ring = (generates || interleaved) && out.stages > 1;
  if (generates || interleaved) range(m, "replicas", out.replicas, 1, 1);
  if (generates && interleaved) bad(m, "a generating stage holds one chunk");
  if (interleaved && out.stages == 1) bad(m, "chunks on a pipeline of one stage");
  out.prev_replicas = a->prev_replicas();
  const bool first = out.stage == 0 && !ring;
  range(m, "prev_replicas", out.prev_replicas, first ? 0 : 1, first ? 0 : ring ? 1 : kMaxReplicas);
  out.next_replicas = a->next_replicas();
  const bool last = out.stage == out.stages - 1 && !ring;
  range(m, "next_replicas", out.next_replicas, last ? 0 : 1, last ? 0 : ring ? 1 : kMaxReplicas);
  out.in_flight = a->in_flight();
  range(m, "in_flight", out.in_flight, 1, 1024);
  const int64_t layer_begin = a->layer_begin(), layer_end = a->layer_end();
  range(m, "layer_begin", layer_begin, 0, int64_t{1} << 20);
  range(m, "layer_end", layer_end, layer_begin + 1, int64_t{1} << 20);
  StageSlice& slice = out.slice;
  slice.layers = {static_cast<size_t>(layer_begin), static_cast<size_t>(layer_end)};
  for (size_t i = 0; i < chunk_values; i += 2) {
    const int64_t begin = chunk_bounds[i], end = chunk_bounds[i + 1];
    const int64_t after =
        slice.chunks.empty() ? layer_begin : static_cast<int64_t>(slice.chunks.back().end);
    if (begin < after || end <= begin || end > layer_end)
      bad(m, "chunk " + std::to_string(i / 2) + " [" + std::to_string(begin) + ", " +
                 std::to_string(end) + ") is empty, out of order or outside layers [" +
                 std::to_string(layer_begin) + ", " + std::to_string(layer_end) + ")");
    slice.chunks.push_back({static_cast<size_t>(begin), static_cast<size_t>(end)});
  }
  if (interleaved && (slice.chunks.front().begin != slice.layers.begin ||
                      slice.chunks.back().end != slice.layers.end))
    bad(m, "the chunks do not span layers [" + std::to_string(layer_begin) + ", " +
               std::to_string(layer_end) + ")");
  slice.device = text(m, "device", a->device(), kMaxNameBytes);
  slice.threads = a->threads();
  range(m, "threads", slice.threads, 1, 1024);
  slice.tensor = a->tensor();
  range(m, "tensor", slice.tensor, 1, kMaxTensorRanks);
  slice.tensor_shares = readShares(m, "tensor share", a->tensor_shares());
  if (!slice.tensor_shares.empty() &&
      slice.tensor_shares.size() != static_cast<size_t>(slice.tensor))
    bad(m, std::to_string(slice.tensor_shares.size()) + " tensor shares for " +
               std::to_string(slice.tensor) + " tensor ranks");
  if (const auto* devices = a->tensor_devices()) {
    if (devices->size() != static_cast<flatbuffers::uoffset_t>(slice.tensor))
      bad(m, std::to_string(devices->size()) + " tensor devices for " +
                 std::to_string(slice.tensor) + " tensor ranks");
    for (const flatbuffers::String* d : *devices)
      slice.tensor_devices.push_back(text(m, "tensor device", d, kMaxNameBytes));
    if (slice.tensor_devices.front() != slice.device)
      bad(m, "tensor rank 0's device '" + slice.tensor_devices.front() + "' is not the stage's '" +
                 slice.device + "'");
  }
  if (slice.tensor > 1 && ((generates && out.stage == 0) || interleaved || out.replicas > 1))
    bad(m, "a tensor-split stage cannot be a generation's first, be interleaved or have replicas");
  out.train = readTrain(m, a->train());
  out.data = readData(m, a->data());
  out.wire = readWire(m, a->wire());
  if (interleaved != (out.train.schedule == ScheduleKind::kInterleaved1F1B) && !generates)
    bad(m, interleaved ? "chunks need the interleaved schedule"
                       : "the interleaved schedule needs 2 or more chunks");
  out.record_spans = a->record_spans();
  out.save = a->save();
  out.bind_host = text(m, "bind_host", a->bind_host(), kMaxNameBytes);
  if (out.bind_host.empty() || out.bind_host.find_first_of(" /*") != std::string::npos)
    bad(m, "bind_host '" + out.bind_host + "' is not a host");
  out.transport = text(m, "transport", a->transport(), 8);
  if (out.transport != "tcp" && out.transport != "ipc")
    bad(m, "transport '" + out.transport + "' is not tcp or ipc");
  out.weights_hash = text(m, "weights_hash", a->weights_hash(), 64);
  out.weights_bytes = a->weights_bytes();
  if (!out.weights_hash.empty() && !isContentHash(out.weights_hash))
    bad(m, "weights_hash '" + out.weights_hash + "' is not 64 hex digits");
  range(m, "weights_bytes", out.weights_bytes, out.weights_hash.empty() ? 0 : 1,
        out.weights_hash.empty() ? 0 : kMaxWeightsBytes);
  out.encrypt = a->encrypt();
  CheckpointSettings& checkpoint = out.checkpoint;
  checkpoint.every_steps = a->checkpoint_every();
  range(m, "checkpoint_every", checkpoint.every_steps, 0, int64_t{1} << 40);
  checkpoint.start_step = a->start_step();
  range(m, "start_step", checkpoint.start_step, 0, int64_t{1} << 40);
  checkpoint.restore_optimizer = a->restore_optimizer();
  if (checkpoint.restore_optimizer && out.weights_hash.empty())
    bad(m, "restore_optimizer without starting weights to restore it from");
  out.infer_from = a->infer_from();
  range(m, "infer_from", out.infer_from, 0, int64_t{1} << 40);
  if (out.infer_from % out.train.batch != 0)
    bad(m, "infer_from " + std::to_string(out.infer_from) + " is not a multiple of the batch " +
               std::to_string(out.train.batch));
  out.request_rate = a->request_rate();
  if (!(out.request_rate >= 0 && out.request_rate <= 1e6))  // (NaN fails too)
    bad(m, "request_rate " + std::to_string(out.request_rate) + " is not in [0, 1e6]");
  return out;
}

// A report's counters (`r`: the report's own, or a tensor rank's), checked.
template <typename Fields>
StageCounters readCounters(const char* m, const Fields* r) {
  StageCounters c;
  c.busy_s = r->busy_s();
  c.step_s = r->step_s();
  c.compute_cpu_s = r->compute_cpu_s();
  c.recv_wait_s = r->recv_wait_s();
  c.send_s = r->send_s();
  c.allreduce_s = r->allreduce_s();
  for (const auto& [field, v] : {std::pair{"busy_s", c.busy_s},
                                 {"step_s", c.step_s},
                                 {"compute_cpu_s", c.compute_cpu_s},
                                 {"recv_wait_s", c.recv_wait_s},
                                 {"send_s", c.send_s},
                                 {"allreduce_s", c.allreduce_s}})
    finiteNonNegative(m, field, v);
  c.peak_stash = r->peak_stash();
  c.microbatches = r->microbatches();
  c.samples = r->samples();
  nonNegative(m, "peak_stash", c.peak_stash);
  nonNegative(m, "microbatches", c.microbatches);
  nonNegative(m, "samples", c.samples);
  return c;
}

StageReport readReport(const fb::StageReport* r) {
  const char* m = "stage report";
  StageReport out;
  out.counters = readCounters(m, r);
  out.run_s = r->run_s();
  finiteNonNegative(m, "run_s", out.run_s);
  if (const auto* ranks = r->tensor_ranks()) {
    if (ranks->size() >= static_cast<flatbuffers::uoffset_t>(kMaxTensorRanks))
      bad(m, std::to_string(ranks->size()) + " tensor ranks' counters (at most " +
                 std::to_string(kMaxTensorRanks - 1) + ")");
    for (const fb::RankCounters* rank : *ranks) {
      if (!rank) bad(m, "a tensor rank's counters are missing");
      out.tensor_ranks.push_back(readCounters("stage report (a tensor rank's counters)", rank));
    }
  }
  out.bytes_sent = r->bytes_sent();
  out.bytes_received = r->bytes_received();
  if (const auto* spans = r->spans()) {
    if (spans->size() > kMaxSpans)
      bad(m, std::to_string(spans->size()) + " spans exceed the limit of " +
                 std::to_string(kMaxSpans));
    // Each struct is copied out before it is read: the verifier checks the vector's bounds,
    // not that its 8-byte structs are aligned, and a hostile message's may not be (read in
    // place, that is undefined behaviour, and a fault on some ARM cores; the fuzzer found it).
    const auto* bytes = reinterpret_cast<const uint8_t*>(spans->Data());
    for (flatbuffers::uoffset_t i = 0; i < spans->size(); ++i) {
      fb::SpanRecord span;
      std::memcpy(&span, bytes + i * sizeof(fb::SpanRecord), sizeof(fb::SpanRecord));
      const fb::SpanRecord* s = &span;
      range(m, "a span's type", s->type(), 0, static_cast<int>(ActionType::kStep));
      if (!std::isfinite(s->start_s()) || !std::isfinite(s->end_s()) || s->end_s() < s->start_s())
        bad(m, "a span ends before it starts, or at no finite time");
      out.spans.push_back(
          {static_cast<ActionType>(s->type()), s->microbatch(), s->start_s(), s->end_s()});
    }
  }
  out.model_hash = text(m, "model_hash", r->model_hash(), 64);
  out.model_bytes = r->model_bytes();
  if (!out.model_hash.empty() && !isContentHash(out.model_hash))
    bad(m, "model_hash '" + out.model_hash + "' is not 64 hex digits");
  range(m, "model_bytes", out.model_bytes, out.model_hash.empty() ? 0 : 1,
        out.model_hash.empty() ? 0 : kMaxWeightsBytes);
  out.weights_shipped = r->weights_shipped();
  nonNegative(m, "weights_shipped", out.weights_shipped);
  out.weights_ship_s = r->weights_ship_s();
  finiteNonNegative(m, "weights_ship_s", out.weights_ship_s);
  out.weights_cached = r->weights_cached();
  out.weights_corrupted = r->weights_corrupted();
  out.step_mean_s = r->step_mean_s();
  finiteNonNegative(m, "step_mean_s", out.step_mean_s);
  out.steps_timed = r->steps_timed();
  out.start_rss_bytes = r->start_rss_bytes();
  out.peak_rss_bytes = r->peak_rss_bytes();
  nonNegative(m, "steps_timed", out.steps_timed);
  nonNegative(m, "start_rss_bytes", out.start_rss_bytes);
  nonNegative(m, "peak_rss_bytes", out.peak_rss_bytes);
  out.peak_tensor_bytes = r->peak_tensor_bytes();
  out.process_cpu_s = r->process_cpu_s();
  finiteNonNegative(m, "process_cpu_s", out.process_cpu_s);
  range(m, "peak_tensor_bytes", out.peak_tensor_bytes, -1, std::numeric_limits<int64_t>::max());
  out.weight_bytes = r->weight_bytes();
  out.gradient_peak_bytes = r->gradient_peak_bytes();
  out.state_bytes = r->state_bytes();
  for (const auto& [field, v] : {std::pair<const char*, int64_t>{"weight_bytes", out.weight_bytes},
                                 {"gradient_peak_bytes", out.gradient_peak_bytes},
                                 {"state_bytes", out.state_bytes}})
    range(m, field, v, -1, std::numeric_limits<int64_t>::max());
  return out;
}

}  // namespace

flatbuffers::Offset<void> build(B& b, const Assign& m) {
  const char* name = "assign";
  checkText(name, "job", m.job, kMaxNameBytes);
  checkText(name, "model_spec", m.model_spec, kMaxModelSpecBytes);
  checkText(name, "device", m.slice.device, kMaxNameBytes);
  checkText(name, "bind_host", m.bind_host, kMaxNameBytes);
  auto train = buildTrain(b, m.train);
  auto data = buildData(b, m.data);
  auto wire = buildWire(b, m.wire);
  auto job = b.CreateString(m.job);
  auto spec = b.CreateString(m.model_spec);
  auto device = b.CreateString(m.slice.device);
  auto host = b.CreateString(m.bind_host);
  auto transport = b.CreateString(m.transport);
  auto weights_hash = b.CreateString(m.weights_hash);
  std::vector<int64_t> bounds;
  for (const LayerRange& r : m.slice.chunks) {
    bounds.push_back(static_cast<int64_t>(r.begin));
    bounds.push_back(static_cast<int64_t>(r.end));
  }
  auto chunks =
      bounds.empty() ? flatbuffers::Offset<flatbuffers::Vector<int64_t>>() : b.CreateVector(bounds);
  checkCount(name, "tensor_shares", m.slice.tensor_shares.size(), kMaxReplicaShares);
  checkCount(name, "tensor_devices", m.slice.tensor_devices.size(),
             static_cast<size_t>(kMaxTensorRanks));
  for (const std::string& d : m.slice.tensor_devices)
    checkText(name, "tensor device", d, kMaxNameBytes);
  auto tensor_devices =
      m.slice.tensor_devices.empty()
          ? flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>>()
          : b.CreateVectorOfStrings(m.slice.tensor_devices);
  auto tensor_shares = m.slice.tensor_shares.empty()
                           ? flatbuffers::Offset<flatbuffers::Vector<double>>()
                           : b.CreateVector(m.slice.tensor_shares);
  return fb::CreateAssign(b, job, spec, m.stage, m.stages, m.replica, m.replicas, m.prev_replicas,
                          m.next_replicas, static_cast<int64_t>(m.slice.layers.begin),
                          static_cast<int64_t>(m.slice.layers.end), device, m.slice.threads, train,
                          data, wire, m.mode == RunMode::kInfer, m.record_spans, m.save, host,
                          transport, weights_hash, m.weights_bytes, m.encrypt,
                          m.checkpoint.every_steps, m.checkpoint.start_step,
                          m.checkpoint.restore_optimizer, m.infer_from, m.request_rate,
                          m.mode == RunMode::kGenerate, m.in_flight, chunks, m.slice.tensor,
                          tensor_shares, tensor_devices)
      .Union();
}

flatbuffers::Offset<void> build(B& b, const WorkerHello& m) {
  return fb::CreateWorkerHello(b, m.slot, m.pid).Union();
}

flatbuffers::Offset<void> build(B& b, const WeightsRequest& m) {
  return fb::CreateWeightsRequest(b, b.CreateString(m.hash)).Union();
}

flatbuffers::Offset<void> build(B& b, const WeightsChunk& m) {
  checkCount("weights chunk", "bytes", m.bytes.size(), kMaxWeightsChunk);
  auto hash = b.CreateString(m.hash);
  return fb::CreateWeightsChunk(b, hash, m.offset, m.total, b.CreateVector(m.bytes)).Union();
}

flatbuffers::Offset<void> build(B& b, const Ready& m) {
  auto prev = endpoints(b, "ready", m.prev);
  auto next = endpoints(b, "ready", m.next);
  checkText("ready", "device", m.device, kMaxNameBytes);
  return fb::CreateReady(b, prev, next, b.CreateString(m.device), m.train_samples, m.test_samples)
      .Union();
}

flatbuffers::Offset<void> build(B& b, const Start& m) {
  auto prev = endpoints(b, "start", m.prev);
  auto next = endpoints(b, "start", m.next);
  return fb::CreateStart(b, prev, next, m.train_samples, m.test_samples).Union();
}

flatbuffers::Offset<void> build(B& b, const GroupAddress& m) {
  checkText("group address", "address", m.address, kMaxEndpointBytes);
  return fb::CreateGroupAddress(b, b.CreateString(m.address)).Union();
}

flatbuffers::Offset<void> build(B& b, const GroupAddresses& m) {
  return fb::CreateGroupAddresses(b, endpoints(b, "group addresses", m.addresses)).Union();
}

flatbuffers::Offset<void> build(B& b, const Progress& m) {
  return fb::CreateProgress(b, m.epoch, m.step, m.steps, m.loss, m.samples_per_s, m.elapsed_s)
      .Union();
}

flatbuffers::Offset<void> build(B& b, const EpochDone& m) {
  return fb::CreateEpochDone(b, m.epoch, m.loss, m.seconds, m.samples_per_s, m.test_loss,
                             m.test_accuracy)
      .Union();
}

flatbuffers::Offset<void> build(B& b, const InferDone& m) {
  return fb::CreateInferDone(b, m.samples, m.loss, m.accuracy, m.seconds).Union();
}

flatbuffers::Offset<void> build(B& b, const StageReport& m) {
  checkCount("stage report", "spans", m.spans.size(), kMaxSpans);
  checkText("stage report", "model_hash", m.model_hash, 64);
  std::vector<fb::SpanRecord> spans;
  spans.reserve(m.spans.size());
  for (const Span& s : m.spans)
    spans.emplace_back(static_cast<int8_t>(s.type), s.microbatch, s.start_s, s.end_s);
  auto span_vector = b.CreateVectorOfStructs(spans);
  auto model_hash = b.CreateString(m.model_hash);
  checkCount("stage report", "tensor_ranks", m.tensor_ranks.size(),
             static_cast<size_t>(kMaxTensorRanks - 1));
  std::vector<flatbuffers::Offset<fb::RankCounters>> ranks;
  for (const StageCounters& r : m.tensor_ranks)
    ranks.push_back(fb::CreateRankCounters(b, r.busy_s, r.step_s, r.compute_cpu_s, r.recv_wait_s,
                                           r.send_s, r.allreduce_s, r.peak_stash, r.microbatches,
                                           r.samples));
  auto tensor_ranks = ranks.empty() ? 0 : b.CreateVector(ranks);
  const StageCounters& c = m.counters;
  return fb::CreateStageReport(b, c.busy_s, c.step_s, c.compute_cpu_s, c.recv_wait_s, c.send_s,
                               c.allreduce_s, c.peak_stash, c.microbatches, m.run_s, m.bytes_sent,
                               m.bytes_received, span_vector, m.weights_shipped, m.weights_ship_s,
                               m.weights_cached, m.weights_corrupted, model_hash, m.model_bytes,
                               m.step_mean_s, m.steps_timed, m.start_rss_bytes, m.peak_rss_bytes,
                               m.peak_tensor_bytes, m.process_cpu_s, c.samples, tensor_ranks,
                               m.weight_bytes, m.gradient_peak_bytes, m.state_bytes)
      .Union();
}

flatbuffers::Offset<void> build(B& b, const Checkpointed& m) {
  checkText("checkpointed", "hash", m.hash, 64);
  checkCount("checkpointed", "shares", m.shares.size(), kMaxReplicaShares);
  return fb::CreateCheckpointed(b, m.step, b.CreateString(m.hash), m.bytes,
                                m.shares.empty() ? 0 : b.CreateVector(m.shares))
      .Union();
}

flatbuffers::Offset<void> build(B& b, const Failed& m) {
  const std::string message = m.message.substr(0, kMaxTextBytes);
  return fb::CreateFailed(b, b.CreateString(message)).Union();
}

Message readStageMessage(const fb::Message* msg) {
  switch (msg->body_type()) {
    case fb::Body_WorkerHello: {
      const fb::WorkerHello* h = msg->body_as_WorkerHello();
      range("worker hello", "slot", h->slot(), 0, kMaxStages * kMaxReplicas);
      range("worker hello", "pid", h->pid(), 1, int64_t{1} << 31);
      return WorkerHello{h->slot(), h->pid()};
    }
    case fb::Body_Assign:
      return readAssign(msg->body_as_Assign());
    case fb::Body_WeightsRequest: {
      WeightsRequest out{
          text("weights request", "hash", msg->body_as_WeightsRequest()->hash(), 64)};
      if (!isContentHash(out.hash))
        bad("weights request", "hash '" + out.hash + "' is not 64 hex digits");
      return out;
    }
    case fb::Body_WeightsChunk: {
      const fb::WeightsChunk* c = msg->body_as_WeightsChunk();
      const char* m = "weights chunk";
      WeightsChunk out;
      out.hash = text(m, "hash", c->hash(), 64);
      if (!isContentHash(out.hash)) bad(m, "hash '" + out.hash + "' is not 64 hex digits");
      out.total = c->total();
      range(m, "total", out.total, 1, kMaxWeightsBytes);
      out.offset = c->offset();
      range(m, "offset", out.offset, 0, out.total - 1);
      if (const auto* bytes = c->bytes()) {
        if (bytes->size() > kMaxWeightsChunk || bytes->size() == 0 ||
            static_cast<int64_t>(bytes->size()) > out.total - out.offset)
          bad(m, std::to_string(bytes->size()) + " bytes at offset " + std::to_string(out.offset) +
                     " of " + std::to_string(out.total));
        out.bytes.assign(bytes->begin(), bytes->end());
      } else {
        bad(m, "no bytes");
      }
      return out;
    }
    case fb::Body_Ready: {
      const fb::Ready* r = msg->body_as_Ready();
      Ready out{readEndpoints("ready", "prev", r->prev()),
                readEndpoints("ready", "next", r->next()),
                text("ready", "device", r->device(), kMaxNameBytes), r->train_samples(),
                r->test_samples()};
      range("ready", "train_samples", out.train_samples, -1, int64_t{1} << 40);
      range("ready", "test_samples", out.test_samples, -1, int64_t{1} << 40);
      return out;
    }
    case fb::Body_Start: {
      const fb::Start* s = msg->body_as_Start();
      Start out{readEndpoints("start", "prev", s->prev()),
                readEndpoints("start", "next", s->next()), s->train_samples(), s->test_samples()};
      range("start", "train_samples", out.train_samples, 0, int64_t{1} << 40);
      range("start", "test_samples", out.test_samples, 0, int64_t{1} << 40);
      return out;
    }
    case fb::Body_GroupAddress:
      return GroupAddress{text("group address", "address", msg->body_as_GroupAddress()->address(),
                               kMaxEndpointBytes)};
    case fb::Body_GroupAddresses:
      return GroupAddresses{readEndpoints("group addresses", "addresses",
                                          msg->body_as_GroupAddresses()->addresses())};
    case fb::Body_Progress: {
      const fb::Progress* p = msg->body_as_Progress();
      Progress out{p->epoch(), p->step(),          p->steps(),
                   p->loss(),  p->samples_per_s(), p->elapsed_s()};
      nonNegative("progress", "epoch", out.epoch);
      range("progress", "step", out.step, 0, std::max<int64_t>(out.steps, 0));
      return out;
    }
    case fb::Body_EpochDone: {
      const fb::EpochDone* e = msg->body_as_EpochDone();
      EpochDone out{e->epoch(),         e->loss(),      e->seconds(),
                    e->samples_per_s(), e->test_loss(), e->test_accuracy()};
      nonNegative("epoch done", "epoch", out.epoch);
      finiteNonNegative("epoch done", "seconds", out.seconds);
      if (!(out.test_accuracy >= 0 && out.test_accuracy <= 1))  // (NaN fails too)
        bad("epoch done",
            "test_accuracy " + std::to_string(out.test_accuracy) + " is not in [0, 1]");
      return out;
    }
    case fb::Body_InferDone: {
      const fb::InferDone* i = msg->body_as_InferDone();
      InferDone out{i->samples(), i->loss(), i->accuracy(), i->seconds()};
      nonNegative("infer done", "samples", out.samples);
      finiteNonNegative("infer done", "seconds", out.seconds);
      if (!(out.accuracy >= 0 && out.accuracy <= 1))
        bad("infer done", "accuracy " + std::to_string(out.accuracy) + " is not in [0, 1]");
      return out;
    }
    case fb::Body_StageReport:
      return readReport(msg->body_as_StageReport());
    case fb::Body_Failed:
      return Failed{text("failed", "message", msg->body_as_Failed()->message(), kMaxTextBytes)};
    case fb::Body_Checkpointed: {
      const fb::Checkpointed* c = msg->body_as_Checkpointed();
      const char* m = "checkpointed";
      Checkpointed out{c->step(), text(m, "hash", c->hash(), 64), c->bytes(),
                       readShares(m, "share", c->shares())};
      range(m, "step", out.step, 1, int64_t{1} << 40);
      if (!isContentHash(out.hash)) bad(m, "hash '" + out.hash + "' is not 64 hex digits");
      range(m, "bytes", out.bytes, 1, kMaxWeightsBytes);
      return out;
    }
    case fb::Body_Answer:
    case fb::Body_Prompt:
    case fb::Body_PromptsDone:
    case fb::Body_Token:
    case fb::Body_CancelPrompt:
    case fb::Body_StageBusy:
      return readServingMessage(msg);
    default:
      bad("?", "not a stage worker's message");
  }
}

}  // namespace tandem::runtime::detail
