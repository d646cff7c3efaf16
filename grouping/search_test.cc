#include "grouping/search.h"

#include <random>

#include "grouping/test_util.h"
#include "gtest/gtest.h"

namespace pswitch::grouping {
namespace {

TEST(SearchTest, ParsesAlgorithmNames) {
  for (const char* name : {"dp", "bnb", "single", "per-layer", "every-k"}) {
    absl::StatusOr<GroupingAlgorithm> algorithm = ParseGroupingAlgorithm(name);
    ASSERT_TRUE(algorithm.ok()) << name;
    EXPECT_EQ(GroupingAlgorithmName(*algorithm), name);
  }
  absl::Status unknown = ParseGroupingAlgorithm("greedy").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("greedy"), absl::string_view::npos);
}

TEST(SearchTest, EveryAlgorithmReturnsAValidPlanAndOptimaAgree) {
  std::mt19937_64 rng(77);
  const CostModel model = *CostModel::Create(testing::RandomProfile(rng, 90));
  double optimal_s[2] = {0, 0};
  int next = 0;
  for (GroupingAlgorithm algorithm :
       {GroupingAlgorithm::kDp, GroupingAlgorithm::kBnb, GroupingAlgorithm::kSingle,
        GroupingAlgorithm::kPerLayer, GroupingAlgorithm::kEveryK}) {
    SearchOptions options;
    options.algorithm = algorithm;
    absl::StatusOr<SearchOutcome> outcome = FindGrouping(model, options);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_TRUE(ValidatePlan(outcome->result.plan, 90).ok());
    EXPECT_GE(outcome->search_s, 0.0);
    if (algorithm == GroupingAlgorithm::kDp || algorithm == GroupingAlgorithm::kBnb) {
      optimal_s[next++] = outcome->result.total_s;
    } else {
      EXPECT_GE(outcome->result.total_s, optimal_s[0]);
    }
  }
  EXPECT_TRUE(testing::RelativelyEqual(optimal_s[0], optimal_s[1]));
}

TEST(SearchTest, RejectsBadOptions) {
  const CostModel model = *CostModel::Create(Profile{"m", 1.0, 0.0, 0.0, {{"l", 1, 1.0}}});
  SearchOptions options;
  options.algorithm = GroupingAlgorithm::kEveryK;
  options.k = 0;
  EXPECT_EQ(FindGrouping(model, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.algorithm = GroupingAlgorithm::kBnb;
  options.time_limit = absl::Seconds(-1);
  EXPECT_EQ(FindGrouping(model, options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SearchTest, JsonHasTheDocumentedFieldsInOrder) {
  const CostModel model =
      *CostModel::Create(Profile{"m", 1.0, 0.0, 0.0, {{"a", 1, 1.0}, {"b", 1, 1.0}}});
  SearchOptions options;
  options.algorithm = GroupingAlgorithm::kPerLayer;
  const SearchOutcome outcome = *FindGrouping(model, options);
  EXPECT_EQ(SearchOutcomeToJson(model, options, outcome).dump().substr(0, 44),
            R"({"model":"m","algorithm":"per-layer","total_)");
  nlohmann::ordered_json json = SearchOutcomeToJson(model, options, outcome);
  EXPECT_EQ(json["groups"].dump(), "[[0,0],[1,1]]");
  EXPECT_EQ(json["total_s"].get<double>(), 3.0);  // link 1, 2; GPU [1,2], [2,3]
  EXPECT_FALSE(json.contains("proven_optimal"));
  options.algorithm = GroupingAlgorithm::kBnb;
  EXPECT_TRUE(SearchOutcomeToJson(model, options, *FindGrouping(model, options))
                  .at("proven_optimal")
                  .get<bool>());
}

}  // namespace
}  // namespace pswitch::grouping
