// A grouping plan: consecutive layer groups that cover a model's layers in execution order.
#ifndef PSWITCH_GROUPING_PLAN_H_
#define PSWITCH_GROUPING_PLAN_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace pswitch::grouping {

// Layers [first..last], both inclusive.
struct LayerGroup {
  int first = 0;
  int last = 0;

  friend bool operator==(const LayerGroup&, const LayerGroup&) = default;
};

// Groups in transmission order. A valid plan for n layers starts at layer 0, ends at layer
// n-1, and each group starts right after the previous one ends.
using GroupPlan = std::vector<LayerGroup>;

// What a search returns: the plan, its total time under the cost model, and whether the
// search proved it optimal (false for heuristics and for a search stopped by a time limit).
struct GroupingResult {
  GroupPlan plan;
  double total_s = 0.0;
  bool proven_optimal = false;
};

// OK when `plan` is a contiguous cover of layers 0..num_layers-1 by non-empty groups;
// otherwise InvalidArgument naming the first offending group index.
absl::Status ValidatePlan(const GroupPlan& plan, int num_layers);

// [[first, last], ...], the "groups" field of find-grouping's output.
nlohmann::ordered_json PlanToJson(const GroupPlan& plan);

// Inverse of PlanToJson; InvalidArgument (never an exception) on a malformed value. Does not
// check coverage: call ValidatePlan with the model's layer count.
absl::StatusOr<GroupPlan> PlanFromJson(const nlohmann::json& groups);

// The plan [0..b_1-1], [b_1..b_2-1], ..., [b_k..num_layers-1] from the sorted first layers of
// groups 2..k ("cut points"). Requires 0 < b_1 < ... < b_k < num_layers.
GroupPlan PlanFromCuts(const std::vector<int>& cuts, int num_layers);

}  // namespace pswitch::grouping

#endif  // PSWITCH_GROUPING_PLAN_H_
