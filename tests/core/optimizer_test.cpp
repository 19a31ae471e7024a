#include "core/optimizer.h"

#include <gtest/gtest.h>

#include <limits>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

Param param(Backend& be, const std::string& name, const std::vector<float>& v,
            const std::vector<float>& g) {
  Param p = makeParam(be, name, {static_cast<int64_t>(v.size())}, v);
  be.upload(p.grad, g.data());
  return p;
}

TEST(OptimizerTest, PlainSgdIsGradientDescent) {
  cpu::CpuBackend be;
  OptimizerOptions o;
  o.momentum = 0.0f;
  o.lr = 0.5f;
  Optimizer opt(be, o);
  Param p = param(be, "w", {1, 2, 3}, {2, -2, 0});
  opt.step({&p});
  EXPECT_EQ(toHost(p.value), (std::vector<float>{0, 3, 3}));
  EXPECT_TRUE(opt.state().empty());  // no momentum, no state
}

TEST(OptimizerTest, MomentumStateSavedAndRestoredContinuesIdentically) {
  cpu::CpuBackend be;
  for (const char* kind : {"sgd", "adamw"}) {
    OptimizerOptions o;
    o.kind = kind;
    Optimizer a(be, o);
    Param pa = param(be, "w", {1, -1, 0.5f}, {0.3f, -0.2f, 0.1f});
    a.step({&pa});
    // Snapshot, restore into a fresh optimizer, and take one more step with both.
    Optimizer b(be, o);
    std::vector<std::pair<std::string, Tensor>> copy;
    for (auto& [name, t] : a.state()) copy.emplace_back(name, toDevice(be, t.shape(), toHost(t)));
    b.restore(copy, a.steps());
    Param pb = param(be, "w", toHost(pa.value), {0.3f, -0.2f, 0.1f});
    a.step({&pa});
    b.step({&pb});
    EXPECT_EQ(toHost(pa.value), toHost(pb.value)) << kind;
  }
}

TEST(OptimizerTest, BadOptionsAreNamed) {
  cpu::CpuBackend be;
  OptimizerOptions o;
  o.kind = "rmsprop";
  testing::expectThrowWith<InvalidArgument>([&] { Optimizer(be, o); }, {"'rmsprop'", "sgd, adamw"});
  o = {};
  o.lr = -1;
  testing::expectThrowWith<InvalidArgument>([&] { Optimizer(be, o); }, {"learning rate -1"});
  o.lr = std::numeric_limits<float>::infinity();  // every step would make the weights nan
  testing::expectThrowWith<InvalidArgument>([&] { Optimizer(be, o); }, {"learning rate inf"});
  o = {};
  o.weight_decay = std::numeric_limits<float>::quiet_NaN();
  testing::expectThrowWith<InvalidArgument>([&] { Optimizer(be, o); }, {"weight decay nan"});
  o = {};
  o.kind = "adamw";
  o.eps = std::numeric_limits<float>::infinity();
  testing::expectThrowWith<InvalidArgument>([&] { Optimizer(be, o); }, {"adamw eps"});
  o = {};
  o.momentum = 1.5f;
  EXPECT_THROW(Optimizer(be, o), InvalidArgument);
  o = {};
  Optimizer opt(be, o);
  EXPECT_THROW(opt.restore({{"w.m", be.zeros({1})}}, 1), FormatError);  // adamw slot in sgd
}

TEST(OptimizerTest, TheLearningRateFollowsItsSchedule) {
  OptimizerOptions o;
  o.lr = 0.4f;
  EXPECT_EQ(learningRate(o, 0), 0.4f);  // constant, no warm-up: the rate itself, exactly
  EXPECT_EQ(learningRate(o, 1000), 0.4f);
  o.warmup_steps = 4;  // 0.1, 0.2, 0.3, 0.4, then the schedule
  for (int64_t s = 0; s < 4; ++s) EXPECT_FLOAT_EQ(learningRate(o, s), 0.1f * float(s + 1)) << s;
  EXPECT_EQ(learningRate(o, 4), 0.4f);
  o.lr_schedule = "step";
  o.decay_steps = 3;
  o.decay_factor = 0.5f;
  EXPECT_EQ(learningRate(o, 4), 0.4f);
  EXPECT_EQ(learningRate(o, 6), 0.4f);
  EXPECT_FLOAT_EQ(learningRate(o, 7), 0.2f);
  EXPECT_FLOAT_EQ(learningRate(o, 10), 0.1f);
  o.lr_schedule = "cosine";
  o.decay_steps = 10;
  o.min_lr = 0.04f;
  EXPECT_EQ(learningRate(o, 4), 0.4f);
  EXPECT_FLOAT_EQ(learningRate(o, 9), 0.22f);  // half way: the mean of lr and min_lr
  EXPECT_FLOAT_EQ(learningRate(o, 14), 0.04f);
  EXPECT_FLOAT_EQ(learningRate(o, 100), 0.04f);
  EXPECT_FLOAT_EQ(linearlyScaledLr(0.1f, 1024, 256), 0.4f);
  EXPECT_THROW(linearlyScaledLr(0.1f, 0, 256), InvalidArgument);
}

TEST(OptimizerTest, EachStepAppliesItsScheduledRate) {
  cpu::CpuBackend be;
  for (const char* kind : {"sgd", "adamw"}) {
    OptimizerOptions o;
    o.kind = kind;
    o.momentum = 0.0f;
    o.weight_decay = 0.0f;
    o.lr = 0.3f;
    o.warmup_steps = 2;
    o.lr_schedule = "step";
    o.decay_steps = 1;
    o.decay_factor = 0.5f;
    Optimizer opt(be, o);
    Param p = param(be, "w", {0}, {1});
    float w = 0;
    for (int s = 0; s < 5; ++s) {
      EXPECT_EQ(opt.currentLr(), learningRate(o, s));
      opt.step({&p});
      // SGD moves by lr x 1; AdamW's first moments of a constant gradient of 1 make its
      // step lr x 1 / (1 + eps) too.
      w -= learningRate(o, s);
      EXPECT_NEAR(toHost(p.value)[0], w, 1e-5) << kind << " step " << s;
    }
  }
}

TEST(OptimizerTest, BadSchedulesAreNamed) {
  cpu::CpuBackend be;
  OptimizerOptions o;
  o.lr_schedule = "linear";
  testing::expectThrowWith<InvalidArgument>([&] { Optimizer(be, o); },
                                            {"lr_schedule 'linear'", "constant, step, cosine"});
  o = {};
  o.lr_schedule = "cosine";
  testing::expectThrowWith<InvalidArgument>([&] { Optimizer(be, o); },
                                            {"cosine needs decay_steps > 0"});
  o = {};
  o.warmup_steps = -1;
  testing::expectThrowWith<InvalidArgument>([&] { Optimizer(be, o); }, {"warmup_steps -1"});
  o = {};
  o.decay_factor = 2;
  testing::expectThrowWith<InvalidArgument>([&] { Optimizer(be, o); }, {"decay_factor 2"});
  o = {};
  o.min_lr = 1;
  testing::expectThrowWith<InvalidArgument>([&] { Optimizer(be, o); }, {"min_lr 1", "[0, lr]"});
}

}  // namespace
}  // namespace tandem
