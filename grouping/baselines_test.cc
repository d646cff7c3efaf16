#include "grouping/baselines.h"

#include <random>

#include "grouping/evaluator.h"
#include "grouping/test_util.h"
#include "gtest/gtest.h"

namespace pswitch::grouping {
namespace {

TEST(BaselinesTest, FixedPlansHaveTheirShape) {
  EXPECT_EQ(SingleGroupPlan(5), (GroupPlan{{0, 4}}));
  EXPECT_EQ(PerLayerPlan(3), (GroupPlan{{0, 0}, {1, 1}, {2, 2}}));
  EXPECT_EQ(*EveryKPlan(7, 3), (GroupPlan{{0, 2}, {3, 5}, {6, 6}}));
  EXPECT_EQ(*EveryKPlan(6, 3), (GroupPlan{{0, 2}, {3, 5}}));
  EXPECT_EQ(*EveryKPlan(4, 10), SingleGroupPlan(4));
  EXPECT_EQ(*EveryKPlan(1, 1), PerLayerPlan(1));
}

TEST(BaselinesTest, EveryKRejectsNonPositiveK) {
  EXPECT_EQ(EveryKPlan(10, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EveryKPlan(10, -3).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BaselinesTest, HeuristicPlansAreValidAndBootstrapIsTheBestOfThem) {
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 700);
    const CostModel model = *CostModel::Create(testing::RandomProfile(rng, n));
    for (int first_last : {0, n / 2, n - 1}) {
      EXPECT_TRUE(ValidatePlan(HiddenTransferGreedyPlan(model, first_last), n).ok());
    }
    const GroupingResult bootstrap = BootstrapPlan(model);
    ASSERT_TRUE(ValidatePlan(bootstrap.plan, n).ok());
    EXPECT_FALSE(bootstrap.proven_optimal);
    EXPECT_EQ(bootstrap.total_s, PlanTotalS(model, bootstrap.plan));
    EXPECT_LE(bootstrap.total_s, PlanTotalS(model, SingleGroupPlan(n)));
    EXPECT_LE(bootstrap.total_s, PlanTotalS(model, PerLayerPlan(n)));
    EXPECT_LE(bootstrap.total_s, PlanTotalS(model, *EveryKPlan(n, 10)));
  }
}

TEST(BaselinesTest, GreedyGroupsHideUnderThePreviousExecution) {
  // 1 B/s, no overheads; layer 0 runs 10 s, so layers 1..3 (3 B each, 9 s) hide under it.
  Profile profile{"greedy", 1.0, 0.0, 0.0, {}};
  profile.layers = {{"a", 1, 10.0}, {"b", 3, 1.0}, {"c", 3, 1.0}, {"d", 3, 1.0}, {"e", 3, 1.0}};
  const CostModel model = *CostModel::Create(profile);
  // Group 0 ends at 11; layers 1..3 arrive by 1 + 9 = 10, layer 4 would arrive at 13.
  EXPECT_EQ(HiddenTransferGreedyPlan(model, 0), (GroupPlan{{0, 0}, {1, 3}, {4, 4}}));
}

}  // namespace
}  // namespace pswitch::grouping
