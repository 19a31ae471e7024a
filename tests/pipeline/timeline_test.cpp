// Timeline output: the Chrome trace holds every span as a complete event on its stage's
// row with times from the earliest span; the SVG draws the compute spans in its window.
#include "core/pipeline/timeline.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace tandem {
namespace {

std::vector<StageSpans> sample() {
  using A = ActionType;
  return {{0,
           {{A::kForward, 0, 10.0, 10.002},
            {A::kSendActivation, 0, 10.002, 10.0021},
            {A::kBackward, 0, 10.010, 10.013},
            {A::kStep, 0, 10.013, 10.014}}},
          {1,
           {{A::kRecvActivation, 0, 10.0, 10.003},
            {A::kForward, 0, 10.003, 10.005},
            {A::kBackward, 0, 10.005, 10.009},
            {A::kStep, 0, 10.009, 10.010}}}};
}

TEST(TimelineTest, ChromeTraceHasEverySpanOnItsStage) {
  const auto trace = nlohmann::json::parse(chromeTrace(sample()));
  const auto& events = trace.at("traceEvents");
  int complete = 0;
  for (const auto& e : events) {
    if (e.at("ph") == "M") {
      EXPECT_EQ(e.at("args").at("name"), "stage " + std::to_string(e.at("tid").get<int>()));
      continue;
    }
    ++complete;
    EXPECT_EQ(e.at("ph"), "X");
    EXPECT_GE(e.at("ts").get<double>(), 0.0);
  }
  EXPECT_EQ(complete, 8);
  // The first stage's backward: 10 ms after the earliest span, 3 ms long.
  bool found = false;
  for (const auto& e : events)
    if (e.value("name", "") == "backward 0" && e.at("tid") == 0) {
      EXPECT_NEAR(e.at("ts").get<double>(), 10000.0, 1e-3);
      EXPECT_NEAR(e.at("dur").get<double>(), 3000.0, 1e-3);
      found = true;
    }
  EXPECT_TRUE(found);
}

TEST(TimelineTest, SvgDrawsTheComputeSpansInItsWindow) {
  const std::string all = timelineSvg(sample(), 10.0, 10.014);
  auto count = [](const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count(all, "<title>"), 6u);  // 2 forwards, 2 backwards, 2 steps; no transfers
  EXPECT_EQ(count(all, "fill=\"#4e79a7\""), 2u);
  EXPECT_EQ(count(all, ">stage 1<"), 1u);
  const std::string early = timelineSvg(sample(), 10.0, 10.004);  // only the forwards
  EXPECT_EQ(count(early, "<title>"), 2u);
}

}  // namespace
}  // namespace tandem
