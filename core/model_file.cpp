#include "core/model_file.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/file.h"
#include "core/flatbuffers_read.h"
#include "core/schema/model_generated.h"

namespace tandem {

namespace {

using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;

// ---- writing ----

Offset<fb::Attr> writeAttr(FlatBufferBuilder& b, const std::string& key, const AttrValue& v) {
  auto k = b.CreateString(key);
  if (const auto* i = std::get_if<int64_t>(&v)) return fb::CreateAttr(b, k, fb::AttrKind_Int, *i);
  if (const auto* d = std::get_if<double>(&v))
    return fb::CreateAttr(b, k, fb::AttrKind_Float, 0, *d);
  if (const auto* s = std::get_if<std::string>(&v))
    return fb::CreateAttr(b, k, fb::AttrKind_String, 0, 0.0, b.CreateString(*s));
  const auto& list = std::get<std::vector<int64_t>>(v);
  return fb::CreateAttr(b, k, fb::AttrKind_Ints, 0, 0.0, 0, b.CreateVector(list));
}

Offset<flatbuffers::Vector<Offset<fb::Attr>>> writeAttrs(
    FlatBufferBuilder& b, const std::map<std::string, AttrValue>& attrs) {
  std::vector<Offset<fb::Attr>> out;
  for (const auto& [k, v] : attrs) out.push_back(writeAttr(b, k, v));
  return b.CreateVector(out);
}

Offset<fb::Layer> writeLayer(FlatBufferBuilder& b, const LayerSpec& spec) {
  std::vector<Offset<fb::Layer>> children;
  for (const auto& c : spec.children) children.push_back(writeLayer(b, c));
  auto type = b.CreateString(spec.type);
  auto attrs = writeAttrs(b, spec.attrs);
  return fb::CreateLayer(b, type, attrs, b.CreateVector(children));
}

// A tensor's table, its `bytes` bytes written in place by `write` (no copy of them on the
// way), 4-aligned so that f32 values can be written as floats.
Offset<fb::TensorData> writeTensorWith(FlatBufferBuilder& b, const std::string& name,
                                       const Shape& shape, fb::DType dtype, size_t bytes,
                                       const std::function<void(uint8_t*)>& write) {
  auto n = b.CreateString(name);
  auto dims = b.CreateVector(shape.dims());
  b.ForceVectorAlignment(bytes, 1, alignof(float));
  uint8_t* data = nullptr;
  const flatbuffers::uoffset_t at = b.CreateUninitializedVector(bytes, 1, &data);
  TANDEM_CHECK_MSG(bytes == 0 || reinterpret_cast<uintptr_t>(data) % alignof(float) == 0, Error,
                   "tensor '" << name << "' is not 4-aligned in the model file's buffer");
  if (bytes) write(data);
  return fb::CreateTensorData(b, n, dims, dtype, Offset<flatbuffers::Vector<uint8_t>>(at));
}

// f32 or i8 (int8 weights); parameters hold no other dtype.
Offset<fb::TensorData> writeTensor(FlatBufferBuilder& b, const std::string& name, const Tensor& t) {
  TANDEM_CHECK_MSG(t.dtype() == DType::kF32 || t.dtype() == DType::kI8, InvalidArgument,
                   "parameter '" << name << "' is " << dtypeName(t.dtype())
                                 << "; model files hold f32 and i8 tensors");
  return writeTensorWith(b, name, t.shape(), t.dtype() == DType::kI8 ? fb::DType_I8 : fb::DType_F32,
                         t.bytes(), [&](uint8_t* data) { t.backend().download(t, data); });
}

// A builder with room for every tensor's bytes from the start: one that grows by doubling
// copies a large model's weights again at each step (page faults a large import pays
// for). FlatBuffers' offsets are 32-bit: a model file holds less than 2 GiB.
FlatBufferBuilder builderFor(const std::string& model, size_t tensor_bytes, size_t tensors) {
  const size_t bytes = (size_t{1} << 16) + tensor_bytes + 64 * tensors;
  TANDEM_CHECK_MSG(bytes < FLATBUFFERS_MAX_BUFFER_SIZE, InvalidArgument,
                   "model '" << model << "' needs " << bytes
                             << " bytes; a model file holds less than 2 GiB (FlatBuffers' "
                                "32-bit offsets)");
  return FlatBufferBuilder(bytes);
}

// The model's root table around its layers and the tensors written so far.
void finishModel(FlatBufferBuilder& b, const ModelSpec& spec,
                 const std::vector<Offset<fb::Layer>>& layers,
                 const std::vector<Offset<fb::TensorData>>& params, Offset<fb::OptimizerState> opt,
                 const std::map<std::string, AttrValue>& metadata) {
  auto name = b.CreateString(spec.name);
  auto input = b.CreateVector(spec.input.dims());
  auto layer_vec = b.CreateVector(layers);
  auto param_vec = b.CreateVector(params);
  auto meta = writeAttrs(b, metadata);
  auto root = fb::CreateModel(b, kModelFormatVersion, name, input, layer_vec, param_vec, opt, meta);
  fb::FinishModelBuffer(b, root);
}

std::vector<Offset<fb::Layer>> writeLayers(FlatBufferBuilder& b, const ModelSpec& spec) {
  std::vector<Offset<fb::Layer>> layers;
  for (const auto& l : spec.layers) layers.push_back(writeLayer(b, l));
  return layers;
}

// The optimizer's settings, step count and (already written) state tensors.
Offset<fb::OptimizerState> writeOptimizer(FlatBufferBuilder& b, const OptimizerOptions& o,
                                          int64_t steps,
                                          const std::vector<Offset<fb::TensorData>>& tensors) {
  const std::map<std::string, AttrValue> hyper = {{"lr", double{o.lr}},
                                                  {"momentum", double{o.momentum}},
                                                  {"weight_decay", double{o.weight_decay}},
                                                  {"beta1", double{o.beta1}},
                                                  {"beta2", double{o.beta2}},
                                                  {"eps", double{o.eps}},
                                                  {"nesterov", int64_t{o.nesterov ? 1 : 0}},
                                                  {"lr_schedule", o.lr_schedule},
                                                  {"warmup_steps", o.warmup_steps},
                                                  {"decay_steps", o.decay_steps},
                                                  {"decay_factor", double{o.decay_factor}},
                                                  {"min_lr", double{o.min_lr}}};
  auto kind = b.CreateString(o.kind);
  auto h = writeAttrs(b, hyper);
  return fb::CreateOptimizerState(b, kind, h, steps, b.CreateVector(tensors));
}

// A tensor read from a file, written back as it is (f32 or i8).
Offset<fb::TensorData> writeHostTensor(FlatBufferBuilder& b, const HostTensor& t) {
  const bool i8 = t.dtype == DType::kI8;
  const void* from = i8 ? static_cast<const void*>(t.i8.data()) : t.data.data();
  const size_t bytes = i8 ? t.i8.size() : t.data.size() * sizeof(float);
  return writeTensorWith(b, t.name, t.shape, i8 ? fb::DType_I8 : fb::DType_F32, bytes,
                         [&](uint8_t* out) { std::memcpy(out, from, bytes); });
}

// Whether a parameter (or its optimizer state, "<param>.<slot>") belongs to a layer in
// `ranges`: layer i's are named "i.<...>" (Model::build). A name of no layer is kept.
bool ofLayers(const std::string& name, const std::vector<LayerRange>& ranges) {
  size_t layer = 0;
  const char* end = name.data() + name.size();
  const auto [at, error] = std::from_chars(name.data(), end, layer);
  if (error != std::errc() || at == end || *at != '.') return true;
  for (const LayerRange& r : ranges)
    if (layer >= r.begin && layer < r.end) return true;
  return false;
}

// A built model's buffer (what serializeModel returns a copy of and saveModel writes).
flatbuffers::DetachedBuffer buildModel(const Model& model, const Optimizer* optimizer,
                                       const std::map<std::string, AttrValue>& metadata) {
  size_t bytes = 0, tensors = 0;
  for (const Param* p : model.params()) bytes += p->value.bytes(), ++tensors;
  if (optimizer)
    for (const auto& [name, t] : optimizer->state()) bytes += t.bytes(), ++tensors;
  const ModelSpec spec = model.spec();
  FlatBufferBuilder b = builderFor(spec.name, bytes, tensors);
  const std::vector<Offset<fb::Layer>> layers = writeLayers(b, spec);
  std::vector<Offset<fb::TensorData>> params;
  for (const Param* p : model.params()) params.push_back(writeTensor(b, p->name, p->value));
  Offset<fb::OptimizerState> opt = 0;
  if (optimizer) {
    std::vector<Offset<fb::TensorData>> tensors;
    for (const auto& [name, t] : optimizer->state()) tensors.push_back(writeTensor(b, name, t));
    opt = writeOptimizer(b, optimizer->options(), optimizer->steps(), tensors);
  }
  finishModel(b, spec, layers, params, opt, metadata);
  return b.Release();
}

// A parameter left out of a model file's buffer, to be copied into the file from its
// extents: where its bytes begin, counted from the buffer's end (FlatBuffers builds back
// to front, so this holds from the tensor's writing to the finished buffer).
struct Deferred {
  size_t from_end = 0;
  const ParamFill* param = nullptr;
};

// A model file's buffer from parameter fills (serializeModelFile, writeModelFile). With
// `deferred`, a parameter with extents is not written: its bytes in the buffer are left
// as allocated (never touched, so never paged in) and where they are is recorded.
flatbuffers::DetachedBuffer buildModelFile(const ModelSpec& spec,
                                           const std::vector<ParamFill>& params,
                                           const std::map<std::string, AttrValue>& metadata,
                                           std::vector<Deferred>* deferred) {
  const Model model(spec);  // checks the spec, and is what its layers hold
  size_t bytes = 0;
  int64_t values = 0;
  for (const ParamFill& p : params) {
    values += p.shape.numel();
    bytes += static_cast<size_t>(p.shape.numel()) * sizeof(float);
  }
  TANDEM_CHECK_MSG(values == model.paramCount(), InvalidArgument,
                   "model '" << spec.name << "': " << params.size() << " parameters of " << values
                             << " values given; its layers hold " << model.paramCount());
  const ModelSpec written = model.spec();
  FlatBufferBuilder b = builderFor(written.name, bytes, params.size());
  const std::vector<Offset<fb::Layer>> layers = writeLayers(b, written);
  std::vector<Offset<fb::TensorData>> tensors;
  for (const ParamFill& p : params) {
    const auto n = static_cast<size_t>(p.shape.numel());
    const bool copied = deferred != nullptr && !p.extents.empty();
    if (copied) {
      uint64_t from_extents = 0;
      for (const FileExtent& e : p.extents) from_extents += e.bytes;
      TANDEM_CHECK_MSG(from_extents == n * sizeof(float), InvalidArgument,
                       "parameter '" << p.name << "': its extents hold " << from_extents
                                     << " bytes, its " << n << " values " << n * sizeof(float));
    }
    tensors.push_back(
        writeTensorWith(b, p.name, p.shape, fb::DType_F32, n * sizeof(float), [&](uint8_t* data) {
          if (copied)
            deferred->push_back(
                {b.GetSize() - static_cast<size_t>(data - b.GetCurrentBufferPointer()), &p});
          else
            p.fill({reinterpret_cast<float*>(data), n});
        }));
  }
  finishModel(b, written, layers, tensors, 0, metadata);
  return b.Release();
}

// A decoded file's buffer again, every tensor it holds written back as it is (a stage's
// part, sliceModelFile).
flatbuffers::DetachedBuffer buildFromFile(const ModelFile& file) {
  const std::vector<HostTensor> none;
  const std::vector<HostTensor>& state = file.optimizer ? file.optimizer->tensors : none;
  size_t bytes = 0;
  for (const HostTensor& t : file.params) bytes += t.data.size() * 4 + t.i8.size();
  for (const HostTensor& t : state) bytes += t.data.size() * 4;
  FlatBufferBuilder b = builderFor(file.spec.name, bytes, file.params.size() + state.size());
  const std::vector<Offset<fb::Layer>> layers = writeLayers(b, file.spec);
  std::vector<Offset<fb::TensorData>> written;
  for (const HostTensor& t : file.params) written.push_back(writeHostTensor(b, t));
  Offset<fb::OptimizerState> opt = 0;
  if (file.optimizer) {
    std::vector<Offset<fb::TensorData>> tensors;
    for (const HostTensor& t : state) tensors.push_back(writeHostTensor(b, t));
    opt = writeOptimizer(b, file.optimizer->options, file.optimizer->steps, tensors);
  }
  finishModel(b, file.spec, layers, written, opt, file.metadata);
  return b.Release();
}

std::vector<uint8_t> copyOf(const flatbuffers::DetachedBuffer& buffer) {
  return {buffer.data(), buffer.data() + buffer.size()};
}

// ---- reading ----

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw FormatError("model file '" + source + "': " + what);
}

AttrValue readAttr(const std::string& source, const fb::Attr& a) {
  switch (a.kind()) {
    case fb::AttrKind_Int:
      return a.int_value();
    case fb::AttrKind_Float:
      return a.float_value();
    case fb::AttrKind_String:
      if (!a.string_value()) bad(source, "attribute '" + a.key()->str() + "' has no string value");
      return a.string_value()->str();
    case fb::AttrKind_Ints:
      if (!a.ints()) bad(source, "attribute '" + a.key()->str() + "' has no list value");
      return copyInt64s(a.ints());
  }
  bad(source, "attribute '" + a.key()->str() + "' has unknown kind " +
                  std::to_string(static_cast<int>(a.kind())));
}

std::map<std::string, AttrValue> readAttrs(const std::string& source,
                                           const flatbuffers::Vector<Offset<fb::Attr>>* attrs) {
  std::map<std::string, AttrValue> out;
  if (attrs)
    for (const fb::Attr* a : *attrs) out[a->key()->str()] = readAttr(source, *a);
  return out;
}

LayerSpec readLayer(const std::string& source, const fb::Layer& l, const std::string& path) {
  LayerSpec spec;
  spec.type = l.type()->str();
  spec.where = source + " layer " + path;
  spec.attrs = readAttrs(source, l.attrs());
  if (l.children()) {
    int i = 0;
    for (const fb::Layer* c : *l.children())
      spec.children.push_back(readLayer(source, *c, path + "." + std::to_string(i++)));
  }
  return spec;
}

Shape readShape(const std::string& source, const flatbuffers::Vector<int64_t>* dims,
                const std::string& what) {
  if (!dims) return Shape{};
  if (dims->size() > static_cast<size_t>(Shape::kMaxRank))
    bad(source, what + " has rank " + std::to_string(dims->size()));
  const std::vector<int64_t> v = copyInt64s(dims);
  for (int64_t d : v)
    if (d < 0 || d > (int64_t{1} << 40)) bad(source, what + " has dimension " + std::to_string(d));
  return Shape(std::span<const int64_t>(v));
}

HostTensor readTensor(const std::string& source, const fb::TensorData& t) {
  HostTensor h;
  h.name = t.name()->str();
  h.shape = readShape(source, t.shape(), "tensor '" + h.name + "'");
  if (t.dtype() != fb::DType_F32 && t.dtype() != fb::DType_I8)
    bad(source, "tensor '" + h.name + "' has dtype " + std::to_string(static_cast<int>(t.dtype())) +
                    "; this version reads f32 and i8 weights only");
  h.dtype = t.dtype() == fb::DType_I8 ? DType::kI8 : DType::kF32;
  const size_t want = static_cast<size_t>(h.shape.numel()) * dtypeSize(h.dtype);
  const size_t have = t.data() ? t.data()->size() : 0;
  if (want != have)
    bad(source, "tensor '" + h.name + "' " + h.shape.str() + " " + std::string(dtypeName(h.dtype)) +
                    " needs " + std::to_string(want) + " bytes, the file has " +
                    std::to_string(have));
  if (h.dtype == DType::kI8) {
    h.i8.resize(have);
    if (have) std::memcpy(h.i8.data(), t.data()->data(), have);
    return h;
  }
  h.data.resize(static_cast<size_t>(h.shape.numel()));
  if (have) std::memcpy(h.data.data(), t.data()->data(), have);
  return h;
}

OptimizerOptions optionsFrom(const std::string& kind, const std::map<std::string, AttrValue>& h) {
  OptimizerOptions o;
  o.kind = kind;
  auto num = [&](const char* key, float& dst) {
    auto it = h.find(key);
    if (it == h.end()) return;
    if (const auto* d = std::get_if<double>(&it->second)) dst = static_cast<float>(*d);
  };
  num("lr", o.lr);
  num("momentum", o.momentum);
  num("weight_decay", o.weight_decay);
  num("beta1", o.beta1);
  num("beta2", o.beta2);
  num("eps", o.eps);
  if (auto it = h.find("nesterov"); it != h.end())
    if (const auto* i = std::get_if<int64_t>(&it->second)) o.nesterov = *i != 0;
  // The schedule (files from before it have none: constant).
  num("decay_factor", o.decay_factor);
  num("min_lr", o.min_lr);
  auto integer = [&](const char* key, int64_t& dst) {
    auto it = h.find(key);
    if (it == h.end()) return;
    if (const auto* i = std::get_if<int64_t>(&it->second)) dst = *i;
  };
  integer("warmup_steps", o.warmup_steps);
  integer("decay_steps", o.decay_steps);
  if (auto it = h.find("lr_schedule"); it != h.end())
    if (const auto* s = std::get_if<std::string>(&it->second)) o.lr_schedule = *s;
  return o;
}

}  // namespace

