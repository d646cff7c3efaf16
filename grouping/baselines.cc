#include "grouping/baselines.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grouping/evaluator.h"

namespace pswitch::grouping {
namespace {

// Up to `count` distinct values in [1, limit]: all of them when limit <= count, otherwise
// 1..count/2 followed by geometrically spaced values up to `limit`.
std::vector<int> CandidateSizes(int limit, int count) {
  std::vector<int> sizes;
  if (limit <= count) {
    for (int k = 1; k <= limit; ++k) sizes.push_back(k);
    return sizes;
  }
  for (int k = 1; k <= count / 2; ++k) sizes.push_back(k);
  double k = count / 2;
  const double step = 1.0 + 8.0 / count;
  while (k < limit) {
    k = std::max(k * step, k + 1.0);
    sizes.push_back(std::min(limit, static_cast<int>(k)));
  }
  return sizes;
}

}  // namespace

GroupPlan SingleGroupPlan(int num_layers) { return GroupPlan{{0, num_layers - 1}}; }

GroupPlan PerLayerPlan(int num_layers) {
  GroupPlan plan;
  plan.reserve(num_layers);
  for (int k = 0; k < num_layers; ++k) plan.push_back({k, k});
  return plan;
}

absl::StatusOr<GroupPlan> EveryKPlan(int num_layers, int k) {
  if (k <= 0) return absl::InvalidArgumentError(absl::StrCat("every-k: k must be > 0, got ", k));
  if (num_layers <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("every-k: num_layers must be > 0"));
  }
  GroupPlan plan;
  plan.reserve(num_layers / k + 1);
  for (int first = 0; first < num_layers; first += k) {
    plan.push_back({first, std::min(num_layers, first + k) - 1});
    if (num_layers - first <= k) break;  // avoids overflow of first + k near INT_MAX
  }
  return plan;
}

GroupPlan HiddenTransferGreedyPlan(const CostModel& model, int first_last) {
  const int n = model.num_layers();
  GroupPlan plan{{0, std::clamp(first_last, 0, n - 1)}};
  double transmit_end_s = model.TransmitS(plan[0].first, plan[0].last);
  double exec_end_s = transmit_end_s + model.ExecS(plan[0].first, plan[0].last);
  while (plan.back().last < n - 1) {
    const int first = plan.back().last + 1;
    const int last = std::max(first, model.LastLayerArrivingBy(first, transmit_end_s, exec_end_s));
    transmit_end_s += model.TransmitS(first, last);
    exec_end_s = std::max(transmit_end_s, exec_end_s) + model.ExecS(first, last);
    plan.push_back({first, last});
  }
  return plan;
}

GroupingResult BootstrapPlan(const CostModel& model) {
  const int n = model.num_layers();
  GroupingResult best{SingleGroupPlan(n), PlanTotalS(model, SingleGroupPlan(n)), false};
  auto consider = [&](GroupPlan plan) {
    const double total_s = PlanTotalS(model, plan);
    if (total_s < best.total_s) best = GroupingResult{std::move(plan), total_s, false};
  };
  // 64 candidates of each kind keeps this O(n log n)-ish even for 100k-layer profiles.
  constexpr int kCandidates = 64;
  for (int k : CandidateSizes(n, kCandidates)) consider(*EveryKPlan(n, k));
  for (int size : CandidateSizes(n, kCandidates)) {
    consider(HiddenTransferGreedyPlan(model, size - 1));
  }
  return best;
}

}  // namespace pswitch::grouping
