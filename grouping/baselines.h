// Fixed grouping strategies (for comparison) and the heuristic that bootstraps the exact
// searches with a good incumbent.
#ifndef PSWITCH_GROUPING_BASELINES_H_
#define PSWITCH_GROUPING_BASELINES_H_

#include "absl/status/statusor.h"
#include "grouping/cost_model.h"
#include "grouping/plan.h"

namespace pswitch::grouping {

// One group holding every layer: no overlap, one overhead of each kind. num_layers > 0.
GroupPlan SingleGroupPlan(int num_layers);

// One group per layer: maximal overlap, n overheads of each kind. num_layers > 0.
GroupPlan PerLayerPlan(int num_layers);

// Groups of k consecutive layers (the last may be shorter). InvalidArgument when k <= 0 or
// num_layers <= 0.
absl::StatusOr<GroupPlan> EveryKPlan(int num_layers, int k);

// The plan whose first group is [0..first_last] and each later group ends at the last layer
// whose transmission still completes before the previous group finishes executing (the j*
// of PipeSwitch's Eq. 3; one layer when even that does not fit). O(groups * log n).
GroupPlan HiddenTransferGreedyPlan(const CostModel& model, int first_last);

// The best of the single, per-layer, every-k and hidden-transfer greedy plans (over a set of
// k and first-group sizes), with its total. A quick, good incumbent: O(n log n) for n <= 512
// candidates of each kind. proven_optimal is false.
GroupingResult BootstrapPlan(const CostModel& model);

}  // namespace pswitch::grouping

#endif  // PSWITCH_GROUPING_BASELINES_H_