std::vector<uint8_t> serializeModel(const Model& model, const Optimizer* optimizer,
                                    const std::map<std::string, AttrValue>& metadata) {
  return copyOf(buildModel(model, optimizer, metadata));
}

void saveModel(const std::string& path, const Model& model, const Optimizer* optimizer,
               const std::map<std::string, AttrValue>& metadata) {
  const flatbuffers::DetachedBuffer buffer = buildModel(model, optimizer, metadata);
  writeFileAtomically(path, {buffer.data(), buffer.size()}, "model file");
}

std::vector<uint8_t> serializeModelFile(const ModelSpec& spec, const std::vector<ParamFill>& params,
                                        const std::map<std::string, AttrValue>& metadata) {
  return copyOf(buildModelFile(spec, params, metadata, nullptr));
}

void writeModelFile(const std::string& path, const ModelSpec& spec,
                    const std::vector<ParamFill>& params,
                    const std::map<std::string, AttrValue>& metadata) {
  std::vector<Deferred> deferred;
  const flatbuffers::DetachedBuffer buffer = buildModelFile(spec, params, metadata, &deferred);
  // The buffer's bytes up to each copied parameter, then the parameter from its extents,
  // in the file's order.
  std::sort(deferred.begin(), deferred.end(),
            [](const Deferred& a, const Deferred& b) { return a.from_end > b.from_end; });
  AtomicFileWriter out(path, "model file");
  size_t at = 0;
  for (const Deferred& d : deferred) {
    const size_t begin = buffer.size() - d.from_end;
    out.write({buffer.data() + at, begin - at});
    for (const FileExtent& e : d.param->extents)
      out.copy(e, "the file of parameter '" + d.param->name + "'");
    at = begin + static_cast<size_t>(d.param->shape.numel()) * sizeof(float);
  }
  out.write({buffer.data() + at, buffer.size() - at});
  out.commit();
}

