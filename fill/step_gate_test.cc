#include "fill/step_gate.h"

#include <random>

#include "gtest/gtest.h"

namespace pswitch::fill {
namespace {

absl::Duration Ms(double ms) { return absl::Milliseconds(ms); }

StepProfile MakeProfile(absl::Duration profiled, StepProfileOptions options = {}) {
  absl::StatusOr<StepProfile> profile = StepProfile::Create(profiled, options);
  EXPECT_TRUE(profile.ok()) << profile.status();
  return *profile;
}

TEST(StepGateTest, StepStartsOnlyWhenRemainingTimeExceedsStepPlusMargin) {
  EXPECT_TRUE(MayStartStep(Ms(10), Ms(8), Ms(1)));
  EXPECT_FALSE(MayStartStep(Ms(9), Ms(8), Ms(1)));  // exactly enough is not enough
  EXPECT_FALSE(MayStartStep(Ms(8.5), Ms(8), Ms(1)));
  EXPECT_TRUE(MayStartStep(Ms(8.5), Ms(8), absl::ZeroDuration()));
  EXPECT_FALSE(MayStartStep(-Ms(1), Ms(8), absl::ZeroDuration()));  // bubble already over
}

TEST(StepGateTest, NegativeMarginCountsAsZero) {
  EXPECT_FALSE(MayStartStep(Ms(8), Ms(8), -Ms(5)));
  EXPECT_TRUE(MayStartStep(absl::Microseconds(8001), Ms(8), -Ms(5)));
}

TEST(StepGateTest, InfiniteBubbleAdmitsFiniteStepsOnly) {
  EXPECT_TRUE(MayStartStep(absl::InfiniteDuration(), Ms(1000), Ms(1)));
  EXPECT_FALSE(MayStartStep(absl::InfiniteDuration(), absl::InfiniteDuration(), Ms(1)));
}

TEST(StepGateTest, TimeOverloadUsesTimeUntilBubbleEnd) {
  const absl::Time end = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(MayStartStep(end - Ms(10), end, Ms(8), Ms(1)));
  EXPECT_FALSE(MayStartStep(end - Ms(9), end, Ms(8), Ms(1)));
}

TEST(StepProfileTest, StartsFromTheProfiledDuration) {
  StepProfile profile = MakeProfile(Ms(20));
  EXPECT_EQ(profile.Predicted(), Ms(20));
  EXPECT_EQ(profile.samples(), 0);
}

TEST(StepProfileTest, SteadyStepsKeepThePrediction) {
  StepProfile profile = MakeProfile(Ms(20));
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(profile.Record(Ms(20)).ok());
  EXPECT_EQ(profile.Predicted(), Ms(20));
  EXPECT_EQ(profile.samples(), 100);
}

TEST(StepProfileTest, ASlowStepRaisesThePredictionAtOnce) {
  StepProfile profile = MakeProfile(Ms(20));
  ASSERT_TRUE(profile.Record(Ms(35)).ok());
  EXPECT_GE(profile.Predicted(), Ms(35));
}

TEST(StepProfileTest, ForgetsASpikeOnceItLeavesTheWindowAndTheDeviationDecays) {
  StepProfileOptions options;
  options.window = 8;
  StepProfile profile = MakeProfile(Ms(20), options);
  ASSERT_TRUE(profile.Record(Ms(60)).ok());
  // The window holds the profiled time, the spike and then 20 ms steps: 7 of them keep the spike.
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(profile.Record(Ms(20)).ok());
    EXPECT_GE(profile.Predicted(), Ms(60)) << "still in the window after " << i + 1;
  }
  ASSERT_TRUE(profile.Record(Ms(20)).ok());
  EXPECT_LT(profile.Predicted(), Ms(60));
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(profile.Record(Ms(20)).ok());
  EXPECT_LT(profile.Predicted(), Ms(20.5));
}

TEST(StepProfileTest, FasterStepsLowerThePredictionAfterTheWindow) {
  StepProfileOptions options;
  options.window = 4;
  StepProfile profile = MakeProfile(Ms(20), options);
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(profile.Record(Ms(10)).ok());
  EXPECT_LT(profile.Predicted(), Ms(10.5));
  EXPECT_GE(profile.Predicted(), Ms(10));
}

TEST(StepProfileTest, JitteryStepsAlmostNeverOverrunThePrediction) {
  // Steps uniform in [18, 22] ms: the gate must plan for the slow tail, not the mean.
  std::mt19937 rng(42);
  std::uniform_real_distribution<double> jitter(18.0, 22.0);
  StepProfile profile = MakeProfile(Ms(20));
  int overruns = 0;
  constexpr int kSteps = 10000;
  for (int i = 0; i < kSteps; ++i) {
    const absl::Duration step = Ms(jitter(rng));
    if (step > profile.Predicted()) ++overruns;
    ASSERT_TRUE(profile.Record(step).ok());
  }
  EXPECT_LE(overruns, kSteps / 1000);
  // ...while not being absurdly pessimistic.
  EXPECT_LT(profile.Predicted(), Ms(30));
}

TEST(StepProfileTest, RejectsInvalidInputs) {
  EXPECT_EQ(StepProfile::Create(absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StepProfile::Create(absl::InfiniteDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
  StepProfileOptions bad_window;
  bad_window.window = 0;
  EXPECT_EQ(StepProfile::Create(Ms(1), bad_window).status().code(),
            absl::StatusCode::kInvalidArgument);
  StepProfileOptions bad_gain;
  bad_gain.mean_gain = 0.0;
  EXPECT_EQ(StepProfile::Create(Ms(1), bad_gain).status().code(),
            absl::StatusCode::kInvalidArgument);
  StepProfileOptions bad_multiplier;
  bad_multiplier.deviation_multiplier = -1.0;
  EXPECT_EQ(StepProfile::Create(Ms(1), bad_multiplier).status().code(),
            absl::StatusCode::kInvalidArgument);

  StepProfile profile = MakeProfile(Ms(20));
  EXPECT_EQ(profile.Record(-Ms(1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(profile.Record(absl::InfiniteDuration()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(profile.samples(), 0);
  EXPECT_EQ(profile.Predicted(), Ms(20));
}

}  // namespace
}  // namespace pswitch::fill
