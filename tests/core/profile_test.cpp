// Profiles: what profileDevice measures for each layer, the JSON round trip, and the
// reader's errors on bad files (every field named by its path).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/profile/profile.h"
#include "tests/forwarding_backend.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::expectThrowWith;

// Batch 4, one warm-up pass, `repeats` timed, one small GEMM, a `sustain_s` window.
ProfileOptions quickOptions(int repeats, double sustain_s) {
  ProfileOptions o;
  o.batch = 4;
  o.warmup = 1;
  o.repeats = repeats;
  o.gemm_sizes = {16};
  o.sustain_s = sustain_s;
  return o;
}

// The CPU's profile of the model `spec_text` under quickOptions(repeats, 0), without the
// optimizers' update (and without its decoding where `decode` is false).
Profile quickProfile(const std::string& spec_text, int repeats, bool decode = true) {
  cpu::CpuBackend be;
  ProfileOptions o = quickOptions(repeats, 0);
  o.update = false;
  o.decode = decode;
  const ModelSpec spec = parseModelSpec(spec_text);
  Profile p{spec.name, spec.input, o.batch, o.warmup, o.repeats, 0, {}, {}, std::nullopt};
  p.devices.push_back(profileDevice(spec, be, o));
  return p;
}

Profile tinyProfile() {
  cpu::CpuBackend be;
  ProfileOptions o;
  o.batch = 4;
  o.warmup = 1;
  o.repeats = 3;
  o.gemm_sizes = {16, 32};
  o.sustain_s = 0.05;
  const ModelSpec spec = parseModelSpec(testing::kTinyNet);
  Profile p{spec.name, spec.input, o.batch, o.warmup, o.repeats, 0, {}, {}, std::nullopt};
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
  // The output is [batch, classes]: the loss is measured with the layers.
  EXPECT_EQ(d.loss.repeats, 3);
  EXPECT_GT(d.loss.min, 0);
  EXPECT_LE(d.loss.median, d.loss.max);
  // Whole passes back to back for the window, beside the layers' medians and the loss.
  const Sustained& su = d.sustained;
  EXPECT_GE(su.passes, 2);
  EXPECT_GE(su.window_s, 0.05);
  EXPECT_GT(su.pass_s, 0);  // the median part's time per pass
  EXPECT_LE(su.pass_s, su.window_s);
  double burst = d.loss.median;
  for (const LayerProfile& l : d.layers) burst += l.forward.median + l.backward.median;
  EXPECT_DOUBLE_EQ(su.burst_pass_s, burst);
  EXPECT_DOUBLE_EQ(su.scale(), su.pass_s / su.burst_pass_s);
  EXPECT_GT(su.cpu_cores, 0);
  EXPECT_GT(su.cpu_pass_s, 0);  // the process's CPU over the window, per pass
  // One optimizer update of every parameter, per kind.
  ASSERT_EQ(d.update.size(), 2u);
  for (const char* kind : {"sgd", "adamw"}) {
    ASSERT_EQ(d.update.count(kind), 1u) << kind;
    const Spread& s = d.update.at(kind);
    EXPECT_EQ(s.repeats, 3);
    EXPECT_GT(s.min, 0);
    EXPECT_LE(s.median, s.max);
  }
}

// Keeps this thread busy for `s` seconds: work, as a device's pass is.
void spin(double s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(s);
  while (std::chrono::steady_clock::now() < end) {
  }
}

TEST(ProfileTest, ASustainedWindowSeesTheStallsThatMediansHide) {
  // A device that works 1 ms per pass and, like a quarter-core quota, waits out three
  // times its work every fourth pass: the median pass is 1 ms, what it keeps up is 2.5 ms.
  int calls = 0;
  const SustainedRun r = runSustained(
      [&] {
        spin(1e-3);
        if (++calls % 4 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(6));
      },
      0.2);
  EXPECT_GE(r.window_s, 0.2);
  EXPECT_EQ(r.passes, calls);
  EXPECT_GT(r.pass_s, 1.5e-3);  // the sleeps alone add 1.5 ms per pass on average
  EXPECT_GT(r.cpu_s, 0);        // the process's CPU over the window: the spinning
  // Passes that only wait cost next to no CPU, however long they take (the bound leaves
  // room for the process's other threads: OpenBLAS's spin for a while after it starts).
  const SustainedRun waiting =
      runSustained([] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }, 0.3);
  EXPECT_GE(waiting.window_s, 0.3);
  EXPECT_LT(waiting.cpu_s, 0.5 * waiting.window_s);
  // At least two passes, however long the window.
  int slow = 0;
  const SustainedRun two = runSustained([&] { ++slow; }, 0);
  EXPECT_EQ(two.passes, 2);
  EXPECT_EQ(slow, 2);
}

