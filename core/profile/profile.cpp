#include "core/profile/profile.h"

#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/host_limits.h"
#include "core/loss.h"
#include "core/optimizer.h"
#include "core/random.h"

namespace tandem {

double Sustained::scale() const {
  return pass_s > 0 && burst_pass_s > 0 ? pass_s / burst_pass_s : 1.0;
}

int64_t DeviceProfile::batchIn(const Profile& p) const { return batch > 0 ? batch : p.batch; }

double Sustained::throttle() const {
  if (quota_cores > 0) return scale();
  return scale() > kThrottleNoise ? scale() : 1.0;
}

namespace {

// What the timed passes measured: per layer its forwards and backwards, the loss, and
// layer `first_param`'s backwards without the input gradient.
struct PassTimes {
  std::vector<std::vector<double>> forward, backward;
  std::vector<double> loss, no_input;
};

// `o.warmup` untimed and `o.repeats` timed whole training passes, each layer's run timed
// alone; `loss` (if given) between the last forward and the first backward.
PassTimes timePasses(LayerRunner& runner, size_t first_param, const std::function<void()>& loss,
                     const ProfileOptions& o) {
  const size_t n = runner.size();
  PassTimes t;
  t.forward.resize(n);
  t.backward.resize(n);
  // The first stage runs the model's first layer with parameters without its input
  // gradient: beyond layer 0 that layer is timed so too, in every other pass (the pass
  // stays whole and chained; timing both in one pass would find the second hot).
  const bool no_input = first_param > 0 && first_param < n && runner.runs(first_param);
  for (int r = 0; r < o.warmup + o.repeats; ++r) {
    const bool timed = r >= o.warmup;
    for (size_t i = 0; i < n; ++i) {
      const double s = timeOnce([&] { runner.forward(i); });
      if (timed && runner.runs(i)) t.forward[i].push_back(s);
    }
    if (loss) {
      const double s = timeOnce(loss);
      if (timed) t.loss.push_back(s);
    }
    for (size_t i = n; i-- > 0;) {
      const bool input_grad = !(no_input && i == first_param && timed && (r - o.warmup) % 2 == 1);
      const double s = timeOnce([&] { runner.backward(i, input_grad); });
      if (timed && runner.runs(i)) (input_grad ? t.backward[i] : t.no_input).push_back(s);
    }
  }
  return t;
}

// A language model's decoding per layer (LayerProfile::decode), where it decodes on this
// backend: its layers' forwards all run there and they decode token by token.
void timeDecoding(Model& model, const ProfileOptions& o, DeviceProfile& out) {
  for (const LayerProfile& l : out.layers)
    if (!l.forward_runs) return;
  const Shape& input = model.layer(0).inputShape();
  const int64_t context = input.rank() == 1 ? input[0] / 2 : 0;
  const auto one = timeDecode(model, context, 1, o.warmup, o.repeats);
  if (!one) return;
  const auto batch = timeDecode(model, context, o.decode_batch, o.warmup, o.repeats);
  if (!batch) return;
  for (size_t i = 0; i < out.layers.size(); ++i) {
    out.layers[i].decode = spreadOf(one->seconds[i]);
    out.layers[i].decode_batch = spreadOf(batch->seconds[i]);
    out.layers[i].cache_bytes = one->cache_bytes[i];
  }
  out.decode_context = context;
  out.decode_batch = o.decode_batch;
}

}  // namespace

DeviceProfile profileDevice(const ModelSpec& spec, Backend& backend, const ProfileOptions& o) {
  DeviceProfile out;
  out.device = backend.info();
  for (int64_t n : o.gemm_sizes) {
    GemmRunner g(backend, n);
    const Spread s = timeRepeated([&] { g.run(); }, 1, std::max(3, o.repeats / 3));
    out.gemm.push_back({n, g.flops() / s.median * 1e-9});
  }
  Model model(spec);
  model.build(backend, o.seed);
  TANDEM_CHECK_MSG(
      o.repeats >= 1 && o.warmup >= 0, InvalidArgument,
      "profiling needs repeats >= 1 and warm-up >= 0, got " << o.repeats << " and " << o.warmup);
  LayerRunner runner(model, o.batch, o.seed);
  // Each layer is timed inside a whole training pass (every layer forward in order, then
  // backward in reverse), as a stage runs it: its weights and input are as warm or cold
  // in the caches as the other layers leave them. Timing one layer many times in a row
  // kept it hot and predicted small layers 20-40% fast.
  const size_t n = model.size();
  // The loss, between the last forward and the first backward, where the last stage
  // computes it: on logits of the output's shape and labels of its classes (one per
  // sample, or per token of a language model's [T, vocab]).
  const Shape out_shape = model.layer(n - 1).outputShape().withBatch(o.batch);
  const int64_t classes = out_shape[out_shape.rank() - 1];
  // The loss runs where the backend has it; a device without it cannot hold the last layer.
  const OpUse loss_op{Op::kSoftmaxCrossEntropy, DType::kF32};
  const bool loss_runs = backend.supports(loss_op.op, loss_op.dtype);
  const bool classifier = out_shape.rank() >= 2 && classes > 0 && loss_runs;
  Tensor logits, labels, dlogits;
  if (classifier) {
    Rng rng(o.seed);
    logits = toDevice(backend, out_shape, uniformInit(rng, out_shape.numel(), 1.0f));
    std::vector<int32_t> ids(static_cast<size_t>(out_shape.numel() / classes));
    for (size_t k = 0; k < ids.size(); ++k)
      ids[k] = static_cast<int32_t>(static_cast<int64_t>(k) % classes);
    labels = toDeviceI32(backend, {static_cast<int64_t>(ids.size())}, ids);
    dlogits = backend.empty(out_shape);
  }
  auto lossRun = [&] {
    softmaxCrossEntropy(backend, logits, labels, 1.0f / static_cast<float>(o.batch), dlogits);
    backend.synchronize();
  };
  const size_t first_param = model.firstWithParams();
  PassTimes times =
      timePasses(runner, first_param, classifier ? lossRun : std::function<void()>(), o);
  for (size_t i = 0; i < n; ++i) {
    LayerProfile l;
    l.index = static_cast<int64_t>(i);
    l.type = model.layer(i).type();
    l.output = model.layer(i).outputShape().withBatch(o.batch);
    if (runner.runs(i)) {  // else not timed: zeros, no repeats
      l.forward = spreadOf(std::move(times.forward[i]));
      l.backward = spreadOf(std::move(times.backward[i]));
      if (i == first_param && !times.no_input.empty())
        l.backward_no_input = spreadOf(std::move(times.no_input));
    }
    l.activation_bytes = runner.activationBytes(i);
    l.param_bytes = runner.paramBytes(i);
    l.flops = model.layer(i).flops();
    l.lacks = backend.lacking(model.layer(i).ops(true));
    l.forward_runs = backend.lacking(model.layer(i).ops(false)).empty();
    if (i + 1 == n && !loss_runs) l.lacks.push_back(loss_op);
    out.layers.push_back(std::move(l));
  }
  if (classifier) out.loss = spreadOf(std::move(times.loss));
  if (o.decode) timeDecoding(model, o, out);
  // The update after the pass left gradients in every parameter: zeroed and stepped as
  // the executor does once per training step (the optimizers' own defaults otherwise).
  const std::vector<const char*> kinds =
      o.update ? std::vector<const char*>{"sgd", "adamw"} : std::vector<const char*>{};
  for (const char* kind : kinds) {
    const OpUse step{std::string_view(kind) == "sgd" ? Op::kSgdStep : Op::kAdamwStep, DType::kF32};
    if (!backend.supports(step.op, step.dtype)) continue;  // not measured: it lacks the step
    OptimizerOptions oo;
    oo.kind = kind;
    Optimizer optimizer(backend, oo);
    out.update[kind] = timeRepeated(
        [&] {
          model.zeroGrad();
          optimizer.step(model.params());
          backend.synchronize();
        },
        o.warmup, o.repeats);
  }
  Sustained& su = out.sustained;
  for (const LayerProfile& l : out.layers) su.burst_pass_s += l.forward.median + l.backward.median;
  su.burst_pass_s += out.loss.median;
  if (o.sustain_s > 0) {
    const CpuLimit limit = cpuLimit();
    su.cpu_cores = limit.cores();
    su.quota_cores = limit.quota_cores;
    su.quota_period_s = limit.period_s;
    const SustainedRun run = runSustained(
        [&] {
          for (size_t i = 0; i < n; ++i) runner.forward(i);
          if (classifier) lossRun();
          for (size_t i = n; i-- > 0;) runner.backward(i);
        },
        sustainWindow(o.sustain_s, limit));
    su.pass_s = run.pass_s;
    su.cpu_pass_s = run.cpu_s / run.passes;
    su.passes = run.passes;
    su.window_s = run.window_s;
  }
  return out;
}

namespace {

using nlohmann::json;

json spreadJson(const Spread& s) {
  return {{"median", s.median}, {"min", s.min}, {"max", s.max}, {"repeats", s.repeats}};
}

json shapeJson(const Shape& s) {
  json a = json::array();
  for (int64_t d : s.dims()) a.push_back(d);
  return a;
}

// Reads fields of one JSON object, naming the path of anything missing or mistyped.
class Reader {
 public:
  Reader(const json& j, std::string path, const std::string& where)
      : j_(j), path_(std::move(path)), where_(where) {
    if (!j_.is_object()) fail("", "is not an object");
  }
  const json& at(const char* key, json::value_t type) const {
    auto it = j_.find(key);
    if (it == j_.end()) fail(key, "is missing");
    const bool number_ok = type == json::value_t::number_float && it->is_number();
    const bool int_ok = type == json::value_t::number_integer && it->is_number_integer();
    if (it->type() != type && !number_ok && !int_ok) fail(key, "has the wrong type");
    return *it;
  }
  std::string str(const char* key) const { return at(key, json::value_t::string); }
  double num(const char* key) const { return at(key, json::value_t::number_float); }
  int64_t integer(const char* key) const {
    const int64_t v = at(key, json::value_t::number_integer).get<int64_t>();
    if (v < 0) fail(key, "is negative");
    return v;
  }
  bool boolean(const char* key) const { return at(key, json::value_t::boolean); }
  bool has(const char* key) const { return j_.contains(key); }
  const json& array(const char* key) const { return at(key, json::value_t::array); }
  Reader child(const json& j, const std::string& name) const {
    return Reader(j, path_ + name, where_);
  }
  Shape shape(const char* key) const {
    std::vector<int64_t> dims;
    for (const json& d : array(key)) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) fail(key, "holds a non-dimension");
      dims.push_back(d.get<int64_t>());
    }
    try {
      return Shape(dims);
    } catch (const InvalidArgument& e) {
      fail(key, e.what());
    }
  }
  Spread spread(const char* key) const {
    const Reader r = child(at(key, json::value_t::object), std::string(".") + key);
    Spread s{r.num("median"), r.num("min"), r.num("max"), static_cast<int>(r.integer("repeats"))};
    if (!(s.min <= s.median && s.median <= s.max)) fail(key, "is not min <= median <= max");
    return s;
  }
  [[noreturn]] void fail(const std::string& key, const char* what) const {
    const std::string field = path_.empty() ? key : key.empty() ? path_ : path_ + "." + key;
    throw FormatError(where_ + ": profile field " + field + " " + what);
  }

