// Checkpoint manifests (runtime/job/checkpoint.h): the replicas' shares they carry come
// back as the very doubles written, and a manifest whose shares are wrong is passed over.
#include "runtime/job/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"
#include "tests/test_util.h"

namespace tandem::runtime {
namespace {

const std::vector<uint8_t> kModel = {1, 2, 3, 4, 5};

std::string slurp(const std::string& path) { return readFile(path, "test file"); }

CheckpointJob someJob() { return {std::string(64, 'a'), 32, 4, 640, 3, "quadrants", "sgd"}; }

TEST(CheckpointTest, TheReplicasSharesComeBackAsTheSameDoubles) {
  const std::string dir = testing::freshDir("ck-shares");
  // Doubles with no short decimal form: the manifest must keep every bit.
  const CheckpointShares replicas{{"edge", "cloud", "cloud"}, {0.1 + 0.2, 1.0 / 3, 2.0 / 7}};
  writeCheckpoint(dir, 6, kModel, someJob(), 2, replicas);
  std::optional<Checkpoint> c = newestCheckpoint(dir);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->step, 6);
  EXPECT_EQ(c->model, kModel);
  EXPECT_EQ(c->job, someJob());
  EXPECT_EQ(c->replicas, replicas);
  // Without shares the manifest has no such field, and reads back empty (as one written
  // before the field existed).
  writeCheckpoint(dir, 9, kModel, someJob(), 2);
  const nlohmann::json m = nlohmann::json::parse(slurp(dir + "/step-000000000009.json"));
  EXPECT_FALSE(m.contains("replicas")) << m.dump();
  c = newestCheckpoint(dir);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->step, 9);
  EXPECT_TRUE(c->replicas.shares.empty() && c->replicas.nodes.empty());
}

TEST(CheckpointTest, SharesThatDoNotFitTheirReplicasAreNotWritten) {
  const std::string dir = testing::freshDir("ck-bad-shares");
  const CheckpointShares bad[] = {{{"a", "b"}, {0.5}},
                                  {{"a"}, {1.0}},
                                  {{"a", ""}, {0.5, 0.5}},
                                  {{"a", "b"}, {0.5, -1}},
                                  {{"a", "b"}, {0.5, std::nan("")}}};
  for (const CheckpointShares& r : bad)
    EXPECT_THROW(writeCheckpoint(dir, 3, kModel, someJob(), 2, r), InvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-000000000003.json"));
}

// A manifest whose replicas' shares are damaged is passed over, naming what is wrong, and
// the checkpoint before it is used.
TEST(CheckpointTest, AManifestWithDamagedSharesIsPassedOver) {
  const std::string dir = testing::freshDir("ck-damaged-shares");
  const CheckpointShares replicas{{"a", "b"}, {0.75, 0.25}};
  writeCheckpoint(dir, 3, kModel, someJob(), 5, replicas);
  const std::string newest = dir + "/step-000000000006.json";
  const std::pair<const char*, const char*> damage[] = {
      {R"({"nodes": ["a", "b"], "shares": [0.75, -0.25]})", "replica 1's share is not in"},
      {R"({"nodes": ["a"], "shares": [0.75, 0.25]})", "name 1 nodes for 2 shares"},
      {R"({"nodes": ["a", "b"], "shares": "0.75"})", "lacks a field or has one of the wrong"},
      {R"({"shares": [0.75, 0.25]})", "lacks a field or has one of the wrong"}};
  for (const auto& [field, expect] : damage) {
    writeCheckpoint(dir, 6, kModel, someJob(), 5, replicas);
    nlohmann::json m = nlohmann::json::parse(slurp(newest));
    m["replicas"] = nlohmann::json::parse(field);
    std::ofstream(newest) << m.dump();
    ::testing::internal::CaptureStdout();  // (spdlog's default logger writes there)
    const std::optional<Checkpoint> c = newestCheckpoint(dir);
    const std::string log = ::testing::internal::GetCapturedStdout();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->step, 3) << field;
    EXPECT_EQ(c->replicas, replicas);
    EXPECT_NE(log.find("checkpoint at step 6"), std::string::npos) << log;
    EXPECT_NE(log.find(expect), std::string::npos) << expect << "\n" << log;
  }
}

}  // namespace
}  // namespace tandem::runtime
