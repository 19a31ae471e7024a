#include "core/quantize_model.h"

#include <map>
#include <set>

#include "core/error.h"
#include "core/quantize.h"

namespace tandem {
namespace {

// Marks (or, with int8 false, clears) every layer that takes int8 weights; returns how many.
int markLayers(std::vector<LayerSpec>& layers, bool int8, int64_t group) {
  int marked = 0;
  for (LayerSpec& l : layers) {
    if (takesInt8Weights(l.type)) {
      l.attrs.erase("weights");
      l.attrs.erase("group");
      if (int8) {
        l.attrs["weights"] = std::string("int8");
        if (group) l.attrs["group"] = group;
      }
      ++marked;
    }
    marked += markLayers(l.children, int8, group);
  }
  return marked;
}

bool anyInt8(const std::vector<LayerSpec>& layers) {
  for (const LayerSpec& l : layers) {
    if (const auto it = l.attrs.find("weights"); it != l.attrs.end())
      if (const auto* s = std::get_if<std::string>(&it->second); s && *s == "int8") return true;
    if (anyInt8(l.children)) return true;
  }
  return false;
}

}  // namespace

bool takesInt8Weights(const std::string& layer_type) {
  static const std::set<std::string> kTypes = {"linear", "attention", "swiglu", "transformer",
                                               "llama"};
  return kTypes.count(layer_type) > 0;
}

bool hasInt8Weights(const ModelSpec& spec) { return anyInt8(spec.layers); }

ModelFile quantizeModel(const ModelFile& file, int64_t group, Backend& backend) {
  TANDEM_CHECK_MSG(group >= 0, InvalidArgument, "the int8 group must be positive, got " << group);
  TANDEM_CHECK_MSG(!hasInt8Weights(file.spec), InvalidArgument,
                   "model '" << file.spec.name << "' holds int8 weights already");
  ModelFile out;
  out.spec = file.spec;
  out.metadata = file.metadata;
  TANDEM_CHECK_MSG(markLayers(out.spec.layers, true, group) > 0, InvalidArgument,
                   "model '" << file.spec.name
                             << "' has no layer that takes int8 weights (linear, attention, "
                                "swiglu, transformer, llama)");
  std::map<std::string, const HostTensor*> source;
  for (const HostTensor& t : file.params) source[t.name] = &t;
  Model model(out.spec);  // shapes checked, groups too (naming the layer)
  model.build(backend, 0);
  const std::vector<Param*>& params = model.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = *params[i];
    const std::string& name = p.name;
    if (p.value.dtype() != DType::kI8) {
      if (i > 0 && name == params[i - 1]->name + ".scales") continue;  // written with it
      const auto it = source.find(name);
      TANDEM_CHECK_MSG(it != source.end(), InvalidArgument,
                       "model '" << file.spec.name << "' lacks parameter '" << name << "'");
      out.params.push_back(*it->second);
      continue;
    }
    const auto it = source.find(name);
    TANDEM_CHECK_MSG(it != source.end() && it->second->shape == p.value.shape(), InvalidArgument,
                     "model '" << file.spec.name << "' lacks f32 parameter '" << name << "' "
                               << p.value.shape());
    const Shape& s = p.value.shape();
    const Param& scales = *params.at(i + 1);
    const QuantizedRows q =
        quantizeRows(it->second->data, s[0], s[1], s[1] / scales.value.shape()[1], name);
    HostTensor w{name, s, {}};
    w.dtype = DType::kI8;
    w.i8 = q.values;
    out.params.push_back(std::move(w));
    out.params.push_back(HostTensor{scales.name, scales.value.shape(), q.scales});
  }
  return out;
}

ModelFile dequantizeModel(const ModelFile& file) {
  if (!hasInt8Weights(file.spec)) return file;
  ModelFile out;
  out.spec = file.spec;
  out.metadata = file.metadata;
  out.optimizer = file.optimizer;
  markLayers(out.spec.layers, false, 0);
  std::map<std::string, const HostTensor*> by_name;
  for (const HostTensor& t : file.params) by_name[t.name] = &t;
  for (const HostTensor& t : file.params) {
    if (t.dtype != DType::kI8) {
      const auto base = by_name.find(
          t.name.ends_with(".scales") ? t.name.substr(0, t.name.size() - 7) : std::string());
      const bool is_scales = base != by_name.end() && base->second->dtype == DType::kI8;
      if (!is_scales) out.params.push_back(t);
      continue;
    }
    const auto it = by_name.find(t.name + ".scales");
    TANDEM_CHECK_MSG(it != by_name.end() && t.shape.rank() == 2 && it->second->shape.rank() == 2,
                     FormatError, "int8 parameter '" << t.name << "' has no scales");
    const Shape& s = t.shape;
    const HostTensor& sc = *it->second;
    TANDEM_CHECK_MSG(sc.shape[0] == s[0] && sc.shape[1] > 0 && s[1] % sc.shape[1] == 0, FormatError,
                     "int8 parameter '" << t.name << "' " << s << " has scales " << sc.shape);
    QuantizedRows q{s[0], s[1], s[1] / sc.shape[1], t.i8, sc.data};
    out.params.push_back(HostTensor{t.name, s, dequantizeRows(q)});
  }
  return out;
}

}  // namespace tandem
