#include "grouping/plan.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace pswitch::grouping {

absl::Status ValidatePlan(const GroupPlan& plan, int num_layers) {
  if (num_layers <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("plan: model has ", num_layers, " layers"));
  }
  if (plan.empty()) return absl::InvalidArgumentError("plan: no groups");
  int next = 0;
  for (size_t g = 0; g < plan.size(); ++g) {
    const LayerGroup& group = plan[g];
    if (group.first != next) {
      return absl::InvalidArgumentError(absl::StrCat("plan: group ", g, " [", group.first, ", ",
                                                     group.last, "] must start at layer ", next));
    }
    if (group.last < group.first || group.last >= num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("plan: group ", g, " [", group.first, ", ",
                                                     group.last, "] must end in [", group.first,
                                                     ", ", num_layers - 1, "]"));
    }
    next = group.last + 1;
  }
  if (next != num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: groups cover layers 0..", next - 1, " but the model has ", num_layers));
  }
  return absl::OkStatus();
}

nlohmann::ordered_json PlanToJson(const GroupPlan& plan) {
  nlohmann::ordered_json groups = nlohmann::ordered_json::array();
  for (const LayerGroup& group : plan) groups.push_back({group.first, group.last});
  return groups;
}

absl::StatusOr<GroupPlan> PlanFromJson(const nlohmann::json& groups) {
  if (!groups.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: 'groups' must be an array, got ", groups.type_name()));
  }
  GroupPlan plan;
  plan.reserve(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const nlohmann::json& pair = groups[g];
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_integer() ||
        !pair[1].is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: groups[", g, "] must be [first, last] (two integers)"));
    }
    const int64_t first = pair[0].get<int64_t>();
    const int64_t last = pair[1].get<int64_t>();
    if (first < 0 || last < 0 || first > INT32_MAX || last > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: groups[", g, "] has an index outside [0, ", INT32_MAX, "]"));
    }
    plan.push_back({static_cast<int>(first), static_cast<int>(last)});
  }
  return plan;
}

GroupPlan PlanFromCuts(const std::vector<int>& cuts, int num_layers) {
  GroupPlan plan;
  plan.reserve(cuts.size() + 1);
  int first = 0;
  for (int cut : cuts) {
    plan.push_back({first, cut - 1});
    first = cut;
  }
  plan.push_back({first, num_layers - 1});
  return plan;
}

}  // namespace pswitch::grouping
