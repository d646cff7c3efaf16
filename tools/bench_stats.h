// Small-sample statistics for the benchmarks: the median, percentiles, a distribution-free
// confidence interval for a median, and the verdict on a "at most X % slower" target.
//
// Why an order-statistic interval (the sign-test interval) for the median of paired relative
// differences, and not a bootstrap: with n independent pairs of runs, whatever their
// distribution, the number of differences below the true median is Binomial(n, 1/2), so
// [x_(k), x_(n+1-k)] covers the median with probability exactly 1 - 2 P(B <= k - 1). That is
// exact at the small n a benchmark can afford (6 to 15 repeats), needs no symmetry (the
// Wilcoxon/Hodges-Lehmann interval does), is deterministic, and one run disturbed by another
// process's burst moves it by at most one rank. A percentile bootstrap of the median at such n
// can only return order statistics too, and under-covers. Pure functions; thread-compatible.
#ifndef PSWITCH_TOOLS_BENCH_STATS_H_
#define PSWITCH_TOOLS_BENCH_STATS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace pswitch::tools {

// The median (for an even count, the mean of the two middle values). InvalidArgument when
// `values` is empty or holds a NaN.
absl::StatusOr<double> Median(std::vector<double> values);

// The p-th percentile, p in [0, 100], interpolating linearly between the closest ranks
// (rank p/100 * (n - 1) in the sorted values, as numpy's default). InvalidArgument for no
// values, a NaN, or p outside [0, 100].
absl::StatusOr<double> Percentile(std::vector<double> values, double p);

// P(x_(k) <= median <= x_(n+1-k)) for n independent draws of a continuous distribution:
// 1 - 2 P(Binomial(n, 1/2) <= k - 1). 0 unless 1 <= k <= (n + 1) / 2.
double OrderStatisticCoverage(int n, int k);

struct MedianInterval {
  double median = 0;
  double low = 0;
  double high = 0;
  int rank = 0;                // the interval is [x_(rank), x_(n+1-rank)], 1-based
  double coverage = 0;         // OrderStatisticCoverage(n, rank)
  bool reaches_level = false;  // coverage >= the level asked for
};

// The narrowest order-statistic interval whose coverage is at least `level` (in (0, 1)); when
// even [min, max] falls short (n < 6 for 95 %), [min, max] with reaches_level false.
// InvalidArgument for no values, a NaN, or a level outside (0, 1).
absl::StatusOr<MedianInterval> MedianConfidenceInterval(std::vector<double> values,
                                                        double level = 0.95);

// treated[i] / base[i] - 1 for each pair. InvalidArgument when the sizes differ or a base is
// not positive.
absl::StatusOr<std::vector<double>> PairedRelativeIncreases(const std::vector<double>& base,
                                                            const std::vector<double>& treated);

enum class Verdict { kMet, kNotMet, kInconclusive };
const char* VerdictName(Verdict verdict);  // "met", "not met", "inconclusive"

// The target "median increase <= max_increase with at least min_used of bubble time used":
// met when the interval reaches its level, its upper end is <= max_increase and used >=
// min_used; not met when used < min_used or the whole interval lies above max_increase;
// inconclusive otherwise (the interval straddles the target, or is too short of its level to
// call a pass).
Verdict JudgeIncreaseTarget(const MedianInterval& increase, double max_increase, double used,
                            double min_used);

// Bubbles a detector found, scored against the main job's own (its bubble calls' times), per
// device. Times in ns on one clock. A truth or found bubble is [begin, end).
struct TimeInterval {
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
};
struct FoundBubble {
  int64_t began_ns = 0;      // the idle stretch's start, as the detector saw it
  int64_t announced_ns = 0;  // when fill work was told
  int64_t given_end_ns = 0;  // the end it was given (announced + its time)
  int64_t ended_ns = 0;      // the job's next activity, as the detector saw it
};
// Sums, so runs add up: found = [began, ended]; given = [announced, min(given end, ended)].
struct DetectionTotals {
  int64_t truth_ns = 0;
  int64_t learnt_truth_ns = 0;              // the truth from each device's first given bubble on
  int64_t found_ns = 0, found_true_ns = 0;  // found, and the part of it inside the truth
  int64_t given_ns = 0, given_true_ns = 0;
  // Announcement less the start of the true bubble it fell in (given bubbles that fell in one).
  std::vector<double> delay_ms;
  void Add(const DetectionTotals& other);
  double FoundPrecision() const;  // found_true / found (0 with nothing found)
  double GivenPrecision() const;
  double GivenRecall() const;  // given_true / truth: the share of the job's idle time given
  double FoundRecall() const;
  double LearntRecall() const;  // given_true / learnt_truth: once the detector gives time
};
// `truth` and `found` by device; a device's truth sorted by begin, not overlapping. Truth
// counts from `from_ns` (the detector's first look) to the last truth bubble's end.
DetectionTotals ScoreDetection(const std::vector<std::vector<TimeInterval>>& truth,
                               const std::vector<std::vector<FoundBubble>>& found, int64_t from_ns);

}  // namespace pswitch::tools

#endif  // PSWITCH_TOOLS_BENCH_STATS_H_
