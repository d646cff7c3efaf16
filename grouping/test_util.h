// Test-only helpers for the grouping tests: random profiles and an independent brute force.
#ifndef PSWITCH_GROUPING_TEST_UTIL_H_
#define PSWITCH_GROUPING_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "grouping/plan.h"
#include "grouping/profile.h"

namespace pswitch::grouping::testing {

inline double LogUniform(std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(std::log(lo), std::log(hi));
  return std::exp(u(rng));
}

// A random valid profile with n layers. Mixes regimes: many 0-byte and 0-time layers, zero
// or non-zero overheads, transmission-bound to execution-bound, and (one case in five) small
// integers that make many plans tie.
inline Profile RandomProfile(std::mt19937_64& rng, int n) {
  Profile profile;
  profile.model = "random";
  std::uniform_int_distribution<int> regime_dist(0, 4);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  if (regime_dist(rng) == 0) {  // small integers: ties everywhere
    std::uniform_int_distribution<int> small(0, 3);
    profile.bandwidth_bytes_per_s = 1.0 + small(rng);
    profile.transfer_overhead_s = small(rng) / 2.0;
    profile.group_sync_overhead_s = small(rng) / 2.0;
    for (int k = 0; k < n; ++k) {
      profile.layers.push_back({"layer" + std::to_string(k), small(rng), 1.0 * small(rng)});
    }
    return profile;
  }
  double total_bytes = 0.0, total_exec_s = 0.0;
  const double zero_bytes_p = u01(rng) * 0.6, zero_exec_p = u01(rng) * 0.3;
  for (int k = 0; k < n; ++k) {
    LayerProfile layer{"layer" + std::to_string(k), 0, 0.0};
    if (u01(rng) >= zero_bytes_p) layer.param_bytes = std::llround(LogUniform(rng, 1e2, 1e8));
    if (u01(rng) >= zero_exec_p) layer.exec_s = LogUniform(rng, 1e-6, 1e-3);
    total_bytes += layer.param_bytes;
    total_exec_s += layer.exec_s;
    profile.layers.push_back(layer);
  }
  // Transmission between a tenth and ten times the execution time.
  const double ratio = LogUniform(rng, 0.1, 10.0);
  profile.bandwidth_bytes_per_s =
      std::max(1.0, total_bytes) / (std::max(1e-6, total_exec_s) * ratio);
  const double per_layer_s = std::max(1e-7, total_exec_s / n);
  profile.transfer_overhead_s = u01(rng) < 0.2 ? 0.0 : per_layer_s * LogUniform(rng, 0.01, 3.0);
  profile.group_sync_overhead_s = u01(rng) < 0.2 ? 0.0 : per_layer_s * LogUniform(rng, 0.01, 3.0);
  return profile;
}

// The total time of `plan` computed straight from the definition (sums layer by layer, no
// prefix sums), independently of grouping/evaluator.
inline double NaiveTotalS(const Profile& profile, const GroupPlan& plan) {
  double transmit_end_s = 0.0, exec_end_s = 0.0;
  for (const LayerGroup& group : plan) {
    double bytes = 0.0, exec_s = 0.0;
    for (int k = group.first; k <= group.last; ++k) {
      bytes += static_cast<double>(profile.layers[k].param_bytes);
      exec_s += profile.layers[k].exec_s;
    }
    transmit_end_s += profile.transfer_overhead_s + bytes / profile.bandwidth_bytes_per_s;
    exec_end_s = std::max(transmit_end_s, exec_end_s) + profile.group_sync_overhead_s + exec_s;
  }
  return exec_end_s;
}

// The smallest NaiveTotalS over all 2^(n-1) plans; n <= 20.
inline double BruteForceBestTotalS(const Profile& profile, GroupPlan* best_plan = nullptr) {
  const int n = static_cast<int>(profile.layers.size());
  double best_s = std::numeric_limits<double>::infinity();
  for (uint32_t mask = 0; mask < (uint32_t{1} << (n - 1)); ++mask) {
    std::vector<int> cuts;  // bit k set: a group starts at layer k + 1
    for (int k = 0; k < n - 1; ++k) {
      if (mask & (uint32_t{1} << k)) cuts.push_back(k + 1);
    }
    GroupPlan plan = PlanFromCuts(cuts, n);
    const double total_s = NaiveTotalS(profile, plan);
    if (total_s < best_s) {
      best_s = total_s;
      if (best_plan != nullptr) *best_plan = plan;
    }
  }
  return best_s;
}

// |a - b| <= 1e-12 * max(|a|, |b|), with exact equality for zeros.
inline bool RelativelyEqual(double a, double b, double relative = 1e-12) {
  return std::fabs(a - b) <= relative * std::max(std::fabs(a), std::fabs(b));
}

}  // namespace pswitch::grouping::testing

#endif  // PSWITCH_GROUPING_TEST_UTIL_H_