TEST(ProfileTest, LayersRunInOrderChainAsAStagesPass) {
  cpu::CpuBackend be;
  Model model(parseModelSpec(testing::kTinyNet));
  model.build(be, 1);
  LayerRunner runner(model, 3, 7);
  // Forward: what layer i wrote is what layer i + 1 reads next (conv2d -> relu).
  const std::vector<float> before = toHost(runner.input(1));
  runner.forward(0);
  Stash stash;
  const std::vector<float> out = toHost(model.layer(0).forward(runner.input(0), stash, {true, 1}));
  EXPECT_EQ(toHost(runner.input(1)), out);
  EXPECT_EQ(before, out);  // the weights do not change: every pass computes the same
  // Backward: layer i's input gradient is what layer i - 1 reads (relu -> conv2d), not the
  // random gradient it was given.
  const std::vector<float> given = toHost(runner.outputGrad(0));
  runner.forward(1);
  runner.backward(1);
  const std::vector<float> dx = toHost(runner.outputGrad(0));
  EXPECT_NE(dx, given);
  const std::vector<float> y = toHost(runner.input(1));
  const std::vector<float> dy = toHost(runner.outputGrad(1));
  for (size_t k = 0; k < dx.size(); ++k) EXPECT_EQ(dx[k], y[k] > 0 ? dy[k] : 0.0f) << k;
}

TEST(ProfileTest, TheWindowCrossesFortyQuotaPeriods) {
  CpuLimit none;
  EXPECT_DOUBLE_EQ(sustainWindow(0.5, none), 0.5);
  CpuLimit quarter;
  quarter.quota_cores = 0.25;
  quarter.period_s = 0.05;
  EXPECT_DOUBLE_EQ(sustainWindow(0.5, quarter), 2.0);
  EXPECT_DOUBLE_EQ(sustainWindow(3.0, quarter), 3.0);
  quarter.period_s = 1.0;  // at most 4 s
  EXPECT_DOUBLE_EQ(sustainWindow(0.5, quarter), 4.0);
  quarter.period_s = 0.005;
  EXPECT_DOUBLE_EQ(sustainWindow(0.5, quarter), 0.5);
}

TEST(ProfileTest, TheSustainedFigureIsTheMedianPart) {
  // Passes of 1 ms, but a fifth of the window slowed to 5 ms a pass (another process's
  // burst): the median part says 1 ms, the window's mean 1.19 ms.
  std::vector<double> ends;
  double t = 0;
  for (int i = 1; i <= 252; ++i) ends.push_back(t += i > 60 && i <= 72 ? 5e-3 : 1e-3);
  EXPECT_NEAR(medianPartPass(ends, 5), 1e-3, 1e-9);
  EXPECT_NEAR(t / 252, 1.19e-3, 1e-5);
  // Steady passes: every part says the same.
  EXPECT_NEAR(medianPartPass({0.01, 0.02, 0.03, 0.04, 0.05}, 5), 0.01, 1e-12);
  // Fewer passes than parts: the parts that hold some.
  EXPECT_NEAR(medianPartPass({0.5, 1.0}, 5), 0.5, 1e-12);
  EXPECT_THROW(medianPartPass({}, 5), InvalidArgument);
}

LinkSet twoLinks() {
  LinkSet s{"tcp", 1 << 20, 1, 5, {}};
  s.links.push_back({"edge", "cloud", 1.25e8, 2e-4, {4e-4, 3e-4, 9e-4, 5}, 4.5e-8, 0.75});
  s.links.push_back({"edge", "edge", 3e9, 2.5e-5, {5e-5, 4e-5, 7e-5, 5}, 0});
  return s;
}

