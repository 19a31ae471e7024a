// Model files: a round trip keeps weights and optimizer state bitwise; truncated,
// corrupted and random inputs give FormatError naming the defect, never a crash.
#include "core/model_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/file.h"
#include "core/model_spec.h"
#include "core/train/trainer.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::expectThrowWith;

class ModelFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = std::make_unique<Model>(
        loadModelSpec(TANDEM_SOURCE_DIR "/examples/models/resnet-mini.yaml"));
    model_->build(be_, 5);
    OptimizerOptions o;
    o.kind = "adamw";
    o.lr = 1e-3f;
    o.lr_schedule = "cosine";  // the schedule travels with the state
    o.warmup_steps = 3;
    o.decay_steps = 7;
    o.min_lr = 1e-4f;
    opt_ = std::make_unique<Optimizer>(be_, o);
    // Two real steps so the optimizer has state.
    Trainer t(*model_, *opt_, TrainOptions{4, 1, false});
    const auto x = testing::randomVector(1, 4 * 784);
    const std::vector<int32_t> y = {1, 2, 3, 4};
    t.step(x.data(), y.data(), 4);
    t.step(x.data(), y.data(), 4);
    bytes_ = serializeModel(*model_, opt_.get(), {{"note", std::string("test")}, {"acc", 0.5}});
  }

  cpu::CpuBackend be_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> opt_;
  std::vector<uint8_t> bytes_;
};

TEST_F(ModelFileTest, RoundTripKeepsWeightsOptimizerStateAndMetadata) {
  const ModelFile f = parseModelFile(bytes_, "mem");
  EXPECT_EQ(f.spec.name, "resnet-mini");
  EXPECT_EQ(std::get<std::string>(f.metadata.at("note")), "test");
  EXPECT_EQ(std::get<double>(f.metadata.at("acc")), 0.5);
  auto loaded = loadModel(f, be_);
  ASSERT_EQ(loaded->params().size(), model_->params().size());
  for (size_t i = 0; i < model_->params().size(); ++i) {
    EXPECT_EQ(loaded->params()[i]->name, model_->params()[i]->name);
    EXPECT_EQ(toHost(loaded->params()[i]->value), toHost(model_->params()[i]->value));
  }
  auto opt = loadOptimizer(f, be_);
  EXPECT_EQ(opt->steps(), 2);
  EXPECT_EQ(opt->options().kind, "adamw");
  EXPECT_TRUE(opt->options() == opt_->options());  // the schedule too
  const auto a = opt_->state(), b = opt->state();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(toHost(a[i].second), toHost(b[i].second));
  }
  // The re-serialised model is the same bytes: nothing was lost or reordered.
  EXPECT_EQ(serializeModel(*loaded, opt.get(), f.metadata), bytes_);
}

TEST_F(ModelFileTest, SaveIsAtomicAndReadable) {
  const std::string path = ::testing::TempDir() + "/model_file_test.tdm";
  saveModel(path, *model_, nullptr);
  const ModelFile f = readModelFile(path);
  EXPECT_FALSE(f.optimizer.has_value());
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());
  std::remove(path.c_str());
  EXPECT_THROW(saveModel("/nonexistent-dir/x.tdm", *model_, nullptr), IoError);
  EXPECT_THROW(readModelFile("/nonexistent-dir/x.tdm"), IoError);
}

TEST_F(ModelFileTest, EveryTruncationIsAFormatError) {
  for (size_t len = 0; len < bytes_.size(); len += std::max<size_t>(1, bytes_.size() / 997)) {
    std::vector<uint8_t> cut(bytes_.begin(), bytes_.begin() + static_cast<std::ptrdiff_t>(len));
    EXPECT_THROW(parseModelFile(cut, "cut"), FormatError) << len;
  }
}

TEST_F(ModelFileTest, CorruptedBytesNeverCrash) {
  // Flipping bytes either fails verification/validation (FormatError) or still decodes to
  // a consistent file; loading the survivors must not crash either.
  Rng rng(3);
  int rejected = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<uint8_t> bad = bytes_;
    for (int k = 0; k < 4; ++k)
      bad[rng.below(bad.size())] ^= static_cast<uint8_t>(1 + rng.below(255));
    try {
      const ModelFile f = parseModelFile(bad, "flipped");
      auto m = loadModel(f, be_);
    } catch (const FormatError&) {
      ++rejected;
    } catch (const InvalidArgument&) {
      ++rejected;  // decoded, but describes an impossible model: named by the layer checks
    }
  }
  EXPECT_GT(rejected, 0);
}