namespace {

// parseModelFile, its tensors' values copied only where `keep(name)` says so (the others
// left out).
ModelFile parseKeeping(std::span<const uint8_t> bytes, const std::string& source,
                       const std::function<bool(const std::string&)>& keep) {
  if (bytes.size() < 8) bad(source, "only " + std::to_string(bytes.size()) + " bytes long");
  if (!fb::ModelBufferHasIdentifier(bytes.data()))
    bad(source, "not a tandem model file (missing the 'TDM1' identifier)");
  flatbuffers::Verifier verifier(bytes.data(), bytes.size(), /*max_depth=*/64,
                                 /*max_tables=*/1000000);
  if (!fb::VerifyModelBuffer(verifier))
    bad(source, "failed FlatBuffers verification (truncated or corrupted)");
  const fb::Model* m = fb::GetModel(bytes.data());
  if (m->format_version() != kModelFormatVersion)
    bad(source, "format version " + std::to_string(m->format_version()) + ", this build reads " +
                    std::to_string(kModelFormatVersion));
  ModelFile f;
  f.spec.name = m->name() ? m->name()->str() : "model";
  f.spec.input = readShape(source, m->input_shape(), "input shape");
  if (!m->layers() || m->layers()->size() == 0) bad(source, "has no layers");
  int i = 0;
  for (const fb::Layer* l : *m->layers())
    f.spec.layers.push_back(readLayer(source, *l, std::to_string(i++)));
  if (m->params())
    for (const fb::TensorData* t : *m->params())
      if (keep(t->name()->str())) f.params.push_back(readTensor(source, *t));
  if (const fb::OptimizerState* o = m->optimizer()) {
    OptimizerSnapshot snap;
    snap.options = optionsFrom(o->kind()->str(), readAttrs(source, o->hyper()));
    try {
      validate(snap.options);
    } catch (const InvalidArgument& e) {
      bad(source, std::string("optimizer: ") + e.what());
    }
    snap.steps = o->steps();
    if (snap.steps < 0) bad(source, "optimizer step count is negative");
    if (o->tensors())
      for (const fb::TensorData* t : *o->tensors()) {
        if (!keep(t->name()->str())) continue;
        snap.tensors.push_back(readTensor(source, *t));
        if (snap.tensors.back().dtype != DType::kF32)
          bad(source, "optimizer tensor '" + snap.tensors.back().name + "' is not f32");
      }
    f.optimizer = std::move(snap);
  }
  f.metadata = readAttrs(source, m->metadata());
  return f;
}

}  // namespace

