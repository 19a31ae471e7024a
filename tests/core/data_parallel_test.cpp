// Data-parallel training on the in-process group: with equal shares the weights are
// bitwise those of one device computing each replica's microbatch gradients apart and
// adding them in replica order; unequal shares match the full-batch update within float
// rounding; replicas stay identical; shares split batches as stated.
#include "core/train/data_parallel.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <set>

#include "backends/cpu/cpu_backend.h"
#include "backends/opencl/devices.h"
#include "backends/registry.h"
#include "core/error.h"
#include "core/loss.h"
#include "core/train/microbatch.h"
#include "tests/test_util.h"
#include "transport/local_group.h"

namespace tandem {
namespace {

using testing::expectThrowWith;

// A dropout-free classifier for the same data (the tiny net less its dropout): any split
// of a batch gives the same full-batch gradient up to rounding.
const std::string kNoDropout = [] {
  std::string spec = testing::kTinyNet;
  const std::string dropout = "  - dropout: {p: 0.2}\n";
  if (const size_t at = spec.find(dropout); at != std::string::npos) spec.erase(at, dropout.size());
  return spec;
}();

struct Replicas {
  std::vector<std::unique_ptr<cpu::CpuBackend>> backends;
  std::vector<std::unique_ptr<Group>> groups;
  std::unique_ptr<DataParallelTrainer> trainer;
};

Replicas makeReplicas(const std::string& spec, size_t n, const DataParallelOptions& o,
                      const OptimizerOptions& opt) {
  Replicas r;
  std::vector<Backend*> be;
  std::vector<Group*> g;
  r.groups = transport::makeLocalGroup(static_cast<int>(n));
  for (size_t i = 0; i < n; ++i) {
    r.backends.push_back(std::make_unique<cpu::CpuBackend>());
    be.push_back(r.backends.back().get());
    g.push_back(r.groups[i].get());
  }
  r.trainer = std::make_unique<DataParallelTrainer>(parseModelSpec(spec), be, g, opt, o);
  return r;
}

// The batch as host arrays (normalised like gatherBatch).
void batchOf(const Dataset& d, int64_t begin, int64_t n, std::vector<float>& x,
             std::vector<int32_t>& y) {
  std::vector<int64_t> order(static_cast<size_t>(d.size()));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  gatherBatch(d, order, begin, n, x, y);
}

// One device: each of `counts`' microbatches' gradients computed apart (seeded as
// replica k), then added in order, then one optimizer step.
void referenceStep(Model& model, Optimizer& opt, const std::vector<float>& x,
                   const std::vector<int32_t>& y, const std::vector<int64_t>& counts, uint64_t seed,
                   int64_t step) {
  Backend& be = model.backend();
  const int64_t n = static_cast<int64_t>(y.size()), per = model.inputShape().numel();
  std::vector<std::vector<float>> sum(model.params().size());
  int64_t offset = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    model.zeroGrad();
    if (counts[k] > 0) {
      Tensor xt = be.empty(model.inputShape().withBatch(counts[k]));
      be.upload(xt, x.data() + offset * per);
      Tensor yt = be.empty({counts[k]}, DType::kI32);
      be.upload(yt, y.data() + offset);
      Stash stash;
      Tensor logits = model.forward(
          xt, stash, ForwardContext{true, microbatchSeed(seed, step, static_cast<int64_t>(k))});
      Tensor grad = be.empty(logits.shape());
      softmaxCrossEntropy(be, logits, yt, 1.0f / static_cast<float>(n), grad);
      model.backward(grad, stash);
    }
    offset += counts[k];
    for (size_t p = 0; p < sum.size(); ++p) {
      const std::vector<float> g = toHost(model.params()[p]->grad);
      if (k == 0) {
        sum[p] = g;
      } else {
        for (size_t i = 0; i < g.size(); ++i) sum[p][i] += g[i];
      }
    }
  }
  for (size_t p = 0; p < sum.size(); ++p) be.upload(model.params()[p]->grad, sum[p].data());
  opt.step(model.params());
}

void expectSameWeights(const Model& a, const Model& b, const std::string& what) {
  ASSERT_EQ(a.params().size(), b.params().size());
  for (size_t p = 0; p < a.params().size(); ++p) {
    const std::vector<float> x = toHost(a.params()[p]->value), y = toHost(b.params()[p]->value);
    ASSERT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0)
        << what << ": " << a.params()[p]->name;
  }
}