TEST(ProfileTest, TheFirstLayerWithWeightsIsAlsoTimedWithoutItsInputGradient) {
  // A linear layer after a flatten: the first stage runs its backward without the input
  // gradient (nothing below it wants that), so every other timed pass times it so.
  const Profile p = quickProfile(
      "name: flat\ninput: [2, 3, 3]\nlayers: [flatten, {linear: {out: 8}}, relu, "
      "{linear: {out: 3}}]\n",
      4);
  const std::vector<LayerProfile>& layers = p.devices[0].layers;
  ASSERT_EQ(layers.size(), 4u);
  EXPECT_EQ(layers[1].backward.repeats, 2);
  EXPECT_EQ(layers[1].backward_no_input.repeats, 2);
  EXPECT_GT(layers[1].backward_no_input.min, 0);
  EXPECT_LE(layers[1].backward_no_input.median, layers[1].backward_no_input.max);
  for (const size_t i : {size_t{0}, size_t{2}, size_t{3}}) {
    EXPECT_EQ(layers[i].backward.repeats, 4) << i;
    EXPECT_EQ(layers[i].backward_no_input.repeats, 0) << i;
  }
  const Profile q = parseProfile(profileToJson(p), "mem");
  EXPECT_EQ(q.devices[0].layers[1].backward_no_input.median, layers[1].backward_no_input.median);
  EXPECT_EQ(q.devices[0].layers[1].backward_no_input.repeats, 2);
  EXPECT_EQ(q.devices[0].layers[2].backward_no_input.repeats, 0);
  // A first layer with weights (the tiny net's convolution) has nothing to time so: its
  // backward has no input gradient already.
  const Profile tiny = tinyProfile();  // kept: a range over a temporary's member dangles
  for (const LayerProfile& l : tiny.devices[0].layers)
    EXPECT_EQ(l.backward_no_input.repeats, 0) << l.index;
}

TEST(ProfileTest, ALanguageModelsDecodingIsTimedPerLayer) {
  // A token of one sequence and of decode_batch at once, at half the context, through
  // every layer; the larger batch costs more than one sequence's token and less than that
  // many of them one after another only where the weights are read once (not asserted:
  // a timing), so only that both are timed and ordered as a spread.
  const std::string lm =
      "name: lm\ninput: [16]\nlayers:\n  - embedding: {vocab: 32, dim: 16}\n"
      "  - positional: {context: 16}\n  - transformer: {heads: 2, mlp: 32}\n"
      "  - layernorm\n  - linear: {out: 32}\n";
  const Profile p = quickProfile(lm, 3);
  const DeviceProfile& d = p.devices[0];
  EXPECT_EQ(d.decode_context, 8);
  EXPECT_EQ(d.decode_batch, 4);
  ASSERT_EQ(d.layers.size(), 5u);
  for (const LayerProfile& l : d.layers) {
    EXPECT_EQ(l.decode.repeats, 3) << l.index;
    EXPECT_EQ(l.decode_batch.repeats, 3) << l.index;
    EXPECT_GT(l.decode.min, 0) << l.index;
    EXPECT_LE(l.decode_batch.min, l.decode_batch.median) << l.index;
  }
  // The transformer's cache: keys and values, 16 wide, for the context of 16 tokens.
  EXPECT_EQ(d.layers[2].cache_bytes, 2 * 16 * 16 * 4);
  for (const size_t i : {size_t{0}, size_t{1}, size_t{3}, size_t{4}})
    EXPECT_EQ(d.layers[i].cache_bytes, 0) << i;
  const Profile q = parseProfile(profileToJson(p), "mem");
  EXPECT_EQ(q.devices[0].layers[2].cache_bytes, d.layers[2].cache_bytes);
  EXPECT_EQ(q.devices[0].decode_context, 8);
  EXPECT_EQ(q.devices[0].decode_batch, 4);
  EXPECT_EQ(q.devices[0].layers[2].decode.median, d.layers[2].decode.median);
  EXPECT_EQ(q.devices[0].layers[2].decode_batch.median, d.layers[2].decode_batch.median);
  // A model that does not decode token by token (the tiny CNN) has no decoding times;
  // a profile saying so reads back without them.
  const Profile tiny = tinyProfile();
  EXPECT_FALSE(tiny.devices[0].decodes());
  for (const LayerProfile& l : tiny.devices[0].layers) EXPECT_EQ(l.decode.repeats, 0);
  EXPECT_FALSE(parseProfile(profileToJson(tiny), "mem").devices[0].decodes());
  // Asked not to (ProfileOptions::decode), it does not time them.
  EXPECT_FALSE(quickProfile(lm, 1, false).devices[0].decodes());
}

