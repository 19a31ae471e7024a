#include "core/model_spec.h"

#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/file.h"

namespace tandem {

namespace {

std::string at(const std::string& source, const YAML::Node& node) {
  const YAML::Mark m = node.Mark();
  if (m.line < 0) return source;
  return source + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

[[noreturn]] void fail(const std::string& source, const YAML::Node& node, const std::string& what) {
  throw InvalidArgument(at(source, node) + ": " + what);
}

AttrValue scalarValue(const std::string& source, const std::string& key, const YAML::Node& n) {
  if (n.IsScalar()) {
    long long i;
    if (YAML::convert<long long>::decode(n, i)) return static_cast<int64_t>(i);
    double d;
    if (YAML::convert<double>::decode(n, d)) return d;
    return n.Scalar();
  }
  if (n.IsSequence()) {
    std::vector<int64_t> v;
    for (const auto& item : n) {
      long long i;
      if (!item.IsScalar() || !YAML::convert<long long>::decode(item, i))
        fail(source, item, "field '" + key + "' must be a list of integers");
      v.push_back(i);
    }
    return v;
  }
  fail(source, n, "field '" + key + "' must be a scalar or a list of integers");
}

std::vector<LayerSpec> parseLayers(const std::string& source, const YAML::Node& list, int depth);

LayerSpec parseLayer(const std::string& source, const YAML::Node& node, int depth) {
  LayerSpec spec;
  spec.where = at(source, node);
  if (node.IsScalar()) {
    spec.type = node.Scalar();
    return spec;
  }
  if (!node.IsMap() || node.size() != 1)
    fail(source, node, "a layer is a type name or a one-key map 'type: {fields}'");
  const auto entry = *node.begin();
  spec.type = entry.first.as<std::string>();
  const YAML::Node& fields = entry.second;
  if (fields.IsNull()) return spec;
  if (!fields.IsMap()) fail(source, fields, "fields of layer '" + spec.type + "' must be a map");
  for (const auto& kv : fields) {
    const std::string key = kv.first.as<std::string>();
    if (key == "layers") {
      spec.children = parseLayers(source, kv.second, depth + 1);
    } else {
      spec.attrs[key] = scalarValue(source, key, kv.second);
    }
  }
  return spec;
}

std::vector<LayerSpec> parseLayers(const std::string& source, const YAML::Node& list, int depth) {
  if (depth > 32) fail(source, list, "layers nested more than 32 deep");
  if (!list.IsSequence()) fail(source, list, "'layers' must be a list");
  std::vector<LayerSpec> out;
  for (const auto& item : list) out.push_back(parseLayer(source, item, depth));
  return out;
}

std::string doubleText(double d) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", d);
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // (e: 1e+20; n: nan, inf)
  return s;
}

void emitLayers(YAML::Emitter& out, const std::vector<LayerSpec>& layers) {
  out << YAML::BeginSeq;
  for (const LayerSpec& l : layers) {
    if (l.attrs.empty() && l.children.empty()) {
      out << l.type;
      continue;
    }
    out << YAML::BeginMap << YAML::Key << l.type << YAML::Value;
    out << (l.children.empty() ? YAML::Flow : YAML::Block) << YAML::BeginMap;
    for (const auto& [key, value] : l.attrs) {
      out << YAML::Key << key << YAML::Value;
      if (const auto* i = std::get_if<int64_t>(&value))
        out << *i;
      else if (const auto* d = std::get_if<double>(&value))
        out << doubleText(*d);
      else if (const auto* s = std::get_if<std::string>(&value))
        out << YAML::DoubleQuoted << *s;
      else
        out << YAML::Flow << std::get<std::vector<int64_t>>(value);
    }
    if (!l.children.empty()) {
      out << YAML::Key << "layers" << YAML::Value;
      emitLayers(out, l.children);
    }
    out << YAML::EndMap << YAML::EndMap;
  }
  out << YAML::EndSeq;
}

}  // namespace

std::string modelSpecYaml(const ModelSpec& spec) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << YAML::DoubleQuoted << spec.name;
  out << YAML::Key << "input" << YAML::Value << YAML::Flow << spec.input.dims();
  out << YAML::Key << "layers" << YAML::Value;
  emitLayers(out, spec.layers);
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

ModelSpec parseModelSpec(const std::string& yaml_text, const std::string& source) {
  // A model file (FlatBuffers, identifier "TDM1" at byte 4) where a spec was expected: say
  // so, rather than what the YAML parser makes of its bytes.
  TANDEM_CHECK_MSG(yaml_text.size() < 8 || yaml_text.compare(4, 4, "TDM1") != 0, InvalidArgument,
                   source << " is a tandem model file (written by a save), not a model spec: "
                             "give the spec (YAML, e.g. examples/models/mlp.yaml)");
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw FormatError(source + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": YAML syntax error: " + e.msg);
  }
  if (!root.IsMap()) fail(source, root, "a model spec must be a map with name, input and layers");
  ModelSpec spec;
  bool have_input = false, have_layers = false;
  try {
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      if (key == "name") {
        if (!kv.second.IsScalar()) fail(source, kv.second, "'name' must be a string");
        spec.name = kv.second.Scalar();
      } else if (key == "input") {
        std::vector<int64_t> dims;
        if (!kv.second.IsSequence()) fail(source, kv.second, "'input' must be a list of sizes");
        for (const auto& d : kv.second) {
          long long v;
          if (!d.IsScalar() || !YAML::convert<long long>::decode(d, v) || v <= 0)
            fail(source, d, "'input' sizes must be positive integers");
          dims.push_back(v);
        }
        if (dims.empty() || dims.size() >= Shape::kMaxRank)
          fail(source, kv.second,
               "'input' needs 1 to " + std::to_string(Shape::kMaxRank - 1) + " sizes");
        spec.input = Shape(std::span<const int64_t>(dims));
        have_input = true;
      } else if (key == "layers") {
        spec.layers = parseLayers(source, kv.second, 0);
        have_layers = true;
      } else {
        fail(source, kv.first, "unknown key '" + key + "' (expected name, input, layers)");
      }
    }
  } catch (const YAML::Exception& e) {
    throw FormatError(source + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  if (!have_input) fail(source, root, "missing required key 'input'");
  if (!have_layers) fail(source, root, "missing required key 'layers'");
  if (spec.name.empty()) spec.name = "model";
  return spec;
}

ModelSpec loadModelSpec(const std::string& path) {
  return parseModelSpec(readFile(path, "model spec"), path);
}

}  // namespace tandem
