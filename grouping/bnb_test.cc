#include "grouping/bnb.h"

#include <random>

#include "grouping/baselines.h"
#include "grouping/dp.h"
#include "grouping/evaluator.h"
#include "grouping/test_util.h"
#include "gtest/gtest.h"

namespace pswitch::grouping {
namespace {

using testing::BruteForceBestTotalS;
using testing::RandomProfile;
using testing::RelativelyEqual;

GroupingResult SolveBnb(const CostModel& model, bool dominance_memo, BnbStats* stats = nullptr) {
  BnbOptions options;
  options.dominance_memo = dominance_memo;
  absl::StatusOr<GroupingResult> result = FindOptimalGroupingBnb(model, options, stats);
  EXPECT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(ValidatePlan(result->plan, model.num_layers()).ok());
  EXPECT_TRUE(result->proven_optimal);
  EXPECT_EQ(result->total_s, EvaluatePlan(model, result->plan)->total_s);
  return *result;
}

TEST(BnbTest, MatchesBruteForceOnHundredsOfRandomSmallProfiles) {
  std::mt19937_64 rng(4242);
  std::uniform_int_distribution<int> size(1, 14);
  for (int trial = 0; trial < 300; ++trial) {
    const Profile profile = RandomProfile(rng, size(rng));
    const CostModel model = *CostModel::Create(profile);
    const double brute_s = BruteForceBestTotalS(profile);
    for (bool memo : {false, true}) {
      const double bnb_s = SolveBnb(model, memo).total_s;
      ASSERT_TRUE(RelativelyEqual(bnb_s, brute_s))
          << "trial " << trial << " memo " << memo << ": bnb " << bnb_s << " brute " << brute_s;
    }
  }
}

TEST(BnbTest, AgreesWithDpOnRandomProfilesUpTo120Layers) {
  std::mt19937_64 rng(99);
  std::uniform_int_distribution<int> size(15, 120);
  for (int trial = 0; trial < 60; ++trial) {
    const int n = trial < 10 ? 120 : size(rng);
    const CostModel model = *CostModel::Create(RandomProfile(rng, n));
    const double dp_s = FindOptimalGroupingDp(model)->total_s;
    const double bnb_s = SolveBnb(model, /*dominance_memo=*/true).total_s;
    ASSERT_TRUE(RelativelyEqual(bnb_s, dp_s))
        << "trial " << trial << " n " << n << ": bnb " << bnb_s << " dp " << dp_s;
  }
}

TEST(BnbTest, PaperPruningAloneAgreesWithDp) {
  // The paper's two rules without the dominance memo stay exact. (They are exponential on
  // transmission-bound profiles, so the sizes here stay small.)
  std::mt19937_64 rng(1234);
  std::uniform_int_distribution<int> size(15, 40);
  for (int trial = 0; trial < 80; ++trial) {
    const CostModel model = *CostModel::Create(RandomProfile(rng, size(rng)));
    const double dp_s = FindOptimalGroupingDp(model)->total_s;
    const double bnb_s = SolveBnb(model, /*dominance_memo=*/false).total_s;
    ASSERT_TRUE(RelativelyEqual(bnb_s, dp_s)) << "trial " << trial;
  }
}

TEST(BnbTest, EdgeCasesMatchBruteForce) {
  const Profile base{"edge", 1e9, 1e-5, 2e-5, {}};
  std::vector<Profile> cases;
  Profile one = base;
  one.layers = {{"only", 123456, 1e-3}};
  cases.push_back(one);
  Profile zero_bytes = base, zero_exec = base, huge_bw = base, tiny_bw = base;
  for (int k = 0; k < 11; ++k) {
    zero_bytes.layers.push_back({"z", 0, 1e-4 * (k % 3)});
    zero_exec.layers.push_back({"z", 1000 * (k % 4), 0.0});
    huge_bw.layers.push_back({"h", 1 << 20, 1e-4});
    tiny_bw.layers.push_back({"t", 100 * (k + 1), 1e-3});
  }
  huge_bw.bandwidth_bytes_per_s = 1e30;
  tiny_bw.bandwidth_bytes_per_s = 1e-3;
  cases.insert(cases.end(), {zero_bytes, zero_exec, huge_bw, tiny_bw});
  for (size_t c = 0; c < cases.size(); ++c) {
    const CostModel model = *CostModel::Create(cases[c]);
    const double brute_s = BruteForceBestTotalS(cases[c]);
    EXPECT_TRUE(RelativelyEqual(SolveBnb(model, true).total_s, brute_s)) << "case " << c;
    EXPECT_TRUE(RelativelyEqual(SolveBnb(model, false).total_s, brute_s)) << "case " << c;
  }
}

TEST(BnbTest, ZeroTimeLimitReturnsBootstrapPlanNotProvenOptimal) {
  std::mt19937_64 rng(5);
  const CostModel model = *CostModel::Create(RandomProfile(rng, 300));
  BnbOptions options;
  options.time_limit = absl::ZeroDuration();
  absl::StatusOr<GroupingResult> result = FindOptimalGroupingBnb(model, options);
  ASSERT_TRUE(result.ok());
  EXPECT_FALSE(result->proven_optimal);
  EXPECT_TRUE(ValidatePlan(result->plan, 300).ok());
  EXPECT_EQ(result->total_s, BootstrapPlan(model).total_s);
}

TEST(BnbTest, PruningRulesFire) {
  std::mt19937_64 rng(8);
  const CostModel model = *CostModel::Create(RandomProfile(rng, 80));
  BnbStats stats;
  SolveBnb(model, true, &stats);
  EXPECT_GT(stats.nodes, 0);
  EXPECT_GT(stats.bound_pruned + stats.jstar_skipped + stats.dominance_pruned, 0);
}

}  // namespace
}  // namespace pswitch::grouping