// `steps` batches through the replicas and through one device: the losses agree within
// 1e-5 of their size, the weights within 1e-5 of theirs (not bitwise: the replicas' sums
// are added in another order).
void trainBesideOneDevice(DataParallelTrainer& dp, Trainer& one, const Model& ref,
                          const Dataset& data, int64_t batch, int64_t steps) {
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int64_t step = 0; step < steps; ++step) {
    batchOf(data, step * batch, batch, x, y);
    const double a = dp.step(x.data(), y.data(), batch);
    const double b = one.step(x.data(), y.data(), batch);
    EXPECT_NEAR(a, b, 1e-5 * std::abs(b)) << "step " << step;
  }
  for (size_t p = 0; p < ref.params().size(); ++p) {
    const std::vector<float> w = toHost(dp.model(0).params()[p]->value);
    const std::vector<float> v = toHost(ref.params()[p]->value);
    for (size_t i = 0; i < w.size(); ++i)
      ASSERT_NEAR(w[i], v[i], 1e-5f * (1 + std::abs(v[i]))) << ref.params()[p]->name << " " << i;
  }
}

TEST(DataParallelTest, EqualSharesAreBitwiseSingleDeviceAccumulation) {
  const Dataset data = testing::quadrants(200, 3);
  for (size_t replicas : {size_t{2}, size_t{3}}) {
    DataParallelOptions o;
    o.batch = 40;
    o.seed = 11;
    o.bucket_bytes = 512;  // several buckets, reduced while backward goes on
    OptimizerOptions opt;
    opt.kind = "adamw";
    opt.lr = 0.01f;
    opt.warmup_steps = 2;  // a schedule, applied by every replica as by the one device
    opt.lr_schedule = "step";
    opt.decay_steps = 1;
    opt.decay_factor = 0.5f;
    Replicas dp = makeReplicas(testing::kTinyNet, replicas, o, opt);

    cpu::CpuBackend be;
    Model ref(parseModelSpec(testing::kTinyNet));
    ref.build(be, o.seed);
    Optimizer ref_opt(be, opt);
    std::vector<float> x;
    std::vector<int32_t> y;
    for (int64_t step = 0; step < 4; ++step) {
      batchOf(data, step * o.batch, o.batch, x, y);
      const double loss = dp.trainer->step(x.data(), y.data(), o.batch);
      EXPECT_TRUE(std::isfinite(loss));
      referenceStep(ref, ref_opt, x, y, shareBatch(o.batch, replicas, {}), o.seed, step);
    }
    for (size_t r = 0; r < replicas; ++r)
      expectSameWeights(dp.trainer->model(r), ref,
                        std::to_string(replicas) + " replicas, replica " + std::to_string(r));
  }
}

TEST(DataParallelTest, UnequalSharesMatchTheFullBatchWithinRounding) {
  const Dataset data = testing::quadrants(300, 5);
  DataParallelOptions o;
  o.batch = 48;
  o.shares = {3, 1};  // a device three times faster takes three times the samples
  OptimizerOptions opt;
  opt.lr = 0.05f;
  Replicas dp = makeReplicas(kNoDropout, 2, o, opt);
  EXPECT_EQ(shareBatch(48, 2, o.shares), (std::vector<int64_t>{36, 12}));

  cpu::CpuBackend be;
  Model ref(parseModelSpec(kNoDropout));
  ref.build(be, o.seed);
  Optimizer ref_opt(be, opt);
  Trainer full(ref, ref_opt, TrainOptions{o.batch, o.seed, false, 1});
  // Bound: the weights agree to a few float roundings of their own size (sums of 36 and
  // 12 samples' gradients added in another order than 48's, over 5 steps).
  trainBesideOneDevice(*dp.trainer, full, ref, data, o.batch, 5);
  expectSameWeights(dp.trainer->model(0), dp.trainer->model(1), "replicas");
}

