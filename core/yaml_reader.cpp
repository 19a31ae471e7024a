#include "core/yaml_reader.h"

#include <cmath>
#include <cstdlib>
#include <utility>
#include <vector>

#include "core/error.h"

namespace tandem {

namespace {

struct Unit {
  const char* name;
  double scale;
};

// "<number>[ ]<unit>" with unit one of `units` (the empty unit included when listed):
// the number times the unit's scale, or NaN if the text is not of that form.
double withUnit(const std::string& text, const std::vector<Unit>& units) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(v)) return std::nan("");
  std::string unit(end);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  for (const Unit& u : units)
    if (unit == u.name) return v * u.scale;
  return std::nan("");
}

}  // namespace

YAML::Node YamlReader::load(const std::string& text) const {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw FormatError(source_ + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": YAML syntax error: " + e.msg);
  }
}

std::string YamlReader::at(const YAML::Node& node) const {
  const YAML::Mark m = node.Mark();
  if (m.line < 0) return source_;
  std::string out = source_;
  out.append(":").append(std::to_string(m.line + 1)).append(":");
  return out.append(std::to_string(m.column + 1));
}

void YamlReader::fail(const YAML::Node& node, const std::string& what) const {
  throw InvalidArgument(at(node) + ": " + what);
}

int64_t YamlReader::positive(const YAML::Node& node, const std::string& key) const {
  const auto v = get<long long>(node, key, "an integer");
  if (v <= 0) fail(node, "'" + key + "' must be positive, got " + std::to_string(v));
  return v;
}

double YamlReader::nonNegative(const YAML::Node& node, const std::string& key) const {
  const auto v = get<double>(node, key, "a number");
  if (!(v >= 0) || !std::isfinite(v))
    fail(node, "'" + key + "' must be a non-negative number, got " + node.Scalar());
  return v;
}

int64_t YamlReader::bytes(const YAML::Node& node, const std::string& key) const {
  static const std::vector<Unit> units = {{"", 1},
                                          {"B", 1},
                                          {"KB", 1e3},
                                          {"MB", 1e6},
                                          {"GB", 1e9},
                                          {"KiB", 1024},
                                          {"MiB", 1024.0 * 1024},
                                          {"GiB", 1024.0 * 1024 * 1024},
                                          {"TB", 1e12},
                                          {"TiB", 1024.0 * 1024 * 1024 * 1024}};
  const char* what = "a byte count such as 4294967296, 512MiB or 2GB";
  if (!node.IsScalar()) fail(node, "'" + key + "' must be " + what);
  const double v = withUnit(node.Scalar(), units);
  if (!(v > 0) || v > 9e18)
    fail(node, "'" + key + "' must be " + what + ", got '" + node.Scalar() + "'");
  return static_cast<int64_t>(v);
}

double YamlReader::rate(const YAML::Node& node, const std::string& key) const {
  static const std::vector<Unit> units = {{"", 1},
                                          {"B/s", 1},
                                          {"KB/s", 1e3},
                                          {"MB/s", 1e6},
                                          {"GB/s", 1e9},
                                          {"KiB/s", 1024},
                                          {"MiB/s", 1024.0 * 1024},
                                          {"GiB/s", 1024.0 * 1024 * 1024},
                                          {"kbit/s", 1e3 / 8},
                                          {"Mbit/s", 1e6 / 8},
                                          {"Gbit/s", 1e9 / 8}};
  const char* what = "a rate such as 125000000, 12.5MB/s or 100Mbit/s";
  if (!node.IsScalar()) fail(node, "'" + key + "' must be " + what);
  const double v = withUnit(node.Scalar(), units);
  if (!(v > 0)) fail(node, "'" + key + "' must be " + what + ", got '" + node.Scalar() + "'");
  return v;
}

double YamlReader::seconds(const YAML::Node& node, const std::string& key) const {
  static const std::vector<Unit> units = {
      {"", 1}, {"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};
  const char* what = "a duration such as 0.002, 2ms or 50us";
  if (!node.IsScalar()) fail(node, "'" + key + "' must be " + what);
  const double v = withUnit(node.Scalar(), units);
  if (!(v >= 0)) fail(node, "'" + key + "' must be " + what + ", got '" + node.Scalar() + "'");
  return v;
}

}  // namespace tandem