 private:
  const json& j_;
  std::string path_;
  const std::string& where_;
};

}  // namespace

std::string profileToJson(const Profile& p) {
  json devices = json::array();
  for (const DeviceProfile& d : p.devices) {
    json gemm = json::array();
    for (const GemmPoint& g : d.gemm) gemm.push_back({{"n", g.n}, {"gflops", g.gflops}});
    json layers = json::array();
    for (const LayerProfile& l : d.layers) {
      layers.push_back({{"index", l.index},
                        {"type", l.type},
                        {"output", shapeJson(l.output)},
                        {"forward_s", spreadJson(l.forward)},
                        {"backward_s", spreadJson(l.backward)},
                        {"activation_bytes", l.activation_bytes},
                        {"param_bytes", l.param_bytes},
                        {"flops_per_sample", l.flops}});
      if (l.backward_no_input.repeats > 0)
        layers.back()["backward_no_input_s"] = spreadJson(l.backward_no_input);
      if (d.decodes()) {
        layers.back()["decode_s"] = spreadJson(l.decode);
        layers.back()["decode_batch_s"] = spreadJson(l.decode_batch);
        layers.back()["cache_bytes"] = l.cache_bytes;
      }
      if (!l.lacks.empty()) {
        json lacks = json::array();
        for (const OpUse& u : l.lacks) lacks.push_back(opUseName(u));
        layers.back()["lacks"] = lacks;
        layers.back()["forward_runs"] = l.forward_runs;
      }
    }
    const DeviceInfo& i = d.device;
    json& dj = devices.emplace_back(json{{"name", i.name},
                                         {"kind", i.kind},
                                         {"model", i.model},
                                         {"platform", i.platform},
                                         {"vendor", i.vendor},
                                         {"description", i.description},
                                         {"compute_units", i.compute_units},
                                         {"memory_bytes", i.memory_bytes},
                                         {"max_allocation_bytes", i.max_allocation_bytes},
                                         {"fp16", i.fp16},
                                         {"host_cores", i.host_cores},
                                         {"gemm", gemm},
                                         {"layers", layers}});
    if (d.batch > 0) dj["batch"] = d.batch;
    if (d.decodes()) dj["decode"] = {{"context", d.decode_context}, {"batch", d.decode_batch}};
    if (d.loss.repeats > 0) dj["loss_s"] = spreadJson(d.loss);
    if (!d.update.empty()) {
      json update = json::object();
      for (const auto& [kind, s] : d.update) update[kind] = spreadJson(s);
      dj["update_s"] = update;
    }
    if (d.sustained.passes > 0) {
      const Sustained& su = d.sustained;
      dj["sustained"] = {{"pass_s", su.pass_s},
                         {"burst_pass_s", su.burst_pass_s},
                         {"window_s", su.window_s},
                         {"passes", su.passes},
                         {"cpu_cores", su.cpu_cores},
                         {"quota_cores", su.quota_cores},
                         {"quota_period_s", su.quota_period_s}};
      if (su.cpu_pass_s > 0) dj["sustained"]["cpu_pass_s"] = su.cpu_pass_s;
    }
  }
  json j = {{"schema", "tandem-profile"}, {"version", kProfileVersion}, {"devices", devices}};
  if (!p.devices.empty()) {
    j["model"] = p.model;
    j["input"] = shapeJson(p.input);
    j["batch"] = p.batch;
    j["warmup"] = p.warmup;
    j["repeats"] = p.repeats;
    j["load"] = p.load;
  }
  if (!p.message_cpu.empty()) {
    json points = json::array();
    for (const MessageCpu& m : p.message_cpu)
      points.push_back(m.send_s > 0
                           ? json{{"bytes", m.bytes}, {"cpu_s", m.cpu_s}, {"send_s", m.send_s}}
                           : json{{"bytes", m.bytes}, {"cpu_s", m.cpu_s}});
    j["message_cpu"] = points;
  }
  if (!p.group_allreduce.empty()) {
    json points = json::array();
    for (const GroupAllreduce& g : p.group_allreduce)
      points.push_back(json{{"ranks", g.ranks}, {"bytes", g.bytes}, {"seconds", g.seconds}});
    j["group_allreduce"] = points;
  }
  if (p.links) {
    json links = json::array();
    for (const LinkProfile& l : p.links->links) {
      json one = {{"from", l.from},
                  {"to", l.to},
                  {"bandwidth_bytes_per_s", l.bandwidth},
                  {"latency_s", l.latency_s},
                  {"round_trip_s", spreadJson(l.round_trip)}};
      if (l.cpu_s_per_byte > 0) one["cpu_s_per_byte"] = l.cpu_s_per_byte;
      if (l.sender_share > 0) one["sender_share"] = l.sender_share;
      links.push_back(std::move(one));
    }
    j["links"] = {{"transport", p.links->transport},
                  {"message_bytes", p.links->message_bytes},
                  {"warmup", p.links->warmup},
                  {"repeats", p.links->repeats},
                  {"measured", links}};
  }
  return j.dump(2) + "\n";
}

