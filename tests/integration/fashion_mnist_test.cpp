// Real data: the MLP trained on a 10,000-sample subset of Fashion-MNIST for one epoch
// must reach 0.75 test accuracy on 2,000 test samples (chance is 0.10; the full epoch
// reaches about 0.85). Needs Debian's dataset-fashion-mnist, which scripts/setup installs.
#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "backends/opencl/opencl_backend.h"
#include "core/model_spec.h"
#include "core/train/trainer.h"

namespace tandem {
namespace {

TEST(FashionMnistTest, MlpLearnsFarAboveChance) {
  const Dataset train = loadFashionMnist(kFashionMnistDir, true, 10000);
  const Dataset test = loadFashionMnist(kFashionMnistDir, false, 2000);
  ASSERT_EQ(train.size(), 10000);
  cpu::CpuBackend be(cpu::CpuOptions{2});
  Model m(loadModelSpec(TANDEM_SOURCE_DIR "/examples/models/mlp.yaml"));
  m.build(be, 1);
  Optimizer opt(be, OptimizerOptions{});
  Trainer t(m, opt, TrainOptions{64, 1, true});
  const EpochReport r = t.trainEpoch(train, 0, {});
  const EvalResult e = evaluate(m, test, 500);
  RecordProperty("test_accuracy", std::to_string(e.accuracy));
  EXPECT_GE(e.accuracy, 0.75) << "train loss " << r.train_loss;
  EXPECT_LT(r.train_loss, 1.0);
}

// The MLP for one full epoch on the first OpenCL device and on the CPU, same seed: test
// accuracies within 0.5 points (the bar). The devices round differently (GEMM
// blocking), so the runs are close, not equal. Skips without an OpenCL device.
TEST(FashionMnistTest, MlpOnOpenClMatchesTheCpuWithinHalfAPoint) {
  if (opencl::listClDevices().empty())
    GTEST_SKIP() << "no OpenCL device: " << opencl::noDevicesReason();
  const Dataset train = loadFashionMnist(kFashionMnistDir, true);
  const Dataset test = loadFashionMnist(kFashionMnistDir, false);
  auto accuracy = [&](Backend& be) {
    Model m(loadModelSpec(TANDEM_SOURCE_DIR "/examples/models/mlp.yaml"));
    m.build(be, 1);
    Optimizer opt(be, OptimizerOptions{});
    Trainer t(m, opt, TrainOptions{64, 1, true});
    t.trainEpoch(train, 0, {});
    return evaluate(m, test, 500).accuracy;
  };
  cpu::CpuBackend cpu(cpu::CpuOptions{2});
  opencl::OpenClBackend cl;
  const double on_cpu = accuracy(cpu), on_cl = accuracy(cl);
  RecordProperty("cpu_accuracy", std::to_string(on_cpu));
  RecordProperty("opencl_accuracy", std::to_string(on_cl));
  EXPECT_GT(on_cpu, 0.8);
  EXPECT_NEAR(on_cl, on_cpu, 0.005) << "cpu " << on_cpu << ", opencl " << on_cl;
}

}  // namespace
}  // namespace tandem
