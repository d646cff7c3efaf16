// PipeSwitch's optimal model-aware grouping (Algorithm 1, §4.2): branch-and-bound over the
// first group, with lower-bound pruning (Eq. 2) and the j* rule (Eq. 3), made exact for the
// cost model of grouping/cost_model.h. See the design note in bnb.cc.
#ifndef PSWITCH_GROUPING_BNB_H_
#define PSWITCH_GROUPING_BNB_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grouping/cost_model.h"
#include "grouping/plan.h"

namespace pswitch::grouping {

struct BnbOptions {
  // Stop after this long and return the best plan found so far, with proven_optimal = false.
  absl::Duration time_limit = absl::InfiniteDuration();
  // Exact extra pruning: skip a subproblem (first ungrouped layer x, groups so far g) when
  // the same (x, g) was already searched with an execution end no later. Needs O(n * g_max)
  // memory; off reproduces the paper's two pruning rules alone.
  bool dominance_memo = true;
};

struct BnbStats {
  int64_t nodes = 0;             // subproblems FindOptGrouping(B, x) entered
  int64_t bound_pruned = 0;      // first-group candidates cut by the lower bound
  int64_t jstar_skipped = 0;     // first-group candidates skipped by the j* rule
  int64_t dominance_pruned = 0;  // subproblems skipped by the dominance memo
  int64_t improvements = 0;      // times the incumbent improved
};

// Searches for the plan with the smallest total time, starting from BootstrapPlan's
// incumbent. proven_optimal is true iff the search finished within options.time_limit.
// `stats` may be null. Thread-compatible: concurrent calls on a shared model are safe.
absl::StatusOr<GroupingResult> FindOptimalGroupingBnb(const CostModel& model,
                                                      const BnbOptions& options = {},
                                                      BnbStats* stats = nullptr);

}  // namespace pswitch::grouping

#endif  // PSWITCH_GROUPING_BNB_H_