// A language model trains data parallel on text as one device does: a label per token,
// the loss a mean per token. Not bitwise: an embedding's gradient adds token rows one by
// one, so a replica's sum added to another's rounds otherwise than one running sum. (SGD:
// AdamW would turn the keys' bias gradient, zero but for rounding, into steps of lr.)
TEST(DataParallelTest, AGptOnTextMatchesOneDeviceWithinRounding) {
  const Dataset data = testing::phrases(96, 8, 3);
  DataParallelOptions o;
  o.batch = 16;
  OptimizerOptions opt;
  opt.lr = 0.1f;
  Replicas dp = makeReplicas(testing::kTinyGpt, 2, o, opt);
  cpu::CpuBackend be;
  Model ref(parseModelSpec(testing::kTinyGpt));
  ref.build(be, o.seed);
  Optimizer ref_opt(be, opt);
  Trainer one(ref, ref_opt, TrainOptions{o.batch, o.seed, false, 2});
  trainBesideOneDevice(*dp.trainer, one, ref, data, o.batch, 4);
  // Its layers (embedding, attention, norms, the head) on sharded state, 3 replicas:
  // bitwise the plain replicas at every ZeRO stage.
  Replicas plain = makeReplicas(testing::kTinyGpt, 3, o, opt);
  std::vector<std::unique_ptr<Replicas>> sharded;
  for (const int stage : {1, 2, 3}) {
    o.zero = stage;
    sharded.push_back(std::make_unique<Replicas>(makeReplicas(testing::kTinyGpt, 3, o, opt)));
  }
  const std::vector<int64_t> order = epochOrder(data.size(), false, o.seed, 0);
  for (int64_t step = 0; step < 3; ++step) {
    const double loss = plain.trainer->step(data, order, step * o.batch, o.batch);
    for (auto& r : sharded) EXPECT_EQ(r->trainer->step(data, order, step * o.batch, o.batch), loss);
  }
  for (size_t k = 0; k < sharded.size(); ++k)
    expectSameWeights(sharded[k]->trainer->model(2), plain.trainer->model(2),
                      "the GPT at ZeRO " + std::to_string(k + 1));
}

// The replicas gather their own shares (trainEpoch's steps): the same weights, bitwise,
// as the step on the batch gathered beforehand; a bad batch is refused before any
// replica starts, not after the others' timeout.
TEST(DataParallelTest, ReplicasGatheringTheirSharesTrainAsTheGatheredBatch) {
  const Dataset data = testing::quadrants(120, 4);
  const std::vector<int64_t> order = epochOrder(data.size(), true, 3, 0);
  for (const std::vector<double>& shares : {std::vector<double>{}, std::vector<double>{3, 1}}) {
    DataParallelOptions o;
    o.batch = 24;
    o.shares = shares;
    o.timeout = std::chrono::seconds(30);
    Replicas gathered = makeReplicas(kNoDropout, 2, o, OptimizerOptions{});
    Replicas own = makeReplicas(kNoDropout, 2, o, OptimizerOptions{});
    std::vector<float> x;
    std::vector<int32_t> y;
    for (int64_t step = 0; step < 4; ++step) {
      gatherBatch(data, order, step * o.batch, o.batch, x, y);
      const double a = gathered.trainer->step(x.data(), y.data(), o.batch);
      const double b = own.trainer->step(data, order, step * o.batch, o.batch);
      EXPECT_EQ(a, b) << "step " << step;
    }
    for (size_t r = 0; r < 2; ++r)
      expectSameWeights(
          own.trainer->model(r), gathered.trainer->model(r),
          "replica " + std::to_string(r) + ", " + std::to_string(shares.size()) + " shares");
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<int64_t> bad = order;
    bad[30] = data.size();
    expectThrowWith<InvalidArgument>([&] { own.trainer->step(data, bad, 24, 24); },
                                     {"batch position 30 names sample 120 of 120"});
    expectThrowWith<InvalidArgument>([&] { own.trainer->step(data, order, 110, 24); },
                                     {"batch [110, 134) of an order of 120 samples"});
    Dataset other = data;
    other.classes = 7;
    expectThrowWith<InvalidArgument>([&] { own.trainer->step(other, order, 0, 24); },
                                     {"has 7 classes"});
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    // And the replicas still step together afterwards.
    EXPECT_TRUE(std::isfinite(own.trainer->step(data, order, 0, 24)));
    expectSameWeights(own.trainer->model(0), own.trainer->model(1), "replicas after errors");
  }
}

