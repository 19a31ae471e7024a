// LayerSpec: a layer's type, hyper-parameters and sub-layers, as written in a YAML model
// spec or stored in a model file. Layers are built from a spec and can write one back.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace tandem {

using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>>;

struct LayerSpec {
  std::string type;
  std::map<std::string, AttrValue> attrs;
  std::vector<LayerSpec> children;  // the body of a block (residual)
  std::string where;  // source location for messages, e.g. "cnn.yaml:7:5"; may be empty
};

// Reads a spec's attributes with type checks, remembering which keys were used so that
// finish() can reject unknown keys. Errors are InvalidArgument naming the key; the
// Sequence that builds the layer adds its index, type and spec.where.
class SpecReader {
 public:
  explicit SpecReader(const LayerSpec& spec) : spec_(spec) {}

  int64_t integer(const std::string& key);
  int64_t integer(const std::string& key, int64_t fallback);
  double number(const std::string& key, double fallback);
  bool flag(const std::string& key, bool fallback);
  // A string that must be one of `allowed`; fallback when absent.
  std::string choice(const std::string& key, const std::string& fallback,
                     const std::vector<std::string>& allowed);
  // An integer or a list of two integers (e.g. kernel: 3 or kernel: [3, 5]).
  std::pair<int64_t, int64_t> pair(const std::string& key, int64_t fallback);
  std::pair<int64_t, int64_t> pair(const std::string& key);
  bool has(const std::string& key) const { return spec_.attrs.count(key) > 0; }
  // Throws if the spec has keys that were never read.
  void finish() const;

 private:
  [[noreturn]] void fail(const std::string& key, const std::string& problem) const;
  const AttrValue* find(const std::string& key);

  const LayerSpec& spec_;
  std::set<std::string> used_;
};

}  // namespace tandem
