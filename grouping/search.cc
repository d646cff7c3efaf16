#include "grouping/search.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grouping/baselines.h"
#include "grouping/bnb.h"
#include "grouping/dp.h"
#include "grouping/evaluator.h"
#include "base/status.h"

namespace pswitch::grouping {

absl::StatusOr<GroupingAlgorithm> ParseGroupingAlgorithm(absl::string_view name) {
  if (name == "dp") return GroupingAlgorithm::kDp;
  if (name == "bnb") return GroupingAlgorithm::kBnb;
  if (name == "single") return GroupingAlgorithm::kSingle;
  if (name == "per-layer") return GroupingAlgorithm::kPerLayer;
  if (name == "every-k") return GroupingAlgorithm::kEveryK;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown algorithm '", name, "'; expected one of dp, bnb, single, per-layer, every-k"));
}

std::string GroupingAlgorithmName(GroupingAlgorithm algorithm) {
  switch (algorithm) {
    case GroupingAlgorithm::kDp:
      return "dp";
    case GroupingAlgorithm::kBnb:
      return "bnb";
    case GroupingAlgorithm::kSingle:
      return "single";
    case GroupingAlgorithm::kPerLayer:
      return "per-layer";
    case GroupingAlgorithm::kEveryK:
      return "every-k";
  }
  return "unknown";
}

absl::StatusOr<SearchOutcome> FindGrouping(const CostModel& model, const SearchOptions& options) {
  if (options.time_limit < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("time limit must be >= 0");
  }
  const int n = model.num_layers();
  const auto start = std::chrono::steady_clock::now();
  GroupingResult result;
  switch (options.algorithm) {
    case GroupingAlgorithm::kDp: {
      PSWITCH_ASSIGN_OR_RETURN(result, FindOptimalGroupingDp(model));
      break;
    }
    case GroupingAlgorithm::kBnb: {
      BnbOptions bnb_options;
      bnb_options.time_limit = options.time_limit;
      PSWITCH_ASSIGN_OR_RETURN(result, FindOptimalGroupingBnb(model, bnb_options));
      break;
    }
    case GroupingAlgorithm::kSingle:
      result.plan = SingleGroupPlan(n);
      break;
    case GroupingAlgorithm::kPerLayer:
      result.plan = PerLayerPlan(n);
      break;
    case GroupingAlgorithm::kEveryK: {
      PSWITCH_ASSIGN_OR_RETURN(result.plan, EveryKPlan(n, options.k));
      break;
    }
  }
  SearchOutcome outcome;
  outcome.search_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The evaluator is the reference for every reported total, and re-validates the plan.
  PSWITCH_ASSIGN_OR_RETURN(const PlanTiming timing, EvaluatePlan(model, result.plan));
  result.total_s = timing.total_s;
  outcome.result = std::move(result);
  return outcome;
}

nlohmann::ordered_json SearchOutcomeToJson(const CostModel& model, const SearchOptions& options,
                                           const SearchOutcome& outcome) {
  nlohmann::ordered_json json = {{"model", model.model()},
                                 {"algorithm", GroupingAlgorithmName(options.algorithm)},
                                 {"total_s", outcome.result.total_s},
                                 {"search_s", outcome.search_s},
                                 {"groups", PlanToJson(outcome.result.plan)}};
  if (options.algorithm == GroupingAlgorithm::kBnb) {
    json["proven_optimal"] = outcome.result.proven_optimal;
  }
  return json;
}

}  // namespace pswitch::grouping
