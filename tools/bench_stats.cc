#include "tools/bench_stats.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace pswitch::tools {
namespace {

absl::Status CheckValues(const std::vector<double>& values, const char* what) {
  if (values.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": no values"));
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": value ", i, " is NaN"));
    }
  }
  return absl::OkStatus();
}

// P(Binomial(n, 1/2) <= j), summed in log space so that large n does not underflow 2^-n.
double BinomialHalfCdf(int n, int j) {
  double sum = 0;
  const double log_total = n * std::log(2.0);
  for (int i = 0; i <= j && i <= n; ++i) {
    sum += std::exp(std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) -
                    log_total);
  }
  return std::min(sum, 1.0);
}

}  // namespace

absl::StatusOr<double> Median(std::vector<double> values) {
  if (absl::Status s = CheckValues(values, "median"); !s.ok()) return s;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

absl::StatusOr<double> Percentile(std::vector<double> values, double p) {
  if (absl::Status s = CheckValues(values, "percentile"); !s.ok()) return s;
  if (!(p >= 0 && p <= 100)) {
    return absl::InvalidArgumentError(absl::StrCat("percentile: p must be in [0, 100], got ", p));
  }
  std::sort(values.begin(), values.end());
  const double rank = p / 100 * static_cast<double>(values.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(rank));
  const size_t above = std::min(below + 1, values.size() - 1);
  const double frac = rank - static_cast<double>(below);
  return values[below] + frac * (values[above] - values[below]);
}

double OrderStatisticCoverage(int n, int k) {
  if (n < 1 || k < 1 || 2 * k > n + 1) return 0;
  return std::max(0.0, 1 - 2 * BinomialHalfCdf(n, k - 1));
}

absl::StatusOr<MedianInterval> MedianConfidenceInterval(std::vector<double> values, double level) {
  if (absl::Status s = CheckValues(values, "median interval"); !s.ok()) return s;
  if (!(level > 0 && level < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("median interval: level must be in (0, 1), got ", level));
  }
  std::sort(values.begin(), values.end());
  const int n = static_cast<int>(values.size());
  MedianInterval out;
  out.median = n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  // Coverage falls as k grows: take the largest k that still reaches the level.
  int rank = 1;
  while (2 * (rank + 1) <= n + 1 && OrderStatisticCoverage(n, rank + 1) >= level) ++rank;
  out.rank = rank;
  out.coverage = OrderStatisticCoverage(n, rank);
  out.reaches_level = out.coverage >= level;
  out.low = values[rank - 1];
  out.high = values[n - rank];
  return out;
}

absl::StatusOr<std::vector<double>> PairedRelativeIncreases(const std::vector<double>& base,
                                                            const std::vector<double>& treated) {
  if (base.size() != treated.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "paired increases: ", base.size(), " base values but ", treated.size(), " treated ones"));
  }
  std::vector<double> out;
  out.reserve(base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    if (!(base[i] > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("paired increases: base value ", i, " is ", base[i], ", not positive"));
    }
    out.push_back(treated[i] / base[i] - 1);
  }
  return out;
}

const char* VerdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::kMet:
      return "met";
    case Verdict::kNotMet:
      return "not met";
    case Verdict::kInconclusive:
      return "inconclusive";
  }
  return "?";
}

Verdict JudgeIncreaseTarget(const MedianInterval& increase, double max_increase, double used,
                            double min_used) {
  if (used < min_used || increase.low > max_increase) return Verdict::kNotMet;
  if (increase.reaches_level && increase.high <= max_increase) return Verdict::kMet;
  return Verdict::kInconclusive;
}

namespace {

// Time of [begin, end) inside the union of `truth` (sorted, disjoint).
int64_t Inside(const std::vector<TimeInterval>& truth, int64_t begin_ns, int64_t end_ns) {
  int64_t inside = 0;
  auto it = std::upper_bound(truth.begin(), truth.end(), begin_ns,
                             [](int64_t t, const TimeInterval& i) { return t < i.end_ns; });
  for (; it != truth.end() && it->begin_ns < end_ns; ++it) {
    inside += std::min(end_ns, it->end_ns) - std::max(begin_ns, it->begin_ns);
  }
  return inside;
}

double Share(int64_t part, int64_t whole) {
  return whole > 0 ? static_cast<double>(part) / static_cast<double>(whole) : 0;
}

}  // namespace

void DetectionTotals::Add(const DetectionTotals& o) {
  truth_ns += o.truth_ns;
  learnt_truth_ns += o.learnt_truth_ns;
  found_ns += o.found_ns;
  found_true_ns += o.found_true_ns;
  given_ns += o.given_ns;
  given_true_ns += o.given_true_ns;
  delay_ms.insert(delay_ms.end(), o.delay_ms.begin(), o.delay_ms.end());
}
double DetectionTotals::FoundPrecision() const { return Share(found_true_ns, found_ns); }
double DetectionTotals::GivenPrecision() const { return Share(given_true_ns, given_ns); }
double DetectionTotals::GivenRecall() const { return Share(given_true_ns, truth_ns); }
double DetectionTotals::FoundRecall() const { return Share(found_true_ns, truth_ns); }
double DetectionTotals::LearntRecall() const { return Share(given_true_ns, learnt_truth_ns); }

DetectionTotals ScoreDetection(const std::vector<std::vector<TimeInterval>>& truth,
                               const std::vector<std::vector<FoundBubble>>& found,
                               int64_t from_ns) {
  DetectionTotals t;
  for (size_t d = 0; d < truth.size(); ++d) {
    std::vector<TimeInterval> seen;  // the truth from the detector's first look on
    for (const TimeInterval& i : truth[d]) {
      if (i.end_ns <= from_ns || i.end_ns <= i.begin_ns) continue;
      seen.push_back({std::max(i.begin_ns, from_ns), i.end_ns});
      t.truth_ns += seen.back().end_ns - seen.back().begin_ns;
    }
    if (d >= found.size()) continue;
    bool learnt = false;
    for (const FoundBubble& b : found[d]) {
      if (b.ended_ns > b.began_ns) {
        t.found_ns += b.ended_ns - b.began_ns;
        t.found_true_ns += Inside(seen, b.began_ns, b.ended_ns);
      }
      const int64_t given_end = std::min(b.given_end_ns, b.ended_ns);
      if (given_end <= b.announced_ns) continue;
      if (!learnt) {
        learnt = true;
        for (const TimeInterval& i : seen) {
          if (i.end_ns > b.announced_ns) {
            t.learnt_truth_ns += i.end_ns - std::max(i.begin_ns, b.announced_ns);
          }
        }
      }
      t.given_ns += given_end - b.announced_ns;
      t.given_true_ns += Inside(seen, b.announced_ns, given_end);
      auto in = std::upper_bound(seen.begin(), seen.end(), b.announced_ns,
                                 [](int64_t x, const TimeInterval& i) { return x < i.end_ns; });
      if (in != seen.end() && in->begin_ns <= b.announced_ns) {
        t.delay_ms.push_back(static_cast<double>(b.announced_ns - in->begin_ns) / 1e6);
      }
    }
  }
  return t;
}

}  // namespace pswitch::tools
