// The settings an assignment carries (job_settings.h): each encoded, and decoded with
// every field checked, here only.
#include "core/flatbuffers_read.h"
#include "core/optimizer.h"
#include "runtime/control/message_codec.h"

namespace tandem::runtime::detail {

namespace {

using B = flatbuffers::FlatBufferBuilder;

WireCodec codec(const char* message, const char* field, uint8_t v) {
  range(message, field, v, 0, 3);
  return static_cast<WireCodec>(v);
}

}  // namespace

std::vector<double> readShares(const char* m, const char* share,
                               const flatbuffers::Vector<double>* v) {
  if (!v) return {};
  if (v->size() > kMaxReplicaShares)
    bad(m, std::to_string(v->size()) + " " + share + "s (at most " +
               std::to_string(kMaxReplicaShares) + ")");
  // Copied out: a crafted buffer may misalign the vector (core/flatbuffers_read.h).
  std::vector<double> out = copyScalars(v);
  for (const double s : out)
    if (!(s > 0 && s <= 1e9)) bad(m, std::string("a ") + share + " is not in (0, 1e9]");
  return out;
}

TrainSettings readTrain(const char* m, const fb::TrainSettings* t) {
  if (!t) bad(m, "no train settings");
  TrainSettings out;
  range(m, "schedule", t->schedule(), 0, 3);
  out.schedule = t->schedule() == 0   ? ScheduleKind::kGPipe
                 : t->schedule() == 1 ? ScheduleKind::k1F1B
                 : t->schedule() == 2 ? ScheduleKind::kZeroBubbleH1
                                      : ScheduleKind::kInterleaved1F1B;
  out.batch = t->batch();
  range(m, "batch", out.batch, 1, int64_t{1} << 30);
  out.microbatches = t->microbatches();
  range(m, "microbatches", out.microbatches, 1, out.batch);
  out.epochs = t->epochs();
  range(m, "epochs", out.epochs, 0, int64_t{1} << 20);
  out.seed = t->seed();
  out.recompute = t->recompute();
  out.microbatch_shares = readShares(m, "microbatch share", t->microbatch_shares());
  out.rebalance_steps = t->rebalance_steps();
  range(m, "rebalance_steps", out.rebalance_steps, 0, kMaxRebalanceSteps);
  range(m, "zero", t->zero(), 0, 2);
  out.zero = t->zero();
  out.state_shares = readShares(m, "state share", t->state_shares());
  OptimizerOptions& o = out.optimizer;
  if (const fb::OptimizerSettings* f = t->optimizer()) {
    o.kind = text(m, "optimizer kind", f->kind(), 16);
    o.lr = f->lr();
    o.momentum = f->momentum();
    o.nesterov = f->nesterov();
    o.weight_decay = f->weight_decay();
    o.beta1 = f->beta1();
    o.beta2 = f->beta2();
    o.eps = f->eps();
    o.lr_schedule = text(m, "optimizer lr_schedule", f->lr_schedule(), 16);
    if (o.lr_schedule.empty()) o.lr_schedule = "constant";
    o.warmup_steps = f->warmup_steps();
    range(m, "warmup_steps", o.warmup_steps, 0, int64_t{1} << 40);
    o.decay_steps = f->decay_steps();
    range(m, "decay_steps", o.decay_steps, 0, int64_t{1} << 40);
    o.decay_factor = f->decay_factor();
    o.min_lr = f->min_lr();
  }
  try {
    validate(o);
  } catch (const InvalidArgument& e) {
    bad(m, e.what());
  }
  return out;
}

DataSettings readData(const char* m, const fb::DataSettings* d) {
  if (!d) bad(m, "no data settings");
  DataSettings out;
  out.name = text(m, "data", d->name(), kMaxNameBytes);
  out.dir = text(m, "data dir", d->dir(), 4096);
  out.train_limit = d->train_limit();
  out.test_limit = d->test_limit();
  nonNegative(m, "train_limit", out.train_limit);
  nonNegative(m, "test_limit", out.test_limit);
  return out;
}

WireSettings readWire(const char* m, const fb::WireSettings* w) {
  if (!w) bad(m, "no wire settings");
  WireSettings out;
  out.activations = codec(m, "activations codec", w->activations());
  out.gradients = codec(m, "gradients codec", w->gradients());
  out.timeout_s = w->timeout_s();
  range(m, "timeout_s", out.timeout_s, 1, 86400);
  return out;
}

flatbuffers::Offset<fb::TrainSettings> buildTrain(B& b, const TrainSettings& t) {
  const auto& o = t.optimizer;
  checkText("assign", "optimizer lr_schedule", o.lr_schedule, 16);
  auto optimizer = fb::CreateOptimizerSettings(b, b.CreateString(o.kind), o.lr, o.momentum,
                                               o.nesterov, o.weight_decay, o.beta1, o.beta2, o.eps,
                                               b.CreateString(o.lr_schedule), o.warmup_steps,
                                               o.decay_steps, o.decay_factor, o.min_lr);
  TANDEM_CHECK_MSG(isTraining(t.schedule), InvalidArgument,
                   "assign: schedule " << scheduleName(t.schedule) << " cannot train");
  const int8_t schedule = t.schedule == ScheduleKind::kGPipe          ? 0
                          : t.schedule == ScheduleKind::k1F1B         ? 1
                          : t.schedule == ScheduleKind::kZeroBubbleH1 ? 2
                                                                      : 3;
  TANDEM_CHECK_MSG(
      t.state_shares.size() <= kMaxReplicaShares, InvalidArgument,
      "assign: " << t.state_shares.size() << " state shares (at most " << kMaxReplicaShares << ")");
  TANDEM_CHECK_MSG(t.microbatch_shares.size() <= kMaxReplicaShares, InvalidArgument,
                   "assign: " << t.microbatch_shares.size() << " microbatch shares (at most "
                              << kMaxReplicaShares << ")");
  return fb::CreateTrainSettings(b, t.epochs, t.batch, t.microbatches, schedule, t.recompute,
                                 t.seed, optimizer, b.CreateVector(t.microbatch_shares),
                                 t.rebalance_steps, static_cast<int8_t>(t.zero),
                                 b.CreateVector(t.state_shares));
}

flatbuffers::Offset<fb::DataSettings> buildData(B& b, const DataSettings& d) {
  checkText("assign", "data", d.name, kMaxNameBytes);
  auto name = b.CreateString(d.name);
  auto dir = b.CreateString(d.dir);
  return fb::CreateDataSettings(b, name, dir, d.train_limit, d.test_limit);
}

flatbuffers::Offset<fb::WireSettings> buildWire(B& b, const WireSettings& w) {
  return fb::CreateWireSettings(b, static_cast<uint8_t>(w.activations),
                                static_cast<uint8_t>(w.gradients), w.timeout_s);
}

}  // namespace tandem::runtime::detail