TEST_F(ModelFileTest, RandomBytesAreRejected) {
  Rng rng(4);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint8_t> junk(1 + rng.below(4096));
    for (auto& b : junk) b = static_cast<uint8_t>(rng.below(256));
    if (trial % 2 && junk.size() >= 8)
      std::copy_n("TDM1", 4, junk.begin() + 4);  // pass the identifier check
    EXPECT_THROW(parseModelFile(junk, "junk"), FormatError);
  }
  expectThrowWith<FormatError>([] { parseModelFile(std::vector<uint8_t>(100, 0), "zeros"); },
                               {"'zeros'", "TDM1"});
}

TEST_F(ModelFileTest, WeightsThatDoNotFitTheModelAreNamed) {
  ModelFile f = parseModelFile(bytes_, "mem");
  f.params[0].shape = Shape{1, 2};
  expectThrowWith<FormatError>([&] { loadModel(f, be_); }, {"parameter '0.weight'", "[1, 2]"});
  f = parseModelFile(bytes_, "mem");
  f.params.pop_back();
  expectThrowWith<FormatError>([&] { loadModel(f, be_); }, {"lacks parameter"});
  f = parseModelFile(bytes_, "mem");
  f.params.push_back(f.params[0]);
  expectThrowWith<FormatError>([&] { loadModel(f, be_); }, {"twice"});
  f = parseModelFile(bytes_, "mem");
  f.spec.layers[0].type = "bogus";
  expectThrowWith<FormatError>([&] { loadModel(f, be_); }, {"invalid model", "bogus"});
}

// An importer's path (serializeModelFile, writeModelFile: parameters filled in place, the
// model never built) writes bitwise the bytes of the model built and loaded with them.
TEST_F(ModelFileTest, FilledParametersWriteTheBytesOfTheBuiltModel) {
  const std::map<std::string, AttrValue> meta = {{"note", std::string("filled")}};
  std::vector<ParamFill> fills;
  for (const Param* p : model_->params())
    fills.push_back(
        {p->name,
         p->value.shape(),
         [p](std::span<float> out) { p->value.backend().download(p->value, out.data()); },
         {}});
  const std::vector<uint8_t> built = serializeModel(*model_, nullptr, meta);
  EXPECT_EQ(serializeModelFile(model_->spec(), fills, meta), built);
  const std::string path = ::testing::TempDir() + "/filled.tdm";
  writeModelFile(path, model_->spec(), fills, meta);
  EXPECT_EQ(readFile(path, "model file"), std::string(built.begin(), built.end()));
  std::remove(path.c_str());

  // A parameter short, or a spec that makes no model, is refused before anything is written.
  std::vector<ParamFill> short_one(fills.begin(), fills.end() - 1);
  expectThrowWith<InvalidArgument>(
      [&] { writeModelFile(path, model_->spec(), short_one, meta); },
      {"model 'resnet-mini'", std::to_string(short_one.size()) + " parameters",
       "its layers hold " + std::to_string(model_->paramCount())});
  ModelSpec bogus = model_->spec();
  bogus.layers[0].type = "bogus";
  expectThrowWith<InvalidArgument>([&] { writeModelFile(path, bogus, fills, meta); }, {"bogus"});
  EXPECT_FALSE(std::ifstream(path).good());
}

