// Design note: PipeSwitch's Algorithm 1, made exact for our cost model.
//
// FindOptGrouping(B, x) enumerates the first group [x..i] of the layers not yet grouped and
// recurses on i + 1. B, the groups already formed, matters only through two times: a, the
// end of B's last transmission, and c, the end of B's last execution (the paper's B.delay
// is the slack c - a). We run the recursion with an explicit stack, because a plan can have
// as many groups as the profile has layers (up to 100,000) and each would be a C++ frame.
//
// Candidate [x..i] yields a' = a + T(x, i) and c' = max(a', c) + E(x, i). (We compute a' as
// CostModel::ArrivalS(i + 1, groups), the same value without path-dependent rounding.)
//
// Lower bound (the paper's Eq. 2 and lines 12-19). The paper bounds case i by
//   min(T(x,i) + T(i+1,n-1), max(T(x,i), B.delay) + E(x,i) + E(i+1,n-1)).
// Under our cost model this is corrected in three places:
//  1. For i = n-1 nothing remains, but T(n, n-1) and E(n, n-1) still charge a transfer and a
//     sync overhead that no group pays, so the "bound" exceeds the case's true total and
//     could prune an optimal plan whose last group starts at x. We evaluate i = n-1 exactly
//     instead of bounding it. (This is the correction that matters for validity.)
//  2. T(x,i) there is measured from time 0; in absolute time the group's transmission starts
//     at a, so the transmission leg is a + T(x, i) + ..., and the execution leg starts at
//     max(a + T(x, i), c). The paper's form is valid but weaker for x > 0.
//  3. Both legs are lower bounds, so their max (not min) is one, and both can be tightened.
//     We use CostModel::CompletionLowerBoundS(i + 1, a', c'): the exact total if the rest is
//     one group, else (two or more groups) the largest of c' + 2 o_sync + e(i+1..n-1), the
//     last group's arrival a' + 2 o_xfer + b(i+1..n-1)/bw + o_sync + e(n-1), and, over every
//     remaining layer j, the critical path through j's arrival (see cost_model.h).
// A candidate is cut when its bound >= the incumbent U (it cannot be strictly better). The
// execution leg, max(a + T(x,i), c) + 2 * o_sync + e(x..n-1), is non-decreasing in i, so once
// it reaches U every larger i < n-1 is cut too and the loop jumps to i = n-1.
//
// The j* rule (Eq. 3, lines 3-11). Let j* be the last layer with a + T(x, j*) <= c: the group
// [x..j*] arrives before the GPU is free. Cases i < j* are skipped. Proof for our model: take
// any plan P whose groups G1 = [x..i], ..., Gk = [s..t] (k >= 2, s <= j* <= t) cover x..t.
// Replace them by [x..j*], [j*+1..t] (or just [x..j*] when t = j*) to get P'. P' pays two
// transfer overheads over the same bytes, P pays k >= 2, so P' finishes transmitting t no
// later. P' executes [x..j*] from c (it has arrived), so its execution of t ends no later than
// max(its arrival, c + E(x, j*)) + E(j*+1, t) <= max(P's arrival of Gk, c + 2 o_sync +
// e(x..t)), and P needs at least that: Gk starts after its arrival, and G1..Gk each pay a sync
// overhead after c. Both end times are no later in P', and the rest of the schedule is
// monotone in them, so P' is no worse and its first group ends at j*.
//
// Bootstrap: U starts at BootstrapPlan (best of every-k, per-layer, single and a j*-greedy),
// as the paper suggests (it bootstraps with "group every ten layers").
//
// Dominance memo (optional, exact, not in the paper). The rest of the schedule depends on B
// only through (a, c) and is monotone in both, so a subproblem (x, a, c) can never beat an
// earlier one (x, a0, c0) with a0 <= a and c0 <= c: everything below that one was either
// searched or cut against an incumbent that has only improved since. We keep, per x, the
// Pareto front of searched (a, c) and skip dominated subproblems. a is computed from
// (x, groups) alone (CostModel::ArrivalS), so equal states compare equal despite rounding.
// This bounds the search by O(n^2) subproblems instead of 2^(n-1) plans while keeping the
// algorithm's shape; without it (dominance_memo = false), transmission-bound profiles, where
// many plans nearly tie, take exponential time.
#include "grouping/bnb.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/time/clock.h"
#include "grouping/baselines.h"
#include "grouping/evaluator.h"

