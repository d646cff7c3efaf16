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

  // When the link finishes sending layers 0..end_layer-1 in `groups` groups: groups *
  // transfer_overhead_s + bytes / bandwidth. Depends only on (end_layer, groups), not on how
  // the layers were split, so searches use it as a path-independent state key; it equals the
  // evaluator's running sum up to rounding.
  double ArrivalS(int end_layer, int groups) const {
    return groups * transfer_overhead_s_ +
           static_cast<double>(bytes_prefix_[end_layer]) / bandwidth_bytes_per_s_;
  }

  // The last layer i >= first such that a group [first..i] whose transmission starts at
  // `transmit_start_s` has fully arrived by `deadline_s` (transmit_start_s + TransmitS(first,
  // i) <= deadline_s); first - 1 when not even [first..first] makes it. O(log n).
  int LastLayerArrivingBy(int first, double transmit_start_s, double deadline_s) const;

  // A lower bound on the total time of every plan that has grouped layers 0..next_layer-1
  // with its last transmission ending at `transmit_end_s` (a) and its last execution ending
  // at `exec_end_s` (c), for 0 < next_layer < num_layers(). With r = next_layer, the rest
  // r..n-1 goes into k >= 1 more groups:
  //   k = 1: exactly max(a + T(r, n-1), c) + E(r, n-1).
  //   k >= 2: at least the largest of
  //     (a) c + k * o_sync + e(r..n-1): the k groups run one after another after c;
  //     (b) a + k * o_xfer + b(r..n-1)/bandwidth + o_sync + e(n-1): the last group arrives
  //         after every byte and k call overheads, then runs at least layer n-1;
  //     (c) max over j >= r of a + o_xfer + b(r..j)/bandwidth + o_sync + e(j..n-1)
  //         + (k-1) * min(o_xfer, o_sync): layer j's group arrives after the bytes up to j,
  //         then j and every later layer run; the k groups pay k+1 overheads on this path.
  //   Each term grows with k, so the bound is min(exact k = 1, terms at k = 2). O(1).
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