namespace {

// One entry of "devices", as the profile's `version` writes it.
DeviceProfile parseDevice(const Reader& r, int64_t version) {
  DeviceProfile d;
  d.device.name = r.str("name");
  d.device.kind = r.str("kind");
  d.device.model = r.str("model");
  d.device.platform = r.str("platform");
  d.device.vendor = r.str("vendor");
  d.device.description = r.str("description");
  d.device.compute_units = static_cast<int>(r.integer("compute_units"));
  d.device.memory_bytes = r.integer("memory_bytes");
  d.device.max_allocation_bytes = r.integer("max_allocation_bytes");
  d.device.fp16 = r.boolean("fp16");
  // Before version 3: the CPU is the host device there is.
  d.device.host_cores = version > 2 ? r.boolean("host_cores") : d.device.kind == "cpu";
  const json& gemm = r.array("gemm");
  for (size_t gi = 0; gi < gemm.size(); ++gi) {
    const Reader g = r.child(gemm[gi], ".gemm[" + std::to_string(gi) + "]");
    d.gemm.push_back({g.integer("n"), g.num("gflops")});
  }
  const json& layers = r.array("layers");
  for (size_t li = 0; li < layers.size(); ++li) {
    const Reader l = r.child(layers[li], ".layers[" + std::to_string(li) + "]");
    LayerProfile lp;
    lp.index = l.integer("index");
    if (lp.index != static_cast<int64_t>(li)) l.fail("index", "is out of order");
    lp.type = l.str("type");
    lp.output = l.shape("output");
    lp.forward = l.spread("forward_s");
    lp.backward = l.spread("backward_s");
    if (l.has("backward_no_input_s")) lp.backward_no_input = l.spread("backward_no_input_s");
    lp.activation_bytes = l.integer("activation_bytes");
    lp.param_bytes = l.integer("param_bytes");
    lp.flops = l.integer("flops_per_sample");
    if (version > 5 && l.has("lacks")) {
      for (const json& u : l.array("lacks")) {
        if (!u.is_string()) l.fail("lacks", "holds a non-string");
        try {
          lp.lacks.push_back(parseOpUse(u.get<std::string>()));
        } catch (const InvalidArgument& e) {
          l.fail("lacks", e.what());
        }
      }
      lp.forward_runs = l.boolean("forward_runs");
    }
    d.layers.push_back(std::move(lp));
  }
  if (version > 5 && r.has("decode")) {
    const Reader de = r.child(r.at("decode", json::value_t::object), ".decode");
    d.decode_context = de.integer("context");
    d.decode_batch = de.integer("batch");
    if (d.decode_context < 1) de.fail("context", "is not positive");
    if (d.decode_batch < 1) de.fail("batch", "is not positive");
  }
  for (size_t li = 0; li < layers.size(); ++li) {
    const Reader l = r.child(layers[li], ".layers[" + std::to_string(li) + "]");
    LayerProfile& lp = d.layers[li];
    if (d.decodes()) {
      lp.decode = l.spread("decode_s");
      lp.decode_batch = l.spread("decode_batch_s");
      lp.cache_bytes = l.integer("cache_bytes");
    } else if (l.has("decode_s") || l.has("decode_batch_s")) {
      l.fail("decode_s", "is given without the device's \"decode\" (context and batch)");
    }
  }
  if (version > 4 && r.has("batch")) {
    d.batch = r.integer("batch");
    if (d.batch < 1) r.fail("batch", "is not positive");
  }
  if (version > 1 && r.has("loss_s")) d.loss = r.spread("loss_s");
  if (version > 3 && r.has("update_s")) {
    const json& uj = r.at("update_s", json::value_t::object);
    const Reader u = r.child(uj, ".update_s");
    for (const auto& item : uj.items()) {
      const std::string& kind = item.key();
      if (kind != "sgd" && kind != "adamw") u.fail(kind, "is not an optimizer (sgd, adamw)");
      d.update[kind] = u.spread(kind.c_str());
    }
  }
  if (version > 2 && r.has("sustained")) {
    const Reader su = r.child(r.at("sustained", json::value_t::object), ".sustained");
    Sustained& t = d.sustained;
    t.pass_s = su.num("pass_s");
    t.burst_pass_s = su.num("burst_pass_s");
    t.window_s = su.num("window_s");
    t.passes = static_cast<int>(su.integer("passes"));
    t.cpu_cores = su.num("cpu_cores");
    t.quota_cores = su.num("quota_cores");
    t.quota_period_s = su.num("quota_period_s");
    if (su.has("cpu_pass_s")) t.cpu_pass_s = su.num("cpu_pass_s");
    if (!(t.pass_s > 0)) su.fail("pass_s", "is not positive");
    if (!(t.burst_pass_s > 0)) su.fail("burst_pass_s", "is not positive");
    if (!(t.window_s >= t.pass_s)) su.fail("window_s", "is shorter than one pass");
    if (t.passes < 1) su.fail("passes", "is not positive");
    if (!(t.cpu_pass_s >= 0)) su.fail("cpu_pass_s", "is negative");
    if (!(t.cpu_cores >= 0) || !(t.quota_cores >= 0)) su.fail("", "has a negative core count");
    if (!(t.quota_period_s >= 0) || (t.quota_cores > 0) != (t.quota_period_s > 0))
      su.fail("quota_period_s", "does not go with quota_cores (both 0, or both positive)");
  }
  return d;
}

// The "links" object: the link measurements.
LinkSet parseLinks(const Reader& l) {
  LinkSet set;
  set.transport = l.str("transport");
  set.message_bytes = l.integer("message_bytes");
  set.warmup = static_cast<int>(l.integer("warmup"));
  set.repeats = static_cast<int>(l.integer("repeats"));
  const json& measured = l.array("measured");
  for (size_t i = 0; i < measured.size(); ++i) {
    const Reader m = l.child(measured[i], ".measured[" + std::to_string(i) + "]");
    LinkProfile lp{m.str("from"), m.str("to"), m.num("bandwidth_bytes_per_s"), m.num("latency_s"),
                   m.spread("round_trip_s")};
    if (!(lp.bandwidth > 0)) m.fail("bandwidth_bytes_per_s", "is not positive");
    if (!(lp.latency_s >= 0)) m.fail("latency_s", "is negative");
    if (m.has("cpu_s_per_byte")) {
      lp.cpu_s_per_byte = m.num("cpu_s_per_byte");
      if (!(lp.cpu_s_per_byte >= 0 && std::isfinite(lp.cpu_s_per_byte)))
        m.fail("cpu_s_per_byte", "is not a finite, non-negative number");
    }
    if (m.has("sender_share")) {
      lp.sender_share = m.num("sender_share");
      if (!(lp.sender_share > 0 && lp.sender_share < 1))
        m.fail("sender_share", "is not between 0 and 1");
    }
    for (const LinkProfile& other : set.links)
      if (other.from == lp.from && other.to == lp.to) m.fail("", "measures a link twice");
    set.links.push_back(std::move(lp));
  }
  return set;
}

}  // namespace