namespace pswitch::grouping {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// The memo stops growing past this many entries (it only ever prunes, so a partial memo is
// still exact); 16 bytes each.
constexpr size_t kMaxMemoEntries = size_t{1} << 24;
// How many candidates to examine between clock reads.
constexpr int64_t kClockCheckInterval = 4096;

// One level of the recursion: FindOptGrouping(B, x) with B summarised by (a, c, groups).
struct Frame {
  int x = 0;                  // first layer not yet grouped
  int groups = 0;             // groups in B
  double transmit_end_s = 0;  // a
  double exec_end_s = 0;      // c
  int next_last = 0;          // the next candidate i for the group [x..i]
};

struct MemoEntry {
  double transmit_end_s = kInf;
  double exec_end_s = kInf;
};

}  // namespace

absl::StatusOr<GroupingResult> FindOptimalGroupingBnb(const CostModel& model,
                                                      const BnbOptions& options, BnbStats* stats) {
  BnbStats local_stats;
  BnbStats& st = stats != nullptr ? *stats : local_stats;
  st = BnbStats{};
  const int n = model.num_layers();
  const double o_s = model.group_sync_overhead_s();
  const absl::Time deadline = options.time_limit == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + options.time_limit;

  GroupingResult best = BootstrapPlan(model);
  double upper_s = best.total_s;

  // memo[x]: the Pareto front of (a, c) over searched subproblems whose first ungrouped
  // layer is x. a = ArrivalS(x, groups) grows with the group count, so this also lets a
  // subproblem with fewer groups and an earlier c dominate one with more groups.
  std::vector<std::vector<MemoEntry>> memo(options.dominance_memo ? n : 0);
  size_t memo_entries = 0;
  // True when (x, a, c) is dominated by a searched subproblem; otherwise records it.
  auto dominated = [&](int x, double a, double c) {
    if (!options.dominance_memo) return false;
    std::vector<MemoEntry>& front = memo[x];
    for (const MemoEntry& entry : front) {
      if (entry.transmit_end_s <= a && entry.exec_end_s <= c) return true;
    }
    const size_t before = front.size();
    std::erase_if(front, [&](const MemoEntry& entry) {
      return a <= entry.transmit_end_s && c <= entry.exec_end_s;
    });
    memo_entries -= before - front.size();
    if (memo_entries < kMaxMemoEntries) {
      front.push_back({a, c});
      ++memo_entries;
    }
    return false;
  };

  auto make_frame = [&](int x, int groups, double a, double c) {
    ++st.nodes;
    const int j_star = std::max(x, model.LastLayerArrivingBy(x, a, c));
    st.jstar_skipped += j_star - x;
    return Frame{x, groups, a, c, j_star};
  };

  std::vector<Frame> stack;
  stack.push_back(make_frame(0, 0, 0.0, 0.0));
  bool timed_out = false;
  int64_t until_clock_check = 1;  // check at once, so a zero limit returns the bootstrap
  while (!stack.empty()) {
    if (--until_clock_check == 0) {
      until_clock_check = kClockCheckInterval;
      if (absl::Now() >= deadline) {
        timed_out = true;
        break;
      }
    }
    Frame& f = stack.back();
    if (f.next_last >= n) {
      stack.pop_back();
      continue;
    }
    const int i = f.next_last++;
    // Path-independent, so equal states compare equal in the dominance memo.
    const double arrival_s = model.ArrivalS(i + 1, f.groups + 1);
    const double exec_end_s = std::max(arrival_s, f.exec_end_s) + model.ExecS(f.x, i);
    if (i == n - 1) {  // the whole rest as one group: exact, no bound (correction 1)
      if (exec_end_s < upper_s) {
        upper_s = exec_end_s;
        ++st.improvements;
        std::vector<int> cuts;
        cuts.reserve(stack.size());
        for (size_t k = 1; k < stack.size(); ++k) cuts.push_back(stack[k].x);
        best.plan = PlanFromCuts(cuts, n);
      }
      continue;
    }
    // The execution leg of the bound, computed in a form that is monotone in i.
    const double exec_leg_s =
        std::max(arrival_s, f.exec_end_s) + 2 * o_s + (model.ExecS(f.x, n - 1) - o_s);
    if (exec_leg_s >= upper_s) {
      st.bound_pruned += (n - 1) - i;
      f.next_last = n - 1;
      continue;
    }
    if (model.CompletionLowerBoundS(i + 1, arrival_s, exec_end_s) >= upper_s) {
      ++st.bound_pruned;
      continue;
    }
    if (dominated(i + 1, arrival_s, exec_end_s)) {
      ++st.dominance_pruned;
      continue;
    }
    const int groups = f.groups + 1;  // `f` dangles once the stack grows
    stack.push_back(make_frame(i + 1, groups, arrival_s, exec_end_s));
  }

  best.proven_optimal = !timed_out;
  best.total_s = PlanTotalS(model, best.plan);
  return best;
}

}  // namespace pswitch::grouping
