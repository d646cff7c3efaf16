#include "grouping/evaluator.h"

#include <random>

#include "grouping/baselines.h"
#include "grouping/test_util.h"
#include "gtest/gtest.h"

namespace pswitch::grouping {
namespace {

// 4 layers, bandwidth 100 B/s, transfer overhead 0.5 s, sync overhead 0.25 s. All values are
// exact in binary floating point, so the expectations below are exact.
//   layer:  0      1     2      3
//   bytes:  100    0     300    200
//   exec_s: 1.0    0.5   2.0    1.0
Profile HandExample() {
  return Profile{
      "hand", 100.0, 0.5, 0.25, {{"a", 100, 1.0}, {"b", 0, 0.5}, {"c", 300, 2.0}, {"d", 200, 1.0}}};
}

TEST(EvaluatorTest, AgreesWithHandComputedExample) {
  const CostModel model = *CostModel::Create(HandExample());
  // Plan [[0,1],[2,2],[3,3]]:
  //   g0: T = 0.5 + 100/100 = 1.5  -> link [0, 1.5];   E = 0.25 + 1.5 = 1.75
  //       starts max(1.5, 0) = 1.5   -> GPU [1.5, 3.25]
  //   g1: T = 0.5 + 300/100 = 3.5  -> link [1.5, 5.0]; E = 0.25 + 2.0 = 2.25
  //       starts max(5.0, 3.25) = 5.0 -> GPU [5.0, 7.25]   (waits for the link)
  //   g2: T = 0.5 + 200/100 = 2.5  -> link [5.0, 7.5]; E = 0.25 + 1.0 = 1.25
  //       starts max(7.5, 7.25) = 7.5 -> GPU [7.5, 8.75]
  //   total = 8.75
  absl::StatusOr<PlanTiming> timing = EvaluatePlan(model, {{0, 1}, {2, 2}, {3, 3}});
  ASSERT_TRUE(timing.ok()) << timing.status();
  ASSERT_EQ(timing->groups.size(), 3u);
  const double expected[3][4] = {
      {0.0, 1.5, 1.5, 3.25}, {1.5, 5.0, 5.0, 7.25}, {5.0, 7.5, 7.5, 8.75}};
  for (int g = 0; g < 3; ++g) {
    EXPECT_EQ(timing->groups[g].transmit_start_s, expected[g][0]) << "group " << g;
    EXPECT_EQ(timing->groups[g].transmit_end_s, expected[g][1]) << "group " << g;
    EXPECT_EQ(timing->groups[g].exec_start_s, expected[g][2]) << "group " << g;
    EXPECT_EQ(timing->groups[g].exec_end_s, expected[g][3]) << "group " << g;
  }
  EXPECT_EQ(timing->total_s, 8.75);
  EXPECT_EQ(PlanTotalS(model, {{0, 1}, {2, 2}, {3, 3}}), 8.75);
}

TEST(EvaluatorTest, SingleAndPerLayerOnHandExample) {
  const CostModel model = *CostModel::Create(HandExample());
  // Single: T = 0.5 + 600/100 = 6.5; E = 0.25 + 4.5 = 4.75; total 11.25.
  EXPECT_EQ(EvaluatePlan(model, SingleGroupPlan(4))->total_s, 11.25);
  // Per layer: link ends 1.5, 2.0, 5.5, 8.0; GPU [1.5,2.75] [2.75,3.5] [5.5,7.75] [8.0,9.25].
  absl::StatusOr<PlanTiming> per_layer = EvaluatePlan(model, PerLayerPlan(4));
  ASSERT_TRUE(per_layer.ok());
  EXPECT_EQ(per_layer->groups[1].exec_start_s, 2.75);  // waits for the GPU, not the link
  EXPECT_EQ(per_layer->total_s, 9.25);
}

TEST(EvaluatorTest, RejectsInvalidPlans) {
  const CostModel model = *CostModel::Create(HandExample());
  EXPECT_FALSE(EvaluatePlan(model, {}).ok());                        // empty
  EXPECT_FALSE(EvaluatePlan(model, {{0, 1}, {3, 3}}).ok());          // gap
  EXPECT_FALSE(EvaluatePlan(model, {{0, 1}, {1, 3}}).ok());          // overlap
  EXPECT_FALSE(EvaluatePlan(model, {{0, 2}}).ok());                  // short
  EXPECT_FALSE(EvaluatePlan(model, {{0, 4}}).ok());                  // past the end
  EXPECT_FALSE(EvaluatePlan(model, {{0, 1}, {2, 1}, {2, 3}}).ok());  // empty group
  absl::Status status = EvaluatePlan(model, {{0, 1}, {3, 3}}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("group 1"), absl::string_view::npos) << status;
}

TEST(EvaluatorTest, MatchesTheDefinitionOnRandomPlans) {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 100; ++trial) {
    const Profile profile = testing::RandomProfile(rng, 40);
    const CostModel model = *CostModel::Create(profile);
    std::vector<int> cuts;
    for (int k = 1; k < 40; ++k) {
      if (rng() % 3 == 0) cuts.push_back(k);
    }
    const GroupPlan plan = PlanFromCuts(cuts, 40);
    EXPECT_TRUE(testing::RelativelyEqual(EvaluatePlan(model, plan)->total_s,
                                         testing::NaiveTotalS(profile, plan)));
  }
}

TEST(EvaluatorTest, CompletionLowerBoundNeverExceedsARealCompletion) {
  std::mt19937_64 rng(23);
  for (int trial = 0; trial < 200; ++trial) {
    const Profile profile = testing::RandomProfile(rng, 12);
    const CostModel model = *CostModel::Create(profile);
    std::vector<int> cuts;
    for (int k = 1; k < 12; ++k) {
      if (rng() % 2 == 0) cuts.push_back(k);
    }
    const PlanTiming timing = *EvaluatePlan(model, PlanFromCuts(cuts, 12));
    for (size_t g = 0; g + 1 < timing.groups.size(); ++g) {
      const double bound_s = model.CompletionLowerBoundS(cuts[g], timing.groups[g].transmit_end_s,
                                                         timing.groups[g].exec_end_s);
      EXPECT_LE(bound_s, timing.total_s * (1 + 1e-12)) << "trial " << trial << " group " << g;
    }
  }
}

}  // namespace
}  // namespace pswitch::grouping
