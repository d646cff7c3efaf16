#include "grouping/cost_model.h"

#include <algorithm>
#include <limits>

#include "base/status.h"

namespace pswitch::grouping {

absl::StatusOr<CostModel> CostModel::Create(const Profile& profile) {
  PSWITCH_RETURN_IF_ERROR(ValidateProfile(profile));
  CostModel model;
  model.model_ = profile.model;
  model.num_layers_ = static_cast<int>(profile.layers.size());
  model.bandwidth_bytes_per_s_ = profile.bandwidth_bytes_per_s;
  model.transfer_overhead_s_ = profile.transfer_overhead_s;
  model.group_sync_overhead_s_ = profile.group_sync_overhead_s;
  const int n = model.num_layers_;
  model.bytes_prefix_.assign(n + 1, 0);
  model.exec_prefix_.assign(n + 1, 0.0);
  for (int k = 0; k < n; ++k) {
    model.bytes_prefix_[k + 1] = model.bytes_prefix_[k] + profile.layers[k].param_bytes;
    model.exec_prefix_[k + 1] = model.exec_prefix_[k] + profile.layers[k].exec_s;
  }
  model.arrival_critical_suffix_.assign(n + 1, 0.0);
  double best = -std::numeric_limits<double>::infinity();
  for (int j = n - 1; j >= 0; --j) {
    const double arrival =
        static_cast<double>(model.bytes_prefix_[j + 1]) / model.bandwidth_bytes_per_s_ -
        model.exec_prefix_[j];
    best = std::max(best, arrival);
    model.arrival_critical_suffix_[j] = best;
  }
  model.arrival_critical_suffix_[n] = best;  // unused: no layer remains
  return model;
}

int CostModel::LastLayerArrivingBy(int first, double transmit_start_s, double deadline_s) const {
  // TransmitS(first, i) is non-decreasing in i, so binary search for the last i that fits.
  int lo = first - 1;  // invariant: lo fits (or is first - 1); hi does not fit (or is n)
  int hi = num_layers_;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (transmit_start_s + TransmitS(first, mid) <= deadline_s) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

double CostModel::CompletionLowerBoundS(int next_layer, double transmit_end_s,
                                        double exec_end_s) const {
  const int n = num_layers_;
  const double one_group_s = std::max(transmit_end_s + TransmitS(next_layer, n - 1), exec_end_s) +
                             ExecS(next_layer, n - 1);
  if (next_layer == n - 1) return one_group_s;  // k = 1 is the only option
  const double o_t = transfer_overhead_s_, o_s = group_sync_overhead_s_;
  const double remaining_exec_s = exec_prefix_[n] - exec_prefix_[next_layer];
  const double remaining_bytes_s =
      static_cast<double>(bytes_prefix_[n] - bytes_prefix_[next_layer]) / bandwidth_bytes_per_s_;
  const double exec_chain_s = exec_end_s + 2 * o_s + remaining_exec_s;
  const double last_arrival_s =
      transmit_end_s + 2 * o_t + remaining_bytes_s + o_s + (exec_prefix_[n] - exec_prefix_[n - 1]);
  const double critical_path_s =
      transmit_end_s + o_t + o_s + std::min(o_t, o_s) + exec_prefix_[n] -
      static_cast<double>(bytes_prefix_[next_layer]) / bandwidth_bytes_per_s_ +
      arrival_critical_suffix_[next_layer];
  return std::min(one_group_s, std::max({exec_chain_s, last_arrival_s, critical_path_s}));
}

}  // namespace pswitch::grouping
