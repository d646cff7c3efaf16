#include "tools/bench_stats.h"

#include <vector>

#include "gtest/gtest.h"

namespace pswitch::tools {
namespace {

TEST(MedianTest, OddEvenAndUnsorted) {
  EXPECT_DOUBLE_EQ(*Median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(*Median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(*Median({-7}), -7);
  EXPECT_FALSE(Median({}).ok());
  EXPECT_FALSE(Median({1, std::nan("")}).ok());
}

TEST(PercentileTest, InterpolatesBetweenRanks) {
  const std::vector<double> v = {4, 1, 3, 2};  // sorted 1 2 3 4, ranks 0..3
  EXPECT_DOUBLE_EQ(*Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(*Percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(*Percentile(v, 50), 2.5);     // rank 1.5
  EXPECT_NEAR(*Percentile(v, 99), 3.97, 1e-12);  // rank 2.97
  EXPECT_DOUBLE_EQ(*Percentile({5}, 99), 5);
  EXPECT_FALSE(Percentile(v, -1).ok());
  EXPECT_FALSE(Percentile(v, 101).ok());
  EXPECT_FALSE(Percentile({}, 50).ok());
}

// Coverage 1 - 2 P(Bin(n, 1/2) <= k - 1), worked by hand.
TEST(OrderStatisticCoverageTest, MatchesTheBinomial) {
  EXPECT_NEAR(OrderStatisticCoverage(5, 1), 1 - 2.0 / 32, 1e-12);          // 0.9375
  EXPECT_NEAR(OrderStatisticCoverage(6, 1), 1 - 2.0 / 64, 1e-12);          // 0.96875
  EXPECT_NEAR(OrderStatisticCoverage(9, 2), 1 - 2.0 * 10 / 512, 1e-12);    // 0.9609
  EXPECT_NEAR(OrderStatisticCoverage(10, 2), 1 - 2.0 * 11 / 1024, 1e-12);  // 0.9785
  EXPECT_NEAR(OrderStatisticCoverage(10, 3), 1 - 2.0 * 56 / 1024, 1e-12);  // 0.8906
  EXPECT_EQ(OrderStatisticCoverage(5, 4), 0);                              // past the middle
  EXPECT_EQ(OrderStatisticCoverage(0, 1), 0);
  // Large n must not underflow: the interval's coverage stays in (0, 1].
  EXPECT_GT(OrderStatisticCoverage(2000, 950), 0.9);
}

TEST(MedianConfidenceIntervalTest, PicksTheNarrowestIntervalReachingTheLevel) {
  // n = 9: k = 2 covers 96.1 %, k = 3 only 82.0 %: [x_(2), x_(8)].
  auto ci = MedianConfidenceInterval({9, 1, 8, 2, 7, 3, 6, 4, 5});
  ASSERT_TRUE(ci.ok());
  EXPECT_DOUBLE_EQ(ci->median, 5);
  EXPECT_DOUBLE_EQ(ci->low, 2);
  EXPECT_DOUBLE_EQ(ci->high, 8);
  EXPECT_EQ(ci->rank, 2);
  EXPECT_TRUE(ci->reaches_level);
  EXPECT_NEAR(ci->coverage, 0.9609375, 1e-12);

  // n = 6: only [min, max] reaches 95 %.
  ci = MedianConfidenceInterval({0.5, -0.2, 0.1, 0.3, 1.2, 0.0});
  ASSERT_TRUE(ci.ok());
  EXPECT_DOUBLE_EQ(ci->median, 0.2);
  EXPECT_DOUBLE_EQ(ci->low, -0.2);
  EXPECT_DOUBLE_EQ(ci->high, 1.2);
  EXPECT_TRUE(ci->reaches_level);

  // A lower level narrows it: n = 9 at 80 % gives k = 3, [x_(3), x_(7)].
  ci = MedianConfidenceInterval({1, 2, 3, 4, 5, 6, 7, 8, 9}, 0.8);
  ASSERT_TRUE(ci.ok());
  EXPECT_DOUBLE_EQ(ci->low, 3);
  EXPECT_DOUBLE_EQ(ci->high, 7);
}

TEST(MedianConfidenceIntervalTest, TooFewValuesFallShortOfTheLevel) {
  auto ci = MedianConfidenceInterval({1, 2, 3, 4, 5});
  ASSERT_TRUE(ci.ok());
  EXPECT_DOUBLE_EQ(ci->low, 1);
  EXPECT_DOUBLE_EQ(ci->high, 5);
  EXPECT_FALSE(ci->reaches_level);
  EXPECT_NEAR(ci->coverage, 0.9375, 1e-12);
  EXPECT_FALSE(MedianConfidenceInterval({}).ok());
  EXPECT_FALSE(MedianConfidenceInterval({1, 2}, 1.0).ok());
}

TEST(PairedRelativeIncreasesTest, DividesPairwise) {
  auto d = PairedRelativeIncreases({100, 200}, {101, 190});
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(d->size(), 2u);
  EXPECT_NEAR((*d)[0], 0.01, 1e-12);
  EXPECT_NEAR((*d)[1], -0.05, 1e-12);
  EXPECT_FALSE(PairedRelativeIncreases({1}, {1, 2}).ok());
  EXPECT_FALSE(PairedRelativeIncreases({0}, {1}).ok());
}

TEST(JudgeIncreaseTargetTest, MetOnlyWhenTheUpperEndIsWithinTheTarget) {
  MedianInterval ci;
  ci.reaches_level = true;
  ci.low = -0.002;
  ci.high = 0.009;
  EXPECT_EQ(JudgeIncreaseTarget(ci, 0.01, 0.85, 0.8), Verdict::kMet);
  // Too little of the bubbles used.
  EXPECT_EQ(JudgeIncreaseTarget(ci, 0.01, 0.79, 0.8), Verdict::kNotMet);
  // Straddles the target.
  ci.high = 0.011;
  EXPECT_EQ(JudgeIncreaseTarget(ci, 0.01, 0.85, 0.8), Verdict::kInconclusive);
  // Wholly above it.
  ci.low = 0.012;
  ci.high = 0.03;
  EXPECT_EQ(JudgeIncreaseTarget(ci, 0.01, 0.85, 0.8), Verdict::kNotMet);
  // Within the target but short of the confidence level: no pass.
  ci = MedianInterval{};
  ci.low = 0;
  ci.high = 0.005;
  ci.reaches_level = false;
  EXPECT_EQ(JudgeIncreaseTarget(ci, 0.01, 0.85, 0.8), Verdict::kInconclusive);
  EXPECT_STREQ(VerdictName(Verdict::kInconclusive), "inconclusive");
  EXPECT_STREQ(VerdictName(Verdict::kNotMet), "not met");
}

// Two devices' truth; found bubbles late, overlong, false and given past their end.
TEST(ScoreDetectionTest, SharesOfTimeAndDelays) {
  const std::vector<std::vector<TimeInterval>> truth = {{{100, 200}, {300, 400}}, {{1000, 2000}}};
  const std::vector<std::vector<FoundBubble>> found = {
      // Began 20 late, told at 140, given to 220 but the job came back at 210: given 140-210,
      // of which 140-200 true.
      {{120, 140, 220, 210},
       // A false one, between the bubbles.
       {250, 260, 280, 290}},
      // Told at 1500, given to 1900: all of it true, 500 late.
      {{1400, 1500, 1900, 2000}}};
  const DetectionTotals t = ScoreDetection(truth, found, /*from_ns=*/0);
  EXPECT_EQ(t.truth_ns, 100 + 100 + 1000);
  EXPECT_EQ(t.found_ns, 90 + 40 + 600);
  EXPECT_EQ(t.found_true_ns, 80 + 0 + 600);
  EXPECT_EQ(t.given_ns, 70 + 20 + 400);
  EXPECT_EQ(t.given_true_ns, 60 + 0 + 400);
  ASSERT_EQ(t.delay_ms.size(), 2u);  // the false one fell in no true bubble
  EXPECT_DOUBLE_EQ(t.delay_ms[0], 40 / 1e6);
  EXPECT_DOUBLE_EQ(t.delay_ms[1], 500 / 1e6);
  EXPECT_DOUBLE_EQ(t.GivenRecall(), 460.0 / 1200);
  EXPECT_DOUBLE_EQ(t.GivenPrecision(), 460.0 / 490);
  // From each device's first given bubble: 140-200 and 300-400, and 1500-2000.
  EXPECT_EQ(t.learnt_truth_ns, 60 + 100 + 500);
  EXPECT_DOUBLE_EQ(t.LearntRecall(), 460.0 / 660);
  // The truth before the detector first looked does not count.
  EXPECT_EQ(ScoreDetection(truth, found, /*from_ns=*/350).truth_ns, 50 + 1000);
  DetectionTotals sum = t;
  sum.Add(t);
  EXPECT_EQ(sum.given_true_ns, 2 * t.given_true_ns);
  EXPECT_EQ(sum.learnt_truth_ns, 2 * t.learnt_truth_ns);
  EXPECT_EQ(sum.delay_ms.size(), 4u);
}

}  // namespace
}  // namespace pswitch::tools
