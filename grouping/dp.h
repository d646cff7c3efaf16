// Exact polynomial-time grouping search (dynamic programming), the cross-check for bnb.
#ifndef PSWITCH_GROUPING_DP_H_
#define PSWITCH_GROUPING_DP_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "grouping/cost_model.h"
#include "grouping/plan.h"

namespace pswitch::grouping {

struct DpStats {
  int64_t states_kept = 0;    // (prefix, groups) states that survived the bound
  int64_t states_pruned = 0;  // states whose completion bound reached the incumbent
  int64_t transitions = 0;    // predecessor states examined
  int max_groups = 0;         // largest group count for which states were kept
};

// The plan with the smallest total time under `model` (ties: any optimal plan), with
// proven_optimal = true. Worst case O(n^3) time, O(n * g_max) memory for the parent table
// where g_max <= n is the largest useful group count; ResourceExhausted if that table would
// exceed 512 MiB (only for profiles with tens of thousands of layers). `stats` may be null.
// Thread-compatible: concurrent calls on a shared model are safe.
absl::StatusOr<GroupingResult> FindOptimalGroupingDp(const CostModel& model,
                                                     DpStats* stats = nullptr);

}  // namespace pswitch::grouping

#endif  // PSWITCH_GROUPING_DP_H_
