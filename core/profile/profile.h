// A device profile: what `tandem profile` measures and the partitioner reads. Per
// device, its facts, a GEMM throughput summary and, per layer of one model at one
// batch size, the forward and backward time (median and spread over repeats after
// warm-up), the activation and parameter bytes and the FLOPs.
//
// On disk it is JSON, schema "tandem-profile" version 1 (docs/profile.md, with the
// JSON Schema in docs/profile.schema.json). parseProfile() checks every field's
// presence and type and refuses other versions, naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/profile/measure.h"

namespace tandem {

inline constexpr int kProfileVersion = 1;

struct LayerProfile {
  int64_t index = 0;
  std::string type;
  Shape output;                  // with the batch dimension
  Spread forward, backward;      // seconds
  int64_t activation_bytes = 0;  // the layer's output at this batch size
  int64_t param_bytes = 0;
  int64_t flops = 0;  // forward, per sample
};

struct GemmPoint {
  int64_t n = 0;      // n x n x n sgemm
  double gflops = 0;  // median
};

struct DeviceProfile {
  DeviceInfo device;
  std::vector<GemmPoint> gemm;
  std::vector<LayerProfile> layers;
};

struct Profile {
  std::string model;  // the model's name
  Shape input;        // one sample
  int64_t batch = 0;
  int warmup = 0, repeats = 0;
  std::vector<DeviceProfile> devices;
};

struct ProfileOptions {
  int64_t batch = 64;
  int warmup = 3;
  int repeats = 10;
  std::vector<int64_t> gemm_sizes = {256, 512, 1024};
  uint64_t seed = 1;
};

// Measures `spec` on `backend` (builds its own copy of the model there).
DeviceProfile profileDevice(const ModelSpec& spec, Backend& backend, const ProfileOptions& o);

std::string profileToJson(const Profile& p);
// `where` names the source in errors (a file path).
Profile parseProfile(const std::string& json, const std::string& where);

}  // namespace tandem
