// Timing of a grouping plan under the cost model (grouping/cost_model.h).
#ifndef PSWITCH_GROUPING_EVALUATOR_H_
#define PSWITCH_GROUPING_EVALUATOR_H_

#include <vector>

#include "absl/status/statusor.h"
#include "grouping/cost_model.h"
#include "grouping/plan.h"

namespace pswitch::grouping {

// When one group is on the link and on the GPU, in seconds from the start of the switch.
struct GroupTiming {
  double transmit_start_s = 0.0;
  double transmit_end_s = 0.0;
  double exec_start_s = 0.0;
  double exec_end_s = 0.0;
};

struct PlanTiming {
  double total_s = 0.0;  // exec_end_s of the last group
  std::vector<GroupTiming> groups;
};

// Validates `plan` against `model` (ValidatePlan) and computes every group's transmission and
// execution interval in O(groups). This is the reference for every total a tool reports.
absl::StatusOr<PlanTiming> EvaluatePlan(const CostModel& model, const GroupPlan& plan);

// The total time of `plan`, without per-group detail. Requires a valid plan (unchecked);
// computes exactly the same floating-point value as EvaluatePlan(...).total_s.
double PlanTotalS(const CostModel& model, const GroupPlan& plan);

}  // namespace pswitch::grouping

#endif  // PSWITCH_GROUPING_EVALUATOR_H_
