#include "core/layers/spec.h"

#include <cmath>

#include "core/error.h"

namespace tandem {

void SpecReader::fail(const std::string& key, const std::string& problem) const {
  throw InvalidArgument("field '" + key + "' " + problem);
}

const AttrValue* SpecReader::find(const std::string& key) {
  used_.insert(key);
  auto it = spec_.attrs.find(key);
  return it == spec_.attrs.end() ? nullptr : &it->second;
}

int64_t SpecReader::integer(const std::string& key) {
  const AttrValue* v = find(key);
  if (!v) fail(key, "is required");
  if (const auto* i = std::get_if<int64_t>(v)) return *i;
  fail(key, "must be an integer");
}

int64_t SpecReader::integer(const std::string& key, int64_t fallback) {
  return has(key) ? integer(key) : (used_.insert(key), fallback);
}

double SpecReader::number(const std::string& key, double fallback) {
  const AttrValue* v = find(key);
  if (!v) return fallback;
  if (const auto* d = std::get_if<double>(v)) return *d;
  if (const auto* i = std::get_if<int64_t>(v)) return static_cast<double>(*i);
  fail(key, "must be a number");
}

bool SpecReader::flag(const std::string& key, bool fallback) {
  const AttrValue* v = find(key);
  if (!v) return fallback;
  if (const auto* s = std::get_if<std::string>(v)) {
    if (*s == "true") return true;
    if (*s == "false") return false;
  }
  if (const auto* i = std::get_if<int64_t>(v); i && (*i == 0 || *i == 1)) return *i == 1;
  fail(key, "must be true or false");
}

std::string SpecReader::choice(const std::string& key, const std::string& fallback,
                               const std::vector<std::string>& allowed) {
  const AttrValue* v = find(key);
  if (!v) return fallback;
  if (const auto* s = std::get_if<std::string>(v))
    for (const std::string& a : allowed)
      if (*s == a) return a;
  std::string list;
  for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
  fail(key, "must be one of " + list);
}

std::pair<int64_t, int64_t> SpecReader::pair(const std::string& key) {
  const AttrValue* v = find(key);
  if (!v) fail(key, "is required");
  if (const auto* i = std::get_if<int64_t>(v)) return {*i, *i};
  if (const auto* l = std::get_if<std::vector<int64_t>>(v); l && l->size() == 2)
    return {(*l)[0], (*l)[1]};
  fail(key, "must be an integer or a list of two integers");
}

std::pair<int64_t, int64_t> SpecReader::pair(const std::string& key, int64_t fallback) {
  return has(key) ? pair(key) : (used_.insert(key), std::pair{fallback, fallback});
}

void SpecReader::finish() const {
  for (const auto& [key, value] : spec_.attrs) {
    if (!used_.count(key)) {
      std::string known;
      for (const auto& k : used_) known += (known.empty() ? "" : ", ") + k;
      throw InvalidArgument("unknown field '" + key +
                            "' (known: " + (known.empty() ? "none" : known) + ")");
    }
  }
}

}  // namespace tandem
