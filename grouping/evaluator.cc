#include "grouping/evaluator.h"

#include <algorithm>

#include "base/status.h"

namespace pswitch::grouping {

absl::StatusOr<PlanTiming> EvaluatePlan(const CostModel& model, const GroupPlan& plan) {
  PSWITCH_RETURN_IF_ERROR(ValidatePlan(plan, model.num_layers()));
  PlanTiming timing;
  timing.groups.reserve(plan.size());
  double transmit_end_s = 0.0;
  double exec_end_s = 0.0;
  for (const LayerGroup& group : plan) {
    GroupTiming g;
    g.transmit_start_s = transmit_end_s;
    g.transmit_end_s = transmit_end_s + model.TransmitS(group.first, group.last);
    g.exec_start_s = std::max(g.transmit_end_s, exec_end_s);
    g.exec_end_s = g.exec_start_s + model.ExecS(group.first, group.last);
    transmit_end_s = g.transmit_end_s;
    exec_end_s = g.exec_end_s;
    timing.groups.push_back(g);
  }
  timing.total_s = exec_end_s;
  return timing;
}

double PlanTotalS(const CostModel& model, const GroupPlan& plan) {
  double transmit_end_s = 0.0;
  double exec_end_s = 0.0;
  for (const LayerGroup& group : plan) {
    transmit_end_s = transmit_end_s + model.TransmitS(group.first, group.last);
    exec_end_s = std::max(transmit_end_s, exec_end_s) + model.ExecS(group.first, group.last);
  }
  return exec_end_s;
}

}  // namespace pswitch::grouping