// A parameter with extents is copied into the file from them (copy_file_range) and its fill
// never asked: fills that write zeros beside extents that hold the values still give the
// built model's bytes; extents of the wrong size are refused naming the parameter.
TEST_F(ModelFileTest, ParametersWithExtentsAreCopiedFromTheirFiles) {
  const std::string dir = testing::freshDir("model_file_extents");
  std::vector<uint8_t> store(3, 0xAB);  // the values start at an odd offset
  std::vector<ParamFill> fills;
  std::vector<std::pair<uint64_t, uint64_t>> where;
  for (const Param* p : model_->params()) {
    std::vector<float> v(static_cast<size_t>(p->value.numel()));
    p->value.backend().download(p->value, v.data());
    where.emplace_back(store.size(), v.size() * sizeof(float));
    const auto* b = reinterpret_cast<const uint8_t*>(v.data());
    store.insert(store.end(), b, b + v.size() * sizeof(float));
  }
  writeFileAtomically(dir + "/store.bin", store, "test file");
  const int fd = ::open((dir + "/store.bin").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  size_t i = 0;
  for (const Param* p : model_->params()) {
    // Every other parameter from its extents, split in two where it has two values or more.
    std::vector<FileExtent> extents;
    const auto [at, bytes] = where[i];
    if (i++ % 2 == 0) {
      const uint64_t half = bytes / 8 * 4;
      extents = {{fd, at, half}, {fd, at + half, bytes - half}};
    }
    const bool copied = !extents.empty();
    fills.push_back({p->name, p->value.shape(),
                     [p, copied](std::span<float> out) {
                       if (copied)
                         std::fill(out.begin(), out.end(), 0.0f);
                       else
                         p->value.backend().download(p->value, out.data());
                     },
                     std::move(extents)});
  }
  const std::vector<uint8_t> built = serializeModel(*model_, nullptr, {});
  const std::string path = dir + "/copied.tdm";
  writeModelFile(path, model_->spec(), fills, {});
  EXPECT_EQ(readFile(path, "model file"), std::string(built.begin(), built.end()));
  EXPECT_NE(serializeModelFile(model_->spec(), fills, {}), built) << "it asks the fills";

  fills[0].extents.back().bytes += 4;
  expectThrowWith<InvalidArgument>(
      [&] { writeModelFile(dir + "/wrong.tdm", model_->spec(), fills, {}); },
      {"parameter '" + fills[0].name + "'", "extents hold"});
  EXPECT_FALSE(std::ifstream(dir + "/wrong.tdm").good());
  ::close(fd);
}

// A pipeline stage's part of a file: only its layers' parameters and their optimizer state,
// the spec, metadata and optimizer settings whole; a stage built over those layers loads it,
// and the parts of a split hold every tensor once.
TEST_F(ModelFileTest, AStagesSliceHoldsOnlyItsLayersTensors) {
  const ModelFile whole = parseModelFile(bytes_, "mem");
  const size_t cut = 3;
  const std::vector<std::vector<LayerRange>> parts = {{{0, cut}}, {{cut, model_->size()}}};
  std::map<std::string, std::vector<float>> seen;
  for (const std::vector<LayerRange>& ranges : parts) {
    const std::vector<uint8_t> bytes = sliceModelFile(bytes_, ranges, "mem");
    const ModelFile part = parseModelFile(bytes, "slice");
    EXPECT_EQ(modelSpecYaml(part.spec), modelSpecYaml(whole.spec));
    EXPECT_EQ(part.metadata, whole.metadata);
    ASSERT_TRUE(part.optimizer.has_value());
    EXPECT_EQ(part.optimizer->steps, whole.optimizer->steps);
    EXPECT_EQ(part.optimizer->options.kind, "adamw");
    EXPECT_FALSE(part.params.empty());
    for (const HostTensor& t : part.params) {
      const size_t layer = std::stoul(t.name.substr(0, t.name.find('.')));
      EXPECT_TRUE(layer >= ranges[0].begin && layer < ranges[0].end) << t.name;
      EXPECT_TRUE(seen.emplace(t.name, t.data).second) << t.name;
    }
    for (const HostTensor& t : part.optimizer->tensors) {
      const size_t layer = std::stoul(t.name.substr(0, t.name.find('.')));
      EXPECT_TRUE(layer >= ranges[0].begin && layer < ranges[0].end) << t.name;
    }
    Model stage(part.spec);
    stage.build(be_, 9, ranges);
    loadWeights(stage, part, false);
    Optimizer opt(be_, part.optimizer->options);
    restoreOptimizerState(opt, stage, part, "stage");
    for (const Param* p : stage.params()) {
      std::vector<float> v(static_cast<size_t>(p->value.numel()));
      be_.download(p->value, v.data());
      EXPECT_EQ(v, seen.at(p->name)) << p->name;
    }
  }
  ASSERT_EQ(seen.size(), whole.params.size());
  for (const HostTensor& t : whole.params) EXPECT_EQ(seen.at(t.name), t.data) << t.name;
}

}  // namespace
}  // namespace tandem