ModelFile parseModelFile(std::span<const uint8_t> bytes, const std::string& source) {
  return parseKeeping(bytes, source, [](const std::string&) { return true; });
}

std::vector<uint8_t> sliceModelFile(std::span<const uint8_t> bytes,
                                    const std::vector<LayerRange>& ranges,
                                    const std::string& source) {
  const ModelFile part =
      parseKeeping(bytes, source, [&](const std::string& name) { return ofLayers(name, ranges); });
  return copyOf(buildFromFile(part));
}

ModelFile readModelFile(const std::string& path) {
  const std::string bytes = readFile(path, "model file");
  return parseModelFile({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, path);
}

std::unique_ptr<Model> loadModel(const ModelFile& file, Backend& backend) {
  std::unique_ptr<Model> model;
  try {
    model = std::make_unique<Model>(file.spec);
  } catch (const InvalidArgument& e) {
    throw FormatError(std::string("model file describes an invalid model: ") + e.what());
  }
  model->build(backend, 0);
  loadWeights(*model, file, true);
  return model;
}

void loadWeights(Model& model, const ModelFile& file, bool exact) {
  std::map<std::string, const HostTensor*> by_name;
  for (const HostTensor& h : file.params) {
    if (!by_name.emplace(h.name, &h).second)
      throw FormatError("model file has parameter '" + h.name + "' twice");
  }
  for (Param* p : model.params()) {
    auto it = by_name.find(p->name);
    if (it == by_name.end()) throw FormatError("model file lacks parameter '" + p->name + "'");
    const HostTensor& h = *it->second;
    if (h.shape != p->value.shape() || h.dtype != p->value.dtype())
      throw FormatError("parameter '" + p->name + "' is " + h.shape.str() + " " +
                        std::string(dtypeName(h.dtype)) + " in the file but " +
                        p->value.shape().str() + " " + std::string(dtypeName(p->value.dtype())) +
                        " in the model");
    model.backend().upload(
        p->value, h.dtype == DType::kI8 ? static_cast<const void*>(h.i8.data()) : h.data.data());
    by_name.erase(it);
  }
  if (exact && !by_name.empty())
    throw FormatError("model file has parameter '" + by_name.begin()->first +
                      "' that the model does not");
}

std::unique_ptr<Optimizer> loadOptimizer(const ModelFile& file, Backend& backend) {
  TANDEM_CHECK_MSG(file.optimizer.has_value(), InvalidArgument,
                   "model file holds no optimizer state");
  auto opt = std::make_unique<Optimizer>(backend, file.optimizer->options);
  std::vector<std::pair<std::string, Tensor>> state;
  for (const HostTensor& h : file.optimizer->tensors)
    state.emplace_back(h.name, toDevice(backend, h.shape, h.data));
  opt->restore(state, file.optimizer->steps);
  return opt;
}

void restoreOptimizerState(Optimizer& optimizer, const Model& model, const ModelFile& file,
                           const std::string& who) {
  if (!file.optimizer)
    throw FormatError(who + ": the starting weights carry no optimizer state to resume from");
  std::set<std::string> mine;
  for (const Param* p : model.params()) mine.insert(p->name);
  std::vector<std::pair<std::string, Tensor>> state;
  for (const HostTensor& t : file.optimizer->tensors) {
    const size_t dot = t.name.rfind('.');
    if (dot != std::string::npos && mine.count(t.name.substr(0, dot)))
      state.push_back({t.name, toDevice(model.backend(), t.shape, t.data)});
  }
  optimizer.restore(state, file.optimizer->steps);
}

}  // namespace tandem
