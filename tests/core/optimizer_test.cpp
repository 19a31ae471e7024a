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

}  // namespace
}  // namespace tandem