TEST(DataParallelTest, SharesSplitTheBatch) {
  EXPECT_EQ(shareBatch(10, 3, {}), (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(shareBatch(10, 2, {1, 1}), (std::vector<int64_t>{5, 5}));
  EXPECT_EQ(shareBatch(10, 3, {2, 0, 1}), (std::vector<int64_t>{7, 0, 3}));
  EXPECT_EQ(shareBatch(2, 4, {}), (std::vector<int64_t>{1, 1, 0, 0}));
  // Shares as large as a double holds: their sum and n times one would overflow.
  EXPECT_EQ(shareBatch(64, 2, {1e308, 1e308}), (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(shareBatch(10, 3, {1e308, 0, 0.25e308}), (std::vector<int64_t>{8, 0, 2}));
  EXPECT_EQ(shareBatch(48, 2, {3e-300, 1e-300}), (std::vector<int64_t>{36, 12}));
  expectThrowWith<InvalidArgument>([] { shareBatch(10, 2, {1}); }, {"1 shares for 2 replicas"});
  expectThrowWith<InvalidArgument>([] { shareBatch(10, 2, {0, 0}); }, {"add up to 0"});
  expectThrowWith<InvalidArgument>([] { shareBatch(10, 2, {1, -1}); }, {"non-negative"});
}

// Shares from a profile: each device's samples per second over its layers and the loss.
TEST(DataParallelTest, SharesFromAProfileFollowEachDevicesSpeed) {
  const Model model(parseModelSpec(kNoDropout));
  Profile p;
  p.model = model.name();
  p.batch = 16;
  auto device = [&](const std::string& name, double layer_s) {
    DeviceProfile d;
    d.device.name = name;
    for (size_t l = 0; l < model.size(); ++l) {
      LayerProfile lp;
      lp.type = model.layer(l).type();
      lp.forward.median = layer_s;
      lp.backward.median = 2 * layer_s;
      d.layers.push_back(lp);
    }
    d.loss.median = layer_s;
    return d;
  };
  p.devices = {device("cpu", 1e-3), device("opencl:0", 0.25e-3)};
  const double n = static_cast<double>(model.size());
  const double cpu = 16 / (1e-3 * (3 * n + 1)), gpu = 16 / (0.25e-3 * (3 * n + 1));
  const std::vector<double> shares = sharesFromProfile(p, model, {"cpu", "opencl:0", "cpu"}, "p");
  ASSERT_EQ(shares.size(), 3u);
  EXPECT_DOUBLE_EQ(shares[0], cpu);
  EXPECT_DOUBLE_EQ(shares[1], gpu);  // four times the speed, four times the samples
  EXPECT_DOUBLE_EQ(shares[2], cpu);
  EXPECT_EQ(shareBatch(48, 3, shares), (std::vector<int64_t>{8, 32, 8}));

  expectThrowWith<InvalidArgument>([&] { sharesFromProfile(p, model, {"opencl:1"}, "p.json"); },
                                   {"p.json has no device 'opencl:1'", "cpu, opencl:0"});
  Profile other = p;
  other.model = "cnn";
  expectThrowWith<InvalidArgument>([&] { sharesFromProfile(other, model, {"cpu"}, "p.json"); },
                                   {"profiles model 'cnn'"});
  other = p;
  other.devices[0].layers[0].type = "linear";
  expectThrowWith<InvalidArgument>([&] { sharesFromProfile(other, model, {"cpu"}, "p.json"); },
                                   {"layer 0 is a linear in the profile but a conv2d"});
  other = p;
  other.devices[0].layers.pop_back();
  expectThrowWith<InvalidArgument>([&] { sharesFromProfile(other, model, {"cpu"}, "p.json"); },
                                   {"layers, the model"});
  other = p;
  other.devices[0] = device("cpu", 0);
  expectThrowWith<InvalidArgument>([&] { sharesFromProfile(other, model, {"cpu"}, "p.json"); },
                                   {"no time measured"});
  other = p;
  other.batch = 0;
  expectThrowWith<InvalidArgument>([&] { sharesFromProfile(other, model, {"cpu"}, "p.json"); },
                                   {"measures no batch"});
}

// A CPU and an OpenCL replica (where there is an OpenCL device): the same buckets on
// both (the device's travel through host copies), the same gradients, and weights that
// agree to the devices' rounding.
TEST(DataParallelTest, ACpuAndAnOpenClReplicaTrainTogether) {
  if (opencl::listClDevices().empty()) GTEST_SKIP() << "no OpenCL device";
  const Dataset data = testing::quadrants(200, 9);
  DataParallelOptions o;
  o.batch = 32;
  o.shares = {3, 1};
  std::vector<std::unique_ptr<Group>> groups = transport::makeLocalGroup(2);
  auto cpu = makeBackend("cpu");
  auto gpu = makeBackend("opencl:0");
  DataParallelTrainer dp(parseModelSpec(kNoDropout), {cpu.get(), gpu.get()},
                         {groups[0].get(), groups[1].get()}, OptimizerOptions{}, o);
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int64_t step = 0; step < 3; ++step) {
    batchOf(data, step * o.batch, o.batch, x, y);
    EXPECT_TRUE(std::isfinite(dp.step(x.data(), y.data(), o.batch)));
  }
  for (size_t p = 0; p < dp.model(0).params().size(); ++p) {
    const std::vector<float> a = toHost(dp.model(0).params()[p]->value);
    const std::vector<float> b = toHost(dp.model(1).params()[p]->value);
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_NEAR(a[i], b[i], 1e-5f * (1 + std::abs(a[i]))) << dp.model(0).params()[p]->name;
  }
  // ZeRO across them, each stage trained 3 steps on its own group: the CPU replica and
  // the OpenCL one.
  std::vector<std::vector<std::unique_ptr<Group>>> groups_of;
  auto sharded = [&](int stage) {
    o.zero = stage;
    groups_of.push_back(transport::makeLocalGroup(2));
    auto t = std::make_unique<DataParallelTrainer>(
        parseModelSpec(kNoDropout), std::vector<Backend*>{cpu.get(), gpu.get()},
        std::vector<Group*>{groups_of.back()[0].get(), groups_of.back()[1].get()},
        OptimizerOptions{}, o);
    for (int64_t step = 0; step < 3; ++step) {
      batchOf(data, step * o.batch, o.batch, x, y);
      EXPECT_TRUE(std::isfinite(t->step(x.data(), y.data(), o.batch)));
    }
    return t;
  };
  // ZeRO 1: each parameter stepped on its owner's device and sent to the other
  // (downloaded, broadcast, uploaded), so the two hold the same bits, near the above.
  const auto zero = sharded(1);
  expectSameWeights(zero->model(0), zero->model(1), "ZeRO 1 across a CPU and an OpenCL replica");
  for (size_t p = 0; p < dp.model(0).params().size(); ++p) {
    const std::vector<float> a = toHost(dp.model(0).params()[p]->value);
    const std::vector<float> b = toHost(zero->model(1).params()[p]->value);
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_NEAR(a[i], b[i], 1e-5f * (1 + std::abs(a[i]))) << zero->model(0).params()[p]->name;
  }
  EXPECT_GT(zero->stateBytes(1), 0) << "the OpenCL replica holds a shard";
  // ZeRO 2: the gradients reduced into their owners through the host copies, each
  // replica's own rows' sums uploaded back; ZeRO 3: each layer's values gathered through
  // the host before its forward and backward. The same bits as ZeRO 1's.
  const auto two = sharded(2);
  EXPECT_LT(two->gradientBytes(1), zero->gradientBytes(1)) << "the OpenCL replica's shard only";
  const auto three = sharded(3);
  EXPECT_LT(three->parameterBytes(1), zero->parameterBytes(1)) << "the OpenCL replica's only";
  for (size_t r = 0; r < 2; ++r) {
    expectSameWeights(two->model(r), zero->model(r),
                      "ZeRO 2 against 1, replica " + std::to_string(r));
    expectSameWeights(three->model(r), zero->model(r),
                      "ZeRO 3 against 1, replica " + std::to_string(r));
  }
}

// A batch smaller than the replicas: the idle replica adds zeros and keeps up.
TEST(DataParallelTest, AReplicaWithoutSamplesKeepsInStep) {
  const Dataset data = testing::quadrants(20, 1);
  DataParallelOptions o;
  o.batch = 2;
  Replicas dp = makeReplicas(kNoDropout, 3, o, OptimizerOptions{});
  std::vector<float> x;
  std::vector<int32_t> y;
  batchOf(data, 0, 2, x, y);
  dp.trainer->step(x.data(), y.data(), 2);
  const EpochReport r = dp.trainer->trainEpoch(data, 0, {});
  EXPECT_GT(r.samples_per_s, 0);
  expectSameWeights(dp.trainer->model(0), dp.trainer->model(2), "replicas 0 and 2");
  // Sharded, the idle replica still takes part in every reduce and gather, its share of
  // the rows stepped as the plain replicas step them.
  for (const int stage : {1, 2, 3}) {
    DataParallelOptions z = o;
    z.zero = stage;
    Replicas sharded = makeReplicas(kNoDropout, 3, z, OptimizerOptions{});
    sharded.trainer->step(x.data(), y.data(), 2);
    sharded.trainer->trainEpoch(data, 0, {});
    for (size_t k = 0; k < 3; ++k)
      expectSameWeights(sharded.trainer->model(k), dp.trainer->model(0),
                        "ZeRO " + std::to_string(stage) + ", replica " + std::to_string(k));
  }
  // Wrong wiring is refused up front.
  std::vector<std::unique_ptr<Group>> groups = transport::makeLocalGroup(2);
  cpu::CpuBackend a, b;
  expectThrowWith<InvalidArgument>(
      [&] {
        DataParallelTrainer bad(parseModelSpec(kNoDropout), {&a, &b},
                                {groups[1].get(), groups[0].get()}, OptimizerOptions{}, o);
      },
      {"replica 0 was given rank 1 of 2"});
}

// ZeRO stages 1 to 3: each parameter's optimizer state (stage 2: and its summed gradient;
// 3: and its values) on its owner alone, which steps it (and at stages 1 and 2 broadcasts
// it; at 3 each layer is gathered before use). The weights after several steps are
// bitwise those of plain replicas, and the state, merged from the replicas' shards,
// bitwise theirs; each replica holds exactly the state of the parameters it owns, and
// between steps exactly its rows' gradients (stage 2 on) and values (stage 3) — for AdamW
// and SGD with momentum, 2 and 3 replicas, equal and unequal room for the state.
TEST(DataParallelTest, ZeroStagesShardTheStateAndTrainBitwiseAsPlainReplicas) {
  const Dataset data = testing::quadrants(200, 3);
  for (const int stage : {1, 2, 3})
    for (const char* kind : {"adamw", "sgd"})
      for (size_t replicas : {size_t{2}, size_t{3}})
        for (const bool unequal : {false, true}) {
          SCOPED_TRACE("ZeRO " + std::to_string(stage) + ", " + kind + ", " +
                       std::to_string(replicas) + " replicas" + (unequal ? ", unequal room" : ""));
          DataParallelOptions o;
          o.batch = 30;
          o.seed = 5;
          o.bucket_bytes = 512;
          OptimizerOptions opt;
          opt.kind = kind;
          opt.lr = 0.02f;
          opt.weight_decay = 0.01f;
          Replicas plain = makeReplicas(testing::kTinyNet, replicas, o, opt);
          o.zero = stage;
          if (unequal)
            o.state_shares =
                replicas == 2 ? std::vector<double>{3, 1} : std::vector<double>{1, 2, 1};
          Replicas sharded = makeReplicas(testing::kTinyNet, replicas, o, opt);
          std::vector<float> x;
          std::vector<int32_t> y;
          for (int64_t step = 0; step < 3; ++step) {
            batchOf(data, step * o.batch, o.batch, x, y);
            EXPECT_EQ(plain.trainer->step(x.data(), y.data(), o.batch),
                      sharded.trainer->step(x.data(), y.data(), o.batch));
          }
          for (size_t r = 0; r < replicas; ++r)
            expectSameWeights(sharded.trainer->model(r), plain.trainer->model(0),
                              "replica " + std::to_string(r));
          // The merged shards are the plain replicas' state; each shard is its owner's.
          const auto want = plain.trainer->optimizer(0).state();
          std::map<std::string, std::vector<float>> merged;
          for (const auto& [name, t] : sharded.trainer->mergedOptimizer()->state())
            merged[name] = toHost(t);
          ASSERT_EQ(merged.size(), want.size());
          for (const auto& [name, t] : want) EXPECT_TRUE(merged.at(name) == toHost(t)) << name;
          // The shards tile every parameter's rows; each replica holds the state of its own
          // shards' parameters, its bytes within a row of its share of all.
          const std::vector<Param*> params = sharded.trainer->model(0).params();
          std::vector<int64_t> covered(params.size(), 0);
          std::vector<std::set<std::string>> owned(replicas);
          int64_t widest = 0;
          for (const StateShard& sh : sharded.trainer->shards()) {
            ASSERT_LT(sh.param, params.size());
            EXPECT_EQ(sh.begin, covered[sh.param]) << params[sh.param]->name;
            covered[sh.param] = sh.end;
            owned[static_cast<size_t>(sh.owner)].insert(params[sh.param]->name);
            const Shape& shape = params[sh.param]->value.shape();
            widest = std::max(widest, static_cast<int64_t>(params[sh.param]->value.bytes()) /
                                          (shape.rank() ? shape[0] : 1));
          }
          for (size_t i = 0; i < params.size(); ++i)
            EXPECT_EQ(covered[i], params[i]->value.shape()[0]) << params[i]->name;
          const int64_t total = plain.trainer->stateBytes(0);
          const int64_t slots = std::string(kind) == "adamw" ? 2 : 1;
          double room = 0;
          for (size_t r = 0; r < replicas; ++r) room += unequal ? o.state_shares[r] : 1.0;
          int64_t sum = 0;
          for (size_t r = 0; r < replicas; ++r) {
            std::set<std::string> held;
            for (const auto& [name, t] : sharded.trainer->optimizer(r).state())
              held.insert(name.substr(0, name.rfind('.')));
            EXPECT_EQ(held, owned[r]) << "replica " << r;
            const int64_t bytes = sharded.trainer->stateBytes(r);
            const double want =
                static_cast<double>(total) * (unequal ? o.state_shares[r] : 1.0) / room;
            EXPECT_LE(std::abs(static_cast<double>(bytes) - want),
                      static_cast<double>(slots * widest))
                << "replica " << r << " holds " << bytes << " of " << total;
            sum += bytes;
          }
          EXPECT_EQ(sum, total);
          EXPECT_EQ(sharded.trainer->mergedOptimizer()->steps(), 3);
          // Between steps a replica keeps gradients (values): plain, every one; stage 2 (3)
          // on, its own rows' (whole parameters' and parts') only, the replicas' together
          // one model's.
          const int64_t grads = plain.trainer->gradientBytes(0);
          const int64_t values = plain.trainer->parameterBytes(0);
          EXPECT_EQ(grads, values) << "every parameter of the tiny net trains";
          int64_t held = 0, held_values = 0;
          for (size_t r = 0; r < replicas; ++r) {
            int64_t mine = 0;
            for (const StateShard& sh : sharded.trainer->shards())
              if (sh.owner == static_cast<int>(r))
                mine += static_cast<int64_t>(shardRows(params, sh).value.bytes());
            const int64_t bytes = sharded.trainer->gradientBytes(r);
            EXPECT_EQ(bytes, stage >= 2 ? mine : grads) << "replica " << r;
            EXPECT_EQ(sharded.trainer->parameterBytes(r), stage == 3 ? mine : values)
                << "replica " << r;
            held += bytes;
            held_values += sharded.trainer->parameterBytes(r);
          }
          if (stage >= 2) {
            EXPECT_EQ(held, grads);
          }
          if (stage == 3) {
            EXPECT_EQ(held_values, values);
          }
        }
}

// ZeRO 2 and 3's memory: layer by layer, a replica holds its own rows' gradient sums (and
// at stage 3 values) and, for the layer it computes, that layer's whole until it is done,
// so its most at once is about 1/N of the model's plus a layer's; a plain replica holds
// all of them all the time. The CPU backend's own count of live bytes agrees. Six 96-wide
// layers over 2 and 3 replicas.
TEST(DataParallelTest, ZeroStagesTwoAndThreeHoldTheirShardsAndOneLayerMore) {
  std::string spec = "name: deep\ninput: [96]\nlayers:\n";
  for (int l = 0; l < 6; ++l) spec += "  - linear: {out: 96}\n  - relu\n";
  spec += "  - linear: {out: 4}\n";
  std::vector<float> x(96 * 24);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) / 17.0f - 0.5f;
  std::vector<int32_t> y(24);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int32_t>(i % 4);
  for (const int stage : {2, 3})
    for (size_t replicas : {size_t{2}, size_t{3}}) {
      SCOPED_TRACE("ZeRO " + std::to_string(stage) + ", " + std::to_string(replicas) + " replicas");
      DataParallelOptions o;
      o.batch = 24;
      OptimizerOptions opt;
      opt.kind = "sgd";
      opt.momentum = 0;  // (no optimizer state: the bytes below are values and gradients)
      Replicas plain = makeReplicas(spec, replicas, o, opt);
      o.zero = stage;
      Replicas sharded = makeReplicas(spec, replicas, o, opt);
      const int64_t layer = (96 * 96 + 96) * 4;  // the largest layer's bytes
      for (int step = 0; step < 2; ++step) {
        plain.trainer->step(x.data(), y.data(), o.batch);
        sharded.trainer->step(x.data(), y.data(), o.batch);
      }
      const int64_t grads = plain.trainer->gradientBytes(0);
      const int64_t values = plain.trainer->parameterBytes(0);
      EXPECT_EQ(plain.trainer->peakGradientBytes(0), grads);
      const auto n = static_cast<int64_t>(replicas);
      for (size_t r = 0; r < replicas; ++r) {
        const int64_t peak = sharded.trainer->peakGradientBytes(r);
        EXPECT_LE(peak, grads / n + 2 * layer) << "replica " << r;
        EXPECT_LT(peak, grads) << "replica " << r;
        const int64_t peak_values = sharded.trainer->peakParameterBytes(r);
        if (stage == 3) {
          EXPECT_LE(peak_values, values / n + 2 * layer) << "replica " << r;
          EXPECT_LT(peak_values, values) << "replica " << r;
        } else {
          EXPECT_EQ(peak_values, values) << "replica " << r;
        }
      }
      // What the backends hold once the steps are done: the sharded replica less the
      // gradients (and values) it gave up. The CPU backend counts each buffer at its
      // block's size, a cached block up to twice the request, so what the replica holds
      // may count up to twice: the fall is at least what it gave up less what it holds.
      for (size_t r = 0; r < replicas; ++r) {
        const int64_t held = sharded.trainer->gradientBytes(r) + sharded.trainer->parameterBytes(r);
        const int64_t given_up = grads + values - held;
        const int64_t fell =
            plain.backends[r]->memoryUse().live - sharded.backends[r]->memoryUse().live;
        EXPECT_GE(fell, given_up - held)
            << "replica " << r << ": " << fell << " bytes fewer, " << given_up << " given up";
        EXPECT_GT(fell, 0) << "replica " << r;
      }
      expectSameWeights(sharded.trainer->model(0), plain.trainer->model(0), "sharded");
    }
}

// The rows cut into one run per replica, each run as near its share of the bytes as whole
// rows allow, a run's pieces in parameter order.
TEST(DataParallelTest, StateShardsCutTheRowsByEachReplicasRoom) {
  using S = StateShard;
  // 3 parameters of 4, 2 and 2 rows of 10 bytes (80 in all): 40 each, cut inside the first.
  EXPECT_EQ(stateShards({4, 2, 2}, {10, 10, 10}, 2, {}),
            (std::vector<S>{{0, 0, 4, 0}, {1, 0, 2, 1}, {2, 0, 2, 1}}));
  EXPECT_EQ(stateShards({8}, {10}, 2, {}), (std::vector<S>{{0, 0, 4, 0}, {0, 4, 8, 1}}));
  EXPECT_EQ(stateShards({8}, {10}, 2, {3, 1}), (std::vector<S>{{0, 0, 6, 0}, {0, 6, 8, 1}}));
  EXPECT_EQ(stateShards({9}, {1}, 3, {}),
            (std::vector<S>{{0, 0, 3, 0}, {0, 3, 6, 1}, {0, 6, 9, 2}}));
  // A run ending on a parameter's end; a parameter without state (no bytes) is left out.
  EXPECT_EQ(stateShards({2, 1, 2}, {10, 0, 10}, 2, {}),
            (std::vector<S>{{0, 0, 2, 0}, {2, 0, 2, 1}}));
  // More replicas than rows: some hold nothing.
  EXPECT_EQ(stateShards({1}, {4}, 3, {}), (std::vector<S>{{0, 0, 1, 1}}));
  EXPECT_EQ(stateShards({}, {}, 2, {}), std::vector<S>{});
  expectThrowWith<InvalidArgument>(
      [] {
        stateShards({1}, {4}, 2, {1, 0});
      },
      {"state share 0 is not a positive number"});
  expectThrowWith<InvalidArgument>([] { stateShards({1}, {4}, 2, {1}); },
                                   {"1 state shares for 2 replicas"});
  // A stage not implemented, or sharding without replicas to share with, is refused up front.
  DataParallelOptions o;
  o.batch = 4;
  o.zero = 4;
  expectThrowWith<InvalidArgument>(
      [&] { makeReplicas(kNoDropout, 2, o, OptimizerOptions{}); },
      {"ZeRO stage 4", "0 (every replica keeps", "3 (and of the parameters)"});
  o.zero = 1;
  expectThrowWith<InvalidArgument>([&] { makeReplicas(kNoDropout, 1, o, OptimizerOptions{}); },
                                   {"ZeRO stage 1 shards the optimizer state", "not 1"});
}

}  // namespace
}  // namespace tandem
