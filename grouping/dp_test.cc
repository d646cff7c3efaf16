#include "grouping/dp.h"

#include <random>

#include "grouping/baselines.h"
#include "grouping/evaluator.h"
#include "grouping/test_util.h"
#include "gtest/gtest.h"

namespace pswitch::grouping {
namespace {

using testing::BruteForceBestTotalS;
using testing::NaiveTotalS;
using testing::RandomProfile;
using testing::RelativelyEqual;

GroupingResult SolveDp(const Profile& profile) {
  absl::StatusOr<CostModel> model = CostModel::Create(profile);
  EXPECT_TRUE(model.ok()) << model.status();
  absl::StatusOr<GroupingResult> result = FindOptimalGroupingDp(*model);
  EXPECT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(ValidatePlan(result->plan, model->num_layers()).ok());
  EXPECT_TRUE(result->proven_optimal);
  EXPECT_EQ(result->total_s, EvaluatePlan(*model, result->plan)->total_s);
  return *result;
}

TEST(DpTest, MatchesBruteForceOnHundredsOfRandomSmallProfiles) {
  std::mt19937_64 rng(20240404);
  std::uniform_int_distribution<int> size(1, 14);
  for (int trial = 0; trial < 400; ++trial) {
    const Profile profile = RandomProfile(rng, size(rng));
    const GroupingResult result = SolveDp(profile);
    const double brute_s = BruteForceBestTotalS(profile);
    ASSERT_TRUE(RelativelyEqual(result.total_s, brute_s))
        << "trial " << trial << ": dp " << result.total_s << " brute force " << brute_s;
    // The reported total is the plan's real total under the definition.
    ASSERT_TRUE(RelativelyEqual(result.total_s, NaiveTotalS(profile, result.plan)));
  }
}

TEST(DpTest, NeverWorseThanTheBaselines) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const Profile profile = RandomProfile(rng, 100);
    const CostModel model = *CostModel::Create(profile);
    const double dp_s = SolveDp(profile).total_s;
    EXPECT_LE(dp_s, PlanTotalS(model, SingleGroupPlan(100)));
    EXPECT_LE(dp_s, PlanTotalS(model, PerLayerPlan(100)));
    EXPECT_LE(dp_s, PlanTotalS(model, *EveryKPlan(100, 10)));
    EXPECT_LE(dp_s, BootstrapPlan(model).total_s);
  }
}

Profile UniformProfile(int n, int64_t bytes, double exec_s, double bandwidth) {
  Profile profile{"uniform", bandwidth, 1e-5, 1e-5, {}};
  for (int k = 0; k < n; ++k) profile.layers.push_back({"l", bytes, exec_s});
  return profile;
}

TEST(DpTest, OneLayerIsOneGroup) {
  Profile profile{"one", 1e9, 2e-5, 1e-5, {{"only", 1000000, 0.003}}};
  const GroupingResult result = SolveDp(profile);
  EXPECT_EQ(result.plan, (GroupPlan{{0, 0}}));
  // 2e-5 + 1e6 / 1e9 = 0.00102 to transmit, then 1e-5 + 0.003 to run.
  EXPECT_DOUBLE_EQ(result.total_s, 0.00102 + 0.00301);
}

TEST(DpTest, AllZeroBytesIsOneGroup) {
  // Nothing to overlap: every extra group adds overheads and nothing else.
  const GroupingResult result = SolveDp(UniformProfile(12, 0, 1e-3, 1e10));
  EXPECT_EQ(result.plan, (GroupPlan{{0, 11}}));
  EXPECT_TRUE(RelativelyEqual(result.total_s, 1e-5 + 1e-5 + 12e-3));
}

TEST(DpTest, AllZeroExecTimesIsOneGroup) {
  // Execution is free: only the transfer overheads differ between plans.
  const GroupingResult result = SolveDp(UniformProfile(12, 1000, 0.0, 1e6));
  EXPECT_EQ(result.plan, (GroupPlan{{0, 11}}));
  EXPECT_TRUE(RelativelyEqual(result.total_s, 1e-5 + 12000 / 1e6 + 1e-5));
}

TEST(DpTest, HugeBandwidthIsOneGroup) {
  // Transmission is just the call overhead, so splitting cannot hide anything worth a sync.
  const GroupingResult result = SolveDp(UniformProfile(12, 1 << 20, 1e-4, 1e30));
  EXPECT_EQ(result.plan, (GroupPlan{{0, 11}}));
}

TEST(DpTest, TinyBandwidthIsTransmissionBoundAndMatchesBruteForce) {
  // At 1 B/s the link dominates; the best plan finishes shortly after the last byte.
  const Profile profile = UniformProfile(12, 1000, 1e-3, 1.0);
  const GroupingResult result = SolveDp(profile);
  EXPECT_TRUE(RelativelyEqual(result.total_s, BruteForceBestTotalS(profile)));
  EXPECT_GE(result.total_s, 12000.0);
  EXPECT_LT(result.total_s, 12000.0 + 2e-3);
}

TEST(DpTest, ZeroOverheadsMakePerLayerOptimal) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    Profile profile = RandomProfile(rng, 60);
    profile.transfer_overhead_s = 0.0;
    profile.group_sync_overhead_s = 0.0;
    const CostModel model = *CostModel::Create(profile);
    EXPECT_TRUE(RelativelyEqual(SolveDp(profile).total_s, PlanTotalS(model, PerLayerPlan(60))));
  }
}

TEST(DpTest, StatsShowPruning) {
  std::mt19937_64 rng(11);
  const CostModel model = *CostModel::Create(RandomProfile(rng, 200));
  DpStats stats;
  ASSERT_TRUE(FindOptimalGroupingDp(model, &stats).ok());
  EXPECT_GT(stats.transitions, 0);
  EXPECT_LE(stats.max_groups, 200);
}

}  // namespace
}  // namespace pswitch::grouping
