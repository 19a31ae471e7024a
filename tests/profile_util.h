// Profiles for tests that need a plan to split: a measured profile's layer times scaled,
// so that compute outweighs whatever the links cost on a noisy machine.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/file.h"

namespace tandem::testing {

// Multiplies every layer's forward and backward times (min, median, max) in the profile
// file at `path` by `factor`, in place.
inline void scaleProfileTimes(const std::string& path, double factor) {
  nlohmann::json profile = nlohmann::json::parse(readFile(path, "profile"));
  for (auto& device : profile["devices"])
    for (auto& layer : device["layers"])
      for (const char* pass : {"forward_s", "backward_s"})
        for (const char* stat : {"min", "median", "max"})
          layer[pass][stat] = layer[pass][stat].get<double>() * factor;
  std::ofstream(path) << profile.dump();
}

}  // namespace tandem::testing