TEST(ProfileTest, DecodingTimesWithoutWhereTheyWereTimedAreRefused) {
  const Profile p = quickProfile(
      "name: lm\ninput: [8]\nlayers:\n  - embedding: {vocab: 16, dim: 8}\n  - linear: {out: 16}\n",
      2);
  ASSERT_TRUE(p.devices[0].decodes());
  const std::string text = profileToJson(p);
  auto without = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) t.replace(at, from.size(), to);
    return t;
  };
  expectThrowWith<FormatError>(
      [&] { (void)parseProfile(without("\"decode\": {", "\"decoded\": {"), "p.json"); },
      {"p.json: profile field devices[0].layers[0].decode_s is given without the device's"});
  expectThrowWith<FormatError>(
      [&] { (void)parseProfile(without("\"decode_batch_s\"", "\"decode_batch_x\""), "p.json"); },
      {"profile field devices[0].layers[0].decode_batch_s is missing"});
  expectThrowWith<FormatError>(
      [&] { (void)parseProfile(without("\"context\": 4", "\"context\": 0"), "p.json"); },
      {"profile field devices[0].decode.context is not positive"});
}

TEST(ProfileTest, JsonRoundTrips) {
  Profile p = tinyProfile();
  p.load = 2;
  const Profile q = parseProfile(profileToJson(p), "mem");
  EXPECT_EQ(q.load, 2);
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
  EXPECT_EQ(b.loss.median, a.loss.median);
  EXPECT_EQ(b.sustained.pass_s, a.sustained.pass_s);
  EXPECT_EQ(b.sustained.burst_pass_s, a.sustained.burst_pass_s);
  EXPECT_EQ(b.sustained.window_s, a.sustained.window_s);
  EXPECT_EQ(b.sustained.passes, a.sustained.passes);
  EXPECT_EQ(b.sustained.cpu_cores, a.sustained.cpu_cores);
  EXPECT_EQ(b.sustained.quota_cores, a.sustained.quota_cores);
  EXPECT_EQ(b.sustained.cpu_pass_s, a.sustained.cpu_pass_s);
  EXPECT_TRUE(q.message_cpu.empty());
  p.message_cpu = {{4096, 8e-5, 1e-5}, {262144, 6e-4, 3e-5}};
  const Profile r = parseProfile(profileToJson(p), "mem");
  ASSERT_EQ(r.message_cpu.size(), 2u);
  EXPECT_EQ(r.message_cpu[1].bytes, 262144);
  EXPECT_EQ(r.message_cpu[1].cpu_s, 6e-4);
  EXPECT_EQ(r.message_cpu[0].send_s, 1e-5);
  EXPECT_EQ(r.message_cpu[1].send_s, 3e-5);
  EXPECT_TRUE(r.group_allreduce.empty());
  p.group_allreduce = {{2, 4096, 6e-6}, {2, 1 << 20, 2.1e-4}};
  const Profile g = parseProfile(profileToJson(p), "mem");
  ASSERT_EQ(g.group_allreduce.size(), 2u);
  EXPECT_EQ(g.group_allreduce[1].ranks, 2);
  EXPECT_EQ(g.group_allreduce[1].bytes, 1 << 20);
  EXPECT_EQ(g.group_allreduce[1].seconds, 2.1e-4);
  EXPECT_EQ(g.group_allreduce[0].seconds, 6e-6);
  ASSERT_EQ(b.update.size(), 2u);
  EXPECT_EQ(b.update.at("sgd").median, a.update.at("sgd").median);
  EXPECT_EQ(b.update.at("adamw").max, a.update.at("adamw").max);
  EXPECT_FALSE(q.links.has_value());
  // A device measured at the profile's batch says none of its own; one at another does.
  EXPECT_EQ(profileToJson(p).find("\"batch\": 16"), std::string::npos);
  EXPECT_EQ(b.batch, 0);
  EXPECT_EQ(b.batchIn(q), 4);
  p.devices[0].batch = 16;
  const Profile s = parseProfile(profileToJson(p), "mem");
  EXPECT_EQ(s.devices[0].batch, 16);
  EXPECT_EQ(s.devices[0].batchIn(s), 16);
}