Profile parseProfile(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw FormatError(where + ": not JSON: " + e.what());
  }
  const Reader top(j, "", where);
  if (top.str("schema") != "tandem-profile") top.fail("schema", "is not \"tandem-profile\"");
  const int64_t version = top.integer("version");
  if (version < 1 || version > kProfileVersion)
    throw FormatError(where + ": profile version " + std::to_string(version) +
                      " is not supported (this build reads versions 1 to " +
                      std::to_string(kProfileVersion) + ")");
  Profile p;
  const json& devices = top.array("devices");
  // Version 2 leaves out what describes the devices when there are none (links only).
  if (version == 1 || !devices.empty()) {
    p.model = top.str("model");
    p.input = top.shape("input");
    p.batch = top.integer("batch");
    if (p.batch < 1) top.fail("batch", "is not positive");
    p.warmup = static_cast<int>(top.integer("warmup"));
    p.repeats = static_cast<int>(top.integer("repeats"));
    if (version > 1 && top.has("load")) p.load = static_cast<int>(top.integer("load"));
  }
  for (size_t di = 0; di < devices.size(); ++di) {
    p.devices.push_back(
        parseDevice(top.child(devices[di], "devices[" + std::to_string(di) + "]"), version));
  }
  if (version > 3 && top.has("message_cpu")) {
    const json& points = top.array("message_cpu");
    for (size_t i = 0; i < points.size(); ++i) {
      const Reader m = top.child(points[i], "message_cpu[" + std::to_string(i) + "]");
      const MessageCpu point{m.integer("bytes"), m.num("cpu_s"),
                             version > 5 && m.has("send_s") ? m.num("send_s") : 0.0};
      if (!(point.send_s >= 0)) m.fail("send_s", "is negative");
      if (point.bytes < 1) m.fail("bytes", "is not positive");
      if (!(point.cpu_s >= 0)) m.fail("cpu_s", "is negative");
      if (!p.message_cpu.empty() && point.bytes <= p.message_cpu.back().bytes)
        m.fail("bytes", "is not larger than the point before");
      p.message_cpu.push_back(point);
    }
  }
  if (version > 5 && top.has("group_allreduce")) {
    const json& points = top.array("group_allreduce");
    for (size_t i = 0; i < points.size(); ++i) {
      const Reader g = top.child(points[i], "group_allreduce[" + std::to_string(i) + "]");
      const int64_t ranks = g.integer("ranks");
      if (ranks < 2 || ranks > 64) g.fail("ranks", "is not 2 to 64");
      const GroupAllreduce point{static_cast<int>(ranks), g.integer("bytes"), g.num("seconds")};
      if (point.bytes < 4) g.fail("bytes", "is below one f32");
      if (!(point.seconds > 0)) g.fail("seconds", "is not positive");
      if (!p.group_allreduce.empty() && point.bytes <= p.group_allreduce.back().bytes)
        g.fail("bytes", "is not larger than the point before");
      p.group_allreduce.push_back(point);
    }
  }
  if (version > 1 && top.has("links")) {
    p.links = parseLinks(top.child(top.at("links", json::value_t::object), "links"));
  }
  return p;
}

const DeviceProfile& deviceProfile(const Profile& profile, const Model& model,
                                   const std::string& device, const std::string& where) {
  TANDEM_CHECK_MSG(
      profile.model == model.name(), InvalidArgument,
      where << " profiles model '" << profile.model << "', not '" << model.name() << "'");
  const DeviceProfile* found = nullptr;
  std::string held;
  for (const DeviceProfile& d : profile.devices) {
    if (d.device.name == device) found = &d;
    held += (held.empty() ? "" : ", ") + d.device.name;
  }
  TANDEM_CHECK_MSG(found, InvalidArgument,
                   where << " has no device '" << device << "' (it holds "
                         << (held.empty() ? "none" : held) << ")");
  TANDEM_CHECK_MSG(found->layers.size() == model.size(), InvalidArgument,
                   where << ": device '" << device << "' has " << found->layers.size()
                         << " layers, the model " << model.size());
  for (size_t l = 0; l < model.size(); ++l)
    TANDEM_CHECK_MSG(found->layers[l].type == model.layer(l).type(), InvalidArgument,
                     where << ": layer " << l << " is a " << found->layers[l].type
                           << " in the profile but a " << model.layer(l).type() << " in the model");
  return *found;
}

}  // namespace tandem
