// Reading YAML files whose every error names the file, line and column of the value at
// fault ("job.yaml:12:5: 'batch' must be positive, got 0"). Job files, model specs,
// cluster files and plans all read through it.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>

namespace tandem {

class YamlReader {
 public:
  explicit YamlReader(std::string source) : source_(std::move(source)) {}

  const std::string& source() const { return source_; }
  // Parses text; FormatError "source:line:col: YAML syntax error: ..." if it is not YAML.
  YAML::Node load(const std::string& text) const;
  // "source:line:col" of a node (the source alone for nodes without a position).
  std::string at(const YAML::Node& node) const;
  // InvalidArgument "source:line:col: what".
  [[noreturn]] void fail(const YAML::Node& node, const std::string& what) const;

  // A scalar converted to T; fails with "'key' must be <kind>" otherwise.
  template <typename T>
  T get(const YAML::Node& node, const std::string& key, const char* kind) const {
    T value;
    if (!node.IsScalar() || !YAML::convert<T>::decode(node, value))
      fail(node, "'" + key + "' must be " + kind);
    return value;
  }
  int64_t positive(const YAML::Node& node, const std::string& key) const;
  double nonNegative(const YAML::Node& node, const std::string& key) const;
  // A byte count: an integer, or a number with a unit: "512MiB", "2 GiB", "1.5GB", "64KiB".
  int64_t bytes(const YAML::Node& node, const std::string& key) const;
  // A rate in bytes per second: a number (B/s) or with a unit: "12.5MB/s", "1Gbit/s",
  // "100Mbit/s", "2GiB/s".
  double rate(const YAML::Node& node, const std::string& key) const;
  // A duration in seconds: a number (s) or with a unit: "50us", "2ms", "0.1s".
  double seconds(const YAML::Node& node, const std::string& key) const;

 private:
  std::string source_;
};

}  // namespace tandem