TEST(ProfileTest, LinksRoundTripWithOrWithoutDevices) {
  Profile p = tinyProfile();
  p.links = twoLinks();
  for (bool devices : {true, false}) {
    if (!devices) p.devices.clear();
    const std::string text = profileToJson(p);
    if (!devices) {
      EXPECT_EQ(text.find("\"model\""), std::string::npos) << text;
    }
    const Profile q = parseProfile(text, "mem");
    EXPECT_EQ(q.devices.size(), devices ? 1u : 0u);
    ASSERT_TRUE(q.links.has_value());
    EXPECT_EQ(q.links->transport, "tcp");
    EXPECT_EQ(q.links->message_bytes, 1 << 20);
    ASSERT_EQ(q.links->links.size(), 2u);
    const LinkProfile& l = q.links->links[0];
    EXPECT_EQ(l.from, "edge");
    EXPECT_EQ(l.to, "cloud");
    EXPECT_EQ(l.bandwidth, 1.25e8);
    EXPECT_EQ(l.latency_s, 2e-4);
    EXPECT_EQ(l.round_trip.max, 9e-4);
    EXPECT_EQ(l.cpu_s_per_byte, 4.5e-8);
    EXPECT_EQ(l.sender_share, 0.75);
    EXPECT_EQ(q.links->links[1].to, "edge");
    EXPECT_EQ(q.links->links[1].cpu_s_per_byte, 0);  // not measured: not written
    EXPECT_EQ(q.links->links[1].sender_share, 0);
  }
  const std::string text = profileToJson(p);
  EXPECT_EQ(text.find("cpu_s_per_byte"), text.rfind("cpu_s_per_byte")) << text;
  EXPECT_EQ(text.find("sender_share"), text.rfind("sender_share")) << text;
  std::string whole = text;
  whole.replace(whole.find("0.75"), 4, "1.00");
  expectThrowWith<FormatError>([&] { parseProfile(whole, "l.json"); },
                               {"l.json", "links.measured[0].sender_share", "not between 0 and 1"});
  std::string negative = text;
  negative.replace(negative.find("4.5e-08"), 7, "-1e-08");
  expectThrowWith<FormatError>(
      [&] { parseProfile(negative, "l.json"); },
      {"l.json", "links.measured[0].cpu_s_per_byte", "not a finite, non-negative number"});
}

TEST(ProfileTest, EarlierVersionsStillRead) {
  Profile with_batch = tinyProfile();
  with_batch.devices[0].batch = 16;
  with_batch.devices[0].layers[1].lacks = {{Op::kActivationBackward, DType::kF32}};
  for (const char* version : {"1", "2", "3", "4", "5"}) {
    std::string text = profileToJson(with_batch);
    const size_t at = text.find("\"version\": 6");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, 12, std::string("\"version\": ") + version);
    const Profile q = parseProfile(text, "old.json");
    ASSERT_EQ(q.devices.size(), 1u);
    if (version[0] == '1') {
      EXPECT_EQ(q.devices[0].loss.repeats, 0);  // version 1 has no loss
    }
    if (version[0] < '3') {
      EXPECT_EQ(q.devices[0].sustained.passes, 0);  // nor sustained before version 3
      EXPECT_EQ(q.devices[0].sustained.scale(), 1.0);
    }
    if (version[0] < '5') {
      EXPECT_EQ(q.devices[0].batch, 0);  // a device's own batch came with version 5
    }
    EXPECT_TRUE(q.devices[0].layers[1].lacks.empty());  // what it lacks, with version 6
    if (version[0] < '4') {
      EXPECT_TRUE(q.devices[0].update.empty());  // nor an update before version 4
    }

    EXPECT_EQ(q.model, "tiny");
  }
}

