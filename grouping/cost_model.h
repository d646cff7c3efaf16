// The pipelined-transmission cost model that every grouping algorithm optimises.
//
// Layers 0..n-1 have param bytes b_k and execution times e_k. A group [i..j] (inclusive)
// transmits in T(i,j) = transfer_overhead_s + (b_i + ... + b_j) / bandwidth_bytes_per_s and
// executes in E(i,j) = group_sync_overhead_s + (e_i + ... + e_j). Transmissions run back to
// back in group order from t = 0; group g starts executing at max(end of its transmission,
// end of execution of group g-1). A plan's total time is the end of its last execution.
//
// CostModel precomputes prefix sums so T, E and the completion lower bound are O(1).
#ifndef PSWITCH_GROUPING_COST_MODEL_H_
#define PSWITCH_GROUPING_COST_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grouping/profile.h"

namespace pswitch::grouping {

// Immutable after Create; safe to share between threads. Copyable (a value).
class CostModel {
 public:
  // Validates `profile` (ValidateProfile) and precomputes its prefix sums.
  static absl::StatusOr<CostModel> Create(const Profile& profile);

  const std::string& model() const { return model_; }
  int num_layers() const { return num_layers_; }
  double bandwidth_bytes_per_s() const { return bandwidth_bytes_per_s_; }
  double transfer_overhead_s() const { return transfer_overhead_s_; }
  double group_sync_overhead_s() const { return group_sync_overhead_s_; }

  // T(first, last): transmission time of the group [first..last]. Requires
  // 0 <= first <= last < num_layers().
  double TransmitS(int first, int last) const {
    return transfer_overhead_s_ +
           static_cast<double>(bytes_prefix_[last + 1] - bytes_prefix_[first]) /
               bandwidth_bytes_per_s_;
  }

  // E(first, last): execution time of the group [first..last], same requirements.
  double ExecS(int first, int last) const {
    return group_sync_overhead_s_ + (exec_prefix_[last + 1] - exec_prefix_[first]);
  }

  // The last layer i >= first such that a group [first..i] whose transmission starts at
  // `transmit_start_s` has fully arrived by `deadline_s` (transmit_start_s + TransmitS(first,
  // i) <= deadline_s); first - 1 when not even [first..first] makes it. O(log n).
  int LastLayerArrivingBy(int first, double transmit_start_s, double deadline_s) const;

  // A lower bound on the total time of every plan that has grouped layers 0..next_layer-1
  // with its last transmission ending at `transmit_end_s` and its last execution ending at
  // `exec_end_s`, for 0 < next_layer < num_layers() (at least one layer remains). It is the
  // larger of
  //   (a) exec_end_s + group_sync_overhead_s + e(next..n-1): the rest needs at least one more
  //       group, which cannot start before exec_end_s;
  //   (b) max over j >= next of transmit_end_s + transfer_overhead_s + b(next..j)/bandwidth
  //       + group_sync_overhead_s + e(j..n-1): layer j's group arrives no earlier than all
  //       bytes up to j plus one call overhead, and then j and every later layer still run.
  // Both hold for any number of remaining groups, because extra groups only add overheads.
  double CompletionLowerBoundS(int next_layer, double transmit_end_s, double exec_end_s) const;

 private:
  CostModel() = default;

  std::string model_;
  int num_layers_ = 0;
  double bandwidth_bytes_per_s_ = 1.0;
  double transfer_overhead_s_ = 0.0;
  double group_sync_overhead_s_ = 0.0;
  std::vector<int64_t> bytes_prefix_;  // bytes_prefix_[k] = b_0 + ... + b_{k-1}
  std::vector<double> exec_prefix_;    // exec_prefix_[k] = e_0 + ... + e_{k-1}
  // arrival_critical_suffix_[k] = max over j >= k of (bytes_prefix_[j+1] / bandwidth
  // - exec_prefix_[j]); bound (b) is this plus terms that depend only on next_layer.
  std::vector<double> arrival_critical_suffix_;
};

}  // namespace pswitch::grouping

#endif  // PSWITCH_GROUPING_COST_MODEL_H_
