// One entry point for every grouping algorithm, as find-grouping and the bench select them.
#ifndef PSWITCH_GROUPING_SEARCH_H_
#define PSWITCH_GROUPING_SEARCH_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grouping/cost_model.h"
#include "grouping/plan.h"
#include "nlohmann/json.hpp"

namespace pswitch::grouping {

enum class GroupingAlgorithm { kDp, kBnb, kSingle, kPerLayer, kEveryK };

// "dp", "bnb", "single", "per-layer", "every-k"; InvalidArgument listing them otherwise.
absl::StatusOr<GroupingAlgorithm> ParseGroupingAlgorithm(absl::string_view name);
std::string GroupingAlgorithmName(GroupingAlgorithm algorithm);

struct SearchOptions {
  GroupingAlgorithm algorithm = GroupingAlgorithm::kDp;
  int k = 10;                                            // every-k only; must be > 0
  absl::Duration time_limit = absl::InfiniteDuration();  // bnb only
};

struct SearchOutcome {
  GroupingResult result;  // total_s is EvaluatePlan's total
  double search_s = 0.0;  // wall time of the search alone
};

// Runs the selected algorithm on `model`. InvalidArgument for k <= 0 (every-k) or a negative
// time limit; otherwise whatever the algorithm returns. The plan is always valid for `model`.
absl::StatusOr<SearchOutcome> FindGrouping(const CostModel& model, const SearchOptions& options);

// {"model", "algorithm", "total_s", "search_s", "groups": [[first, last], ...]}, plus
// "proven_optimal" for bnb, in that order: find-grouping's output.
nlohmann::ordered_json SearchOutcomeToJson(const CostModel& model, const SearchOptions& options,
                                           const SearchOutcome& outcome);

}  // namespace pswitch::grouping

#endif  // PSWITCH_GROUPING_SEARCH_H_