// A device whose backend lacks ops: the layers that need them are not timed and say what
// they lack (the loss's on the last layer), the others are measured as ever, an optimizer
// it lacks the step of is not measured, and the file carries all of it back.
TEST(ProfileTest, ADeviceLackingOpsSaysWhichLayersItCannotRun) {
  cpu::CpuBackend cpu;
  const OpUse gelu_back{Op::kActivationBackward, DType::kF32};
  const OpUse loss{Op::kSoftmaxCrossEntropy, DType::kF32};
  testing::ForwardingBackend be(cpu, {gelu_back, loss, {Op::kAdamwStep, DType::kF32}});
  const ProfileOptions o = quickOptions(2, 0.05);
  const ModelSpec spec = parseModelSpec(testing::kTinyNet);
  Profile p{spec.name, spec.input, o.batch, o.warmup, o.repeats, 0, {}, {}, std::nullopt};
  p.devices.push_back(profileDevice(spec, be, o));
  const DeviceProfile& d = p.devices[0];
  ASSERT_EQ(d.layers.size(), 9u);
  for (const LayerProfile& l : d.layers) {
    // relu (1) and gelu (6) both need activationBackward; the last linear (8) the loss.
    const bool own = l.index == 1 || l.index == 6;  // lacks its own ops: not timed
    EXPECT_EQ(!l.lacks.empty(), own || l.index == 8) << l.index << " " << l.type;
    EXPECT_EQ(l.forward.repeats, own ? 0 : 2) << l.index;
    EXPECT_EQ(l.backward.repeats, own ? 0 : 2) << l.index;
    if (own) {
      EXPECT_EQ(l.forward.max + l.backward.max, 0) << l.index;
    }
    EXPECT_TRUE(l.forward_runs) << l.index;
  }
  EXPECT_EQ(d.layers[1].lacks, std::vector<OpUse>{gelu_back});
  EXPECT_EQ(d.layers[8].lacks, std::vector<OpUse>{loss});
  EXPECT_EQ(d.loss.repeats, 0);            // not measured
  EXPECT_EQ(d.update.count("adamw"), 0u);  // lacked
  EXPECT_EQ(d.update.count("sgd"), 1u);
  const Profile q = parseProfile(profileToJson(p), "mem");
  for (size_t i = 0; i < d.layers.size(); ++i) {
    EXPECT_EQ(q.devices[0].layers[i].lacks, d.layers[i].lacks) << i;
    EXPECT_EQ(q.devices[0].layers[i].forward_runs, d.layers[i].forward_runs) << i;
  }
  // A forward it lacks too is said so (serving cannot use the layer either).
  testing::ForwardingBackend no_gelu(cpu, {{Op::kActivation, DType::kF32}});
  p.devices[0] = profileDevice(spec, no_gelu, o);
  EXPECT_FALSE(p.devices[0].layers[6].forward_runs);
  EXPECT_EQ(parseProfile(profileToJson(p), "mem").devices[0].layers[6].forward_runs, false);
  // A bad entry is refused naming the field.
  const std::string text = profileToJson(p);
  const size_t at = text.find("\"activation on f32\"");
  ASSERT_NE(at, std::string::npos);
  for (const char* bad :
       {"\"activation in f32\"", "\"nothing on f32\"", "\"activation on f64\"", "3"})
    expectThrowWith<FormatError>([&] { parseProfile(std::string(text).replace(at, 19, bad), "p"); },
                                 {"profile field devices[0].layers[1].lacks"});
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
      [&] { parseProfile(edited("\"version\": 6", "\"version\": 7"), "p"); },
      {"profile version 7 is not supported", "reads versions 1 to 6"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(edited("\"version\": 6", "\"version\": 0"), "p"); },
      {"profile version 0 is not supported"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(edited("\"gemm\": ", "\"batch\": 0, \"gemm\": "), "p"); },
      {"profile field devices[0].batch is not positive"});
  expectThrowWith<FormatError>([&] { parseProfile(edited("\"pass_s\": ", "\"pass_s\": -"), "p"); },
                               {"profile field devices[0].sustained.pass_s is not positive"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(edited("\"passes\": ", "\"passes\": 0, \"x\": "), "p"); },
      {"devices[0].sustained.passes is not positive"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(edited("\"window_s\": ", "\"window_s\": 0, \"x\": "), "p"); },
      {"devices[0].sustained.window_s is shorter than one pass"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(edited("\"cpu_pass_s\": ", "\"cpu_pass_s\": -"), "p"); },
      {"devices[0].sustained.cpu_pass_s is negative"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(edited("\"sustained\": {", "\"sustained\": {\"y\": 1}, \"z\": {"), "p"); },
      {"devices[0].sustained.pass_s is missing"});
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
  expectThrowWith<FormatError>([&] { parseProfile(edited("\"batch\": 4", "\"batch\": 0"), "p"); },
                               {"profile field batch is not positive"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(edited("\"loss_s\": {", "\"loss_s\": 5, \"x\": {"), "p"); },
      {"profile field devices[0].loss_s has the wrong type"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(edited("\"update_s\": {", "\"update_s\": {\"lamb\": 1, "), "p"); },
      {"profile field devices[0].update_s.lamb is not an optimizer (sgd, adamw)"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(edited("\"update_s\": {", "\"update_s\": 2, \"x\": {"), "p"); },
      {"profile field devices[0].update_s has the wrong type"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(edited("\"sgd\": {", "\"sgd\": 7, \"x\": {"), "p"); },
      {"profile field devices[0].update_s.sgd has the wrong type"});
  Profile messages = tinyProfile();
  messages.message_cpu = {{4096, 8e-5}, {262144, 6e-4}};
  const std::string with = profileToJson(messages);
  auto editedWith = [&](const std::string& from, const std::string& to) {
    const size_t at = with.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return std::string(with).replace(at, from.size(), to);
  };
  expectThrowWith<FormatError>(
      [&] { parseProfile(editedWith("\"bytes\": 262144", "\"bytes\": 4096"), "p"); },
      {"profile field message_cpu[1].bytes is not larger than the point before"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(editedWith("\"bytes\": 4096", "\"bytes\": 0"), "p"); },
      {"profile field message_cpu[0].bytes is not positive"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(editedWith("\"message_cpu\": [", "\"message_cpu\": [7, "), "p"); },
      {"profile field message_cpu[0] is not an object"});
  // A tensor group's all-reduces: each point's fields checked, ascending sizes.
  Profile group = tinyProfile();
  group.group_allreduce = {{2, 4096, 6e-6}, {2, 65536, 1.6e-5}};
  const std::string with_group = profileToJson(group);
  auto editedGroup = [&](const std::string& from, const std::string& to) {
    const size_t at = with_group.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return std::string(with_group).replace(at, from.size(), to);
  };
  expectThrowWith<FormatError>(
      [&] { parseProfile(editedGroup("\"bytes\": 65536", "\"bytes\": 4096"), "p"); },
      {"profile field group_allreduce[1].bytes is not larger than the point before"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(editedGroup("\"ranks\": 2", "\"ranks\": 1"), "p"); },
      {"profile field group_allreduce[0].ranks is not 2 to 64"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(editedGroup("\"seconds\": 1.6e-05", "\"seconds\": 0"), "p"); },
      {"profile field group_allreduce[1].seconds is not positive"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(editedGroup("\"bytes\": 4096", "\"bytes\": 2"), "p"); },
      {"profile field group_allreduce[0].bytes is below one f32"});
  // Links: each field named with its place in the list.
  Profile linked = tinyProfile();
  linked.links = twoLinks();
  const std::string with_links = profileToJson(linked);
  auto editedLinks = [&](const std::string& from, const std::string& to) {
    const size_t at = with_links.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return std::string(with_links).replace(at, from.size(), to);
  };
  expectThrowWith<FormatError>(
      [&] { parseProfile(editedLinks("\"to\": \"cloud\"", "\"too\": \"cloud\""), "p"); },
      {"p: profile field links.measured[0].to is missing"});
  expectThrowWith<FormatError>(
      [&] {
        parseProfile(
            editedLinks("\"bandwidth_bytes_per_s\": 125000000.0", "\"bandwidth_bytes_per_s\": 0"),
            "p");
      },
      {"links.measured[0].bandwidth_bytes_per_s is not positive"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(editedLinks("\"to\": \"edge\"", "\"to\": \"cloud\""), "p"); },
      {"links.measured[1] measures a link twice"});
  expectThrowWith<FormatError>(
      [&] { parseProfile(editedLinks("\"transport\": \"tcp\"", "\"transport\": 7"), "p"); },
      {"links.transport has the wrong type"});
  // A median outside [min, max] is not a measurement.
  Profile p = tinyProfile();
  p.devices[0].layers[2].forward.median = p.devices[0].layers[2].forward.max * 2 + 1;
  expectThrowWith<FormatError>([&] { parseProfile(profileToJson(p), "p"); },
                               {"devices[0].layers[2].forward_s is not min <= median <= max"});
}

}  // namespace
}  // namespace tandem
