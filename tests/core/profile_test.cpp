// Profiles: what profileDevice measures for each layer, the JSON round trip, and the
// reader's errors on bad files (every field named by its path).
#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/profile/profile.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::expectThrowWith;

Profile tinyProfile() {
  cpu::CpuBackend be;
  ProfileOptions o;
  o.batch = 4;
  o.warmup = 1;
  o.repeats = 3;
  o.gemm_sizes = {16, 32};
  const ModelSpec spec = parseModelSpec(testing::kTinyNet);
  Profile p{spec.name, spec.input, o.batch, o.warmup, o.repeats, {}};
  p.devices.push_back(profileDevice(spec, be, o));
  return p;
}

TEST(ProfileTest, EveryLayerIsMeasuredWithItsSizes) {
  const Profile p = tinyProfile();
  ASSERT_EQ(p.devices.size(), 1u);
  const DeviceProfile& d = p.devices[0];
  EXPECT_EQ(d.device.name, "cpu");
  ASSERT_EQ(d.gemm.size(), 2u);
  EXPECT_EQ(d.gemm[1].n, 32);
  EXPECT_GT(d.gemm[1].gflops, 0);
  Model m(parseModelSpec(testing::kTinyNet));
  ASSERT_EQ(d.layers.size(), m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    const LayerProfile& l = d.layers[i];
    EXPECT_EQ(l.index, static_cast<int64_t>(i));
    EXPECT_EQ(l.type, m.layer(i).type());
    EXPECT_EQ(l.output, m.layer(i).outputShape().withBatch(4));
    EXPECT_EQ(l.activation_bytes, l.output.numel() * 4);
    EXPECT_EQ(l.param_bytes, m.layer(i).paramCount() * 4);
    EXPECT_EQ(l.flops, m.layer(i).flops());
    for (const Spread& s : {l.forward, l.backward}) {
      EXPECT_EQ(s.repeats, 3);
      EXPECT_LE(s.min, s.median);
      EXPECT_LE(s.median, s.max);
      EXPECT_GT(s.max, 0);
    }
  }
  EXPECT_EQ(d.layers[0].type, "conv2d");
  EXPECT_EQ(d.layers[0].param_bytes, (4 * 9 + 4) * 4);
}

TEST(ProfileTest, JsonRoundTrips) {
  const Profile p = tinyProfile();
  const Profile q = parseProfile(profileToJson(p), "mem");
  EXPECT_EQ(q.model, "tiny");
  EXPECT_EQ(q.input, (Shape{1, 8, 8}));
  EXPECT_EQ(q.batch, 4);
  ASSERT_EQ(q.devices.size(), 1u);
  const DeviceProfile &a = p.devices[0], &b = q.devices[0];
  EXPECT_EQ(b.device.memory_bytes, a.device.memory_bytes);
  EXPECT_EQ(b.device.model, a.device.model);
  EXPECT_EQ(b.gemm[0].gflops, a.gemm[0].gflops);
  ASSERT_EQ(b.layers.size(), a.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    EXPECT_EQ(b.layers[i].output, a.layers[i].output);
    EXPECT_EQ(b.layers[i].forward.median, a.layers[i].forward.median);
    EXPECT_EQ(b.layers[i].backward.max, a.layers[i].backward.max);
    EXPECT_EQ(b.layers[i].activation_bytes, a.layers[i].activation_bytes);
  }
}

TEST(ProfileTest, BadFilesNameTheField) {
  const std::string good = profileToJson(tinyProfile());
  auto edited = [&](const std::string& from, const std::string& to) {
    const size_t at = good.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return std::string(good).replace(at, from.size(), to);
  };
  expectThrowWith<FormatError>([] { parseProfile("{", "p.json"); }, {"p.json: not JSON"});
  expectThrowWith<FormatError>([] { parseProfile("[]", "p.json"); }, {"is not an object"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(edited("\"version\": 1", "\"version\": 2"), "p"); },
      {"profile version 2 is not supported", "reads version 1"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(edited("\"schema\": \"tandem-profile\"", "\"schema\": \"x\""), "p"); },
      {"profile field schema"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(edited("\"batch\": 4", "\"batch\": \"4\""), "p"); },
      {"p: profile field batch has the wrong type"});
  expectThrowWith<FormatError>([&] { parseProfile(edited("\"batch\": 4", "\"batch\": -4"), "p"); },
                               {"profile field batch is negative"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(edited("\"param_bytes\"", "\"param_byte\""), "p"); },
      {"profile field devices[0].layers[0].param_bytes is missing"});
  expectThrowWith<FormatError>([&] { parseProfile(edited("\"median\"", "\"medianx\""), "p"); },
                               {"devices[0].layers[0].backward_s.median is missing"});
  expectThrowWith<FormatError>([&] { parseProfile(edited("\"index\": 1", "\"index\": 5"), "p"); },
                               {"devices[0].layers[1].index is out of order"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(edited("\"input\": [", "\"input\": [1, 1, 1, 1, 1, 1, 1, 1, 1, "), "p"); },
      {"profile field input", "rank"});
  // A median outside [min, max] is not a measurement.
  Profile p = tinyProfile();
  p.devices[0].layers[2].forward.median = p.devices[0].layers[2].forward.max * 2 + 1;
  expectThrowWith<FormatError>([&] { parseProfile(profileToJson(p), "p"); },
                               {"devices[0].layers[2].forward_s is not min <= median <= max"});
}

}  // namespace
}  // namespace tandem
