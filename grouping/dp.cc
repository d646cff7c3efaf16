// Design note: the exact dynamic program.
//
// State (p, g): layers 0..p-1 are grouped into exactly g groups. Whatever the grouping, the
// last transmission ends at R(p, g) = g * transfer_overhead + bytes(0..p-1) / bandwidth: the
// link is never idle, so its end only depends on how many calls were made and how many bytes
// were sent. The only other quantity the future depends on is C, the end of the last
// execution. The future is monotone in C: every later group starts at max(its arrival,
// previous execution end), and max and + are non-decreasing, so a prefix with a smaller C
// never finishes later. Hence keeping, per state, only the minimum C (D[g][p]) loses no
// optimal plan, and
//
//   D[g][p] = min over q < p of  max(R(p, g), D[g-1][q]) + E(q, p-1),   D[0][0] = 0,
//
// with the answer min over g of D[g][n]. That is O(n^2) states and O(n^3) transitions.
//
// Two exact shortcuts make it fast in practice:
//  * Scanning q downwards from p-1, the first q with D[g-1][q] <= R ends the scan. Its value
//    is R + E(q, p-1); any q' < q gives max(R, D) + E(q', p-1) >= R + E(q, p-1) because
//    E(q', p-1) >= E(q, p-1) (execution times are non-negative).
//  * States whose completion lower bound (CostModel::CompletionLowerBoundS) reaches the
//    incumbent U (BootstrapPlan, then the best full plan found so far) are dropped. A plan
//    strictly better than U passes only through states with bound < U, and each of those is
//    kept with a C no larger than the plan's own (induction on g), so the optimum survives.
//    Layers g stop once even the overhead-only bounds g * overhead + ... reach U.
#include "grouping/dp.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grouping/baselines.h"
#include "grouping/evaluator.h"

namespace pswitch::grouping {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kMaxParentBytes = int64_t{512} << 20;

}  // namespace

absl::StatusOr<GroupingResult> FindOptimalGroupingDp(const CostModel& model, DpStats* stats) {
  DpStats local_stats;
  DpStats& st = stats != nullptr ? *stats : local_stats;
  st = DpStats{};
  const int n = model.num_layers();
  const double o_t = model.transfer_overhead_s();
  const double o_s = model.group_sync_overhead_s();
  const double all_bytes_s = model.TransmitS(0, n - 1) - o_t;
  const double all_exec_s = model.ExecS(0, n - 1) - o_s;
  const double last_exec_s = model.ExecS(n - 1, n - 1);

  GroupingResult incumbent = BootstrapPlan(model);
  double upper_s = incumbent.total_s;
  int best_groups = 0;  // 0: the incumbent is still the best plan

  // parents[g-1][p] = q: the last group of the best state (p, g) is [q..p-1].
  std::vector<std::vector<int32_t>> parents;
  std::vector<double> prev(n + 1, kInf), cur(n + 1, kInf);
  std::vector<int> prev_alive{0}, cur_alive;
  prev[0] = 0.0;
  for (int g = 1; g <= n && !prev_alive.empty(); ++g) {
    // Any plan with >= g groups pays g overheads of each kind.
    const double min_total_s = std::max(g * o_t + all_bytes_s + last_exec_s, g * o_s + all_exec_s);
    if (min_total_s >= upper_s) break;
    if (static_cast<int64_t>(parents.size() + 1) * (n + 1) * 4 > kMaxParentBytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "dp: model '", model.model(), "' with ", n, " layers needs more than ",
          kMaxParentBytes >> 20, " MiB of parent table; use --algorithm bnb with --time-limit"));
    }
    parents.emplace_back(n + 1, -1);
    std::vector<int32_t>& parent = parents.back();
    std::fill(cur.begin(), cur.end(), kInf);
    cur_alive.clear();
    size_t below = 0;  // prev_alive[0..below) are the alive q < p
    for (int p = g; p <= n; ++p) {
      while (below < prev_alive.size() && prev_alive[below] < p) ++below;
      const double arrival_s = model.ArrivalS(p, g);
      double best_s = kInf;
      int best_q = -1;
      for (size_t k = below; k-- > 0;) {
        const int q = prev_alive[k];
        ++st.transitions;
        const double exec_end_s = std::max(arrival_s, prev[q]) + model.ExecS(q, p - 1);
        if (exec_end_s < best_s) {
          best_s = exec_end_s;
          best_q = q;
        }
        if (prev[q] <= arrival_s) break;  // every smaller q is no better (see note)
      }
      if (best_q < 0) continue;
      if (p == n) {
        if (best_s < upper_s) {
          upper_s = best_s;
          best_groups = g;
          parent[p] = best_q;
        }
        continue;
      }
      if (model.CompletionLowerBoundS(p, arrival_s, best_s) >= upper_s) {
        ++st.states_pruned;
        continue;
      }
      ++st.states_kept;
      cur[p] = best_s;
      parent[p] = best_q;
      cur_alive.push_back(p);
    }
    if (!cur_alive.empty()) st.max_groups = g;
    std::swap(prev, cur);
    std::swap(prev_alive, cur_alive);
  }

  GroupingResult result;
  result.proven_optimal = true;
  if (best_groups == 0) {
    result.plan = std::move(incumbent.plan);
  } else {
    std::vector<int> cuts;
    int p = n;
    for (int g = best_groups; g > 1; --g) {
      p = parents[g - 1][p];
      cuts.push_back(p);
    }
    std::reverse(cuts.begin(), cuts.end());
    result.plan = PlanFromCuts(cuts, n);
  }
  result.total_s = PlanTotalS(model, result.plan);
  return result;
}

}  // namespace pswitch::grouping
