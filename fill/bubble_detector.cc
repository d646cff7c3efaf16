#include "fill/bubble_detector.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace pswitch::fill {
namespace {

// Stretches needed before a period is looked for, and the share of them a period must map onto
// a later one to be taken (one kept needs less: a disturbed iteration must not lose it).
constexpr size_t kMinStretches = 6;
constexpr double kTakeScore = 0.9;
// Stretches a period must map (onto later ones) before it counts: with fewer, some random job's
// stretches map by chance (at 6, 1 of 400 seeds of AJobWithoutACycleIsNeverFilled did; at 7,
// none).
constexpr int kMinMapped = 7;
// Fewer for a period another device's detector found (SetPeriodHints): two devices agreeing is
// no chance, and a pipeline's stage with one bubble a cycle would need seven cycles otherwise.
constexpr int kMinMappedHinted = 3;
constexpr double kKeepScore = 0.7;
}  // namespace

absl::Status ValidateBubbleDetectorOptions(const BubbleDetectorOptions& o) {
  if (o.window <= absl::ZeroDuration() || o.window > absl::Seconds(1)) {
    return absl::InvalidArgumentError("bubble detector: window must be in (0, 1 s]");
  }
  if (o.confirm_windows < 1 || o.confirm_windows > 1000) {
    return absl::InvalidArgumentError("bubble detector: confirm_windows must be in [1, 1000]");
  }
  if (o.min_bubble < o.window) {
    return absl::InvalidArgumentError("bubble detector: min_bubble must be at least one window");
  }
  if (!(o.tolerance > 0 && o.tolerance < 0.5)) {
    return absl::InvalidArgumentError("bubble detector: tolerance must be in (0, 0.5)");
  }
  if (o.history < static_cast<int>(kMinStretches) || o.history > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("bubble detector: history must be in [", kMinStretches, ", 1024]"));
  }
  if (o.stable_hits < 1) {
    return absl::InvalidArgumentError("bubble detector: stable_hits must be at least 1");
  }
  if (o.forget_after <= o.min_bubble) {
    return absl::InvalidArgumentError("bubble detector: forget_after must exceed min_bubble");
  }
  return absl::OkStatus();
}

const char* DetectionPhaseName(DetectionPhase phase) {
  switch (phase) {
    case DetectionPhase::kConservative:
      return "conservative";
    case DetectionPhase::kIncremental:
      return "incremental";
    case DetectionPhase::kStable:
      return "stable";
  }
  return "unknown";
}

BubbleDetector::BubbleDetector(BubbleDetectorOptions options)
    : options_(options), window_ns_(absl::ToInt64Nanoseconds(options.window)) {}

int64_t BubbleDetector::ToleranceNs(int64_t of_ns) const {
  return std::max<int64_t>(2 * window_ns_, static_cast<int64_t>(options_.tolerance * of_ns));
}

bool BubbleDetector::SimilarLength(int64_t a_ns, int64_t b_ns) const {
  // An end is known to a window, a length to two, and a job's bubbles jitter by as much again:
  // lengths tell positions apart, not iterations.
  return std::llabs(a_ns - b_ns) <=
         std::max<int64_t>(4 * window_ns_, static_cast<int64_t>(0.25 * std::max(a_ns, b_ns)));
}

DetectionPhase BubbleDetector::phase() const {
  if (period_ns_ == 0) return DetectionPhase::kConservative;
  return hits_ >= options_.stable_hits ? DetectionPhase::kStable : DetectionPhase::kIncremental;
}

BubbleDetector::Step BubbleDetector::Observe(const ActivityWindow& window) {
  Step step;
  if (window.end_ns <= window.start_ns || window.start_ns < last_end_ns_) return step;
  last_end_ns_ = window.end_ns;
  if (window.launches == 0) {
    if (!idle_since_ns_) {
      idle_since_ns_ = window.start_ns;
      announced_ = false;
    }
    // Once stable, idle where a bubble is due is that bubble at once (SpecInF's stable phase),
    // after a quarter window (a look a few microseconds long proves nothing on a GPU, where
    // kernels queued before may still run); otherwise a stretch must last confirm_windows
    // (in time: the monitor's look where a bubble is due makes a shorter window).
    const int64_t idle_ns = window.end_ns - *idle_since_ns_;
    const bool due = idle_ns >= window_ns_ / 4 && phase() == DetectionPhase::kStable &&
                     PredictEnd(*idle_since_ns_).has_value();
    const bool confirmed = idle_ns >= options_.confirm_windows * window_ns_;
    if (!announced_ && (due || confirmed)) {
      announced_ = true;
      ++bubbles_;
      step.began = Began{*idle_since_ns_, Expect(*idle_since_ns_, window.end_ns), phase()};
    }
    return step;
  }
  if (idle_since_ns_) {
    // The launch may lie anywhere in the window: the stretch ends at its start, no later.
    const Stretch stretch{*idle_since_ns_, window.start_ns - *idle_since_ns_};
    if (announced_) step.ended = Ended{stretch.start_ns, window.start_ns};
    if (stretch.length_ns >= absl::ToInt64Nanoseconds(options_.forget_after)) {
      history_.clear();
      period_ns_ = 0;
      hinted_ = false;
      hits_ = 0;
    } else if (stretch.length_ns >= absl::ToInt64Nanoseconds(options_.min_bubble)) {
      Learn(stretch);
    }
    idle_since_ns_.reset();
    announced_ = false;
  }
  return step;
}

void BubbleDetector::Learn(const Stretch& stretch) {
  if (period_ns_ > 0) {
    const std::optional<int64_t> predicted = PredictLength(stretch.start_ns);
    hits_ = predicted && SimilarLength(*predicted, stretch.length_ns) ? hits_ + 1 : 0;
  }
  history_.push_back(stretch);
  while (history_.size() > static_cast<size_t>(options_.history)) history_.pop_front();
  FindPeriod();
}

void BubbleDetector::FindPeriod() {
  // For a shift `p`: the share of stretches that have a later one of about their length about
  // `p` after them, among those that could, and the mean shift of those matches (`p` less the
  // jitter of the two stretches it was taken from).
  struct Fit {
    double score = 0;
    int64_t period_ns = 0;
    int64_t spread_ns = 0;  // the matches' mean distance from their mean shift
  };
  auto fit = [this](int64_t p, int min_mapped) -> Fit {
    const int64_t tolerance = ToleranceNs(p);
    const int64_t newest = history_.back().start_ns;
    // Three cycles at least, to tell a cycle from chance: a shift near the history's span maps
    // few stretches, and some of any random job's map by luck.
    if (p * 3 > newest - history_.front().start_ns) return {};
    int could = 0;
    std::vector<int64_t> shifts;  // of the matches
    for (size_t a = 0; a < history_.size(); ++a) {
      const int64_t target = history_[a].start_ns + p;
      if (target > newest + tolerance) break;
      ++could;
      // The nearest to the target of those about as long (the first found could be a
      // neighbour closer together than the tolerance).
      std::optional<size_t> nearest;
      for (size_t b = a + 1; b < history_.size(); ++b) {
        if (history_[b].start_ns > target + tolerance) break;
        if (std::llabs(history_[b].start_ns - target) <= tolerance &&
            SimilarLength(history_[a].length_ns, history_[b].length_ns) &&
            (!nearest || std::llabs(history_[b].start_ns - target) <
                             std::llabs(history_[*nearest].start_ns - target))) {
          nearest = b;
        }
      }
      if (nearest) shifts.push_back(history_[*nearest].start_ns - history_[a].start_ns);
    }
    if (could < min_mapped || shifts.empty()) return {};
    const int64_t matched = static_cast<int64_t>(shifts.size());
    int64_t sum = 0;
    for (const int64_t shift : shifts) sum += shift;
    const int64_t mean = sum / matched;
    int64_t spread = 0;
    for (const int64_t shift : shifts) spread += std::llabs(shift - mean);
    return {static_cast<double>(matched) / could, mean, spread / matched};
  };
  // Candidates: from a recent stretch back to an earlier one of about its length. The best
  // supported wins; among about equals the shortest (a multiple of the period scores as well),
  // but of two within the tolerance of each other (one period, two estimates: one that maps
  // some stretches onto a neighbour of about their length) the one whose matches agree best.
  Fit best;
  // Too few stretches to search: only a hint may be taken.
  const size_t first_recent = history_.size() < kMinStretches
                                  ? history_.size()
                                  : history_.size() - std::min<size_t>(3, history_.size());
  for (size_t recent = first_recent; recent < history_.size(); ++recent) {
    for (size_t i = 0; i < recent; ++i) {
      if (!SimilarLength(history_[i].length_ns, history_[recent].length_ns)) continue;
      const int64_t p = history_[recent].start_ns - history_[i].start_ns;
      if (p < 2 * window_ns_) continue;
      Fit f = fit(p, kMinMapped);
      if (f.score < kTakeScore) continue;
      f = std::max(fit(f.period_ns, kMinMapped), f,
                   [](const Fit& x, const Fit& y) { return x.score < y.score; });
      const bool same_period =
          std::llabs(f.period_ns - best.period_ns) <= ToleranceNs(best.period_ns);
      if (best.period_ns == 0 || f.score > best.score + 0.05 ||
          (f.score >= best.score - 0.05 &&
           (same_period ? f.spread_ns < best.spread_ns : f.period_ns < best.period_ns))) {
        best = f;
      }
    }
  }
  // Else another device's period that maps this one's stretches.
  bool from_hint = false;
  if (best.period_ns == 0) {
    for (const int64_t p : hints_) {
      const Fit f = fit(p, kMinMappedHinted);
      if (f.score >= kTakeScore && f.score > best.score) {
        best = f;
        from_hint = true;
      }
    }
  }
  // The period kept while it still holds (a round's best may be a multiple of it), refined to
  // its matches' mean shift, replaced by a shorter one that holds, or dropped once it no longer
  // holds.
  Fit current = period_ns_ != 0 ? fit(period_ns_, hinted_ ? kMinMappedHinted : kMinMapped) : Fit{};
  if (best.period_ns != 0 &&
      (current.score < kKeepScore || best.period_ns < period_ns_ - ToleranceNs(period_ns_))) {
    period_ns_ = best.period_ns;
    hinted_ = from_hint;
    hits_ = 0;  // a new period earns its confidence anew
  } else if (current.score >= kKeepScore) {
    // Refined to its matches' mean shift, or to a better estimate of the same period whose
    // matches agree more (its confidence stays: the same positions, placed more exactly).
    const bool better_estimate =
        best.period_ns != 0 && best.score >= current.score - 0.05 &&
        std::llabs(best.period_ns - period_ns_) <= ToleranceNs(period_ns_) &&
        best.spread_ns < current.spread_ns;
    period_ns_ = better_estimate ? best.period_ns : current.period_ns;
    // Once this device's own stretches carry it, it is this device's finding.
    if (hinted_ && fit(period_ns_, kMinMapped).score >= kKeepScore) hinted_ = false;
  } else {
    period_ns_ = 0;
    hinted_ = false;
    hits_ = 0;
  }
}

void BubbleDetector::SetPeriodHints(std::vector<int64_t> periods_ns) {
  hints_ = std::move(periods_ns);
  // A hint that arrives just after a stretch ended need not wait for the next one.
  if (period_ns_ == 0 && !hints_.empty() && !history_.empty()) FindPeriod();
}

std::vector<const BubbleDetector::Stretch*> BubbleDetector::SamePosition(int64_t start_ns) const {
  // The stretch nearest one period before, within the tolerance, then the one nearest a period
  // before that, ... (each from the last found: an estimate a little off the true period drifts
  // by one period's error only). The nearest, not the first found: a job's short stretches may
  // lie closer together than the tolerance.
  std::vector<const Stretch*> found;
  if (period_ns_ == 0) return found;
  const int64_t tolerance = ToleranceNs(period_ns_);
  int64_t at = start_ns;
  while (found.size() < 5) {
    const int64_t target = at - period_ns_;
    auto it = std::lower_bound(history_.begin(), history_.end(), target,
                               [](const Stretch& s, int64_t t) { return s.start_ns < t; });
    const Stretch* nearest = nullptr;
    if (it != history_.end()) nearest = &*it;
    if (it != history_.begin() &&
        (nearest == nullptr || target - std::prev(it)->start_ns < nearest->start_ns - target)) {
      nearest = &*std::prev(it);
    }
    if (nearest == nullptr || std::llabs(nearest->start_ns - target) > tolerance ||
        nearest->start_ns >= at) {
      break;
    }
    found.push_back(nearest);
    at = nearest->start_ns;
  }
  return found;
}

std::optional<int64_t> BubbleDetector::PredictLength(int64_t start_ns) const {
  const std::vector<const Stretch*> same = SamePosition(start_ns);
  if (same.size() < 2) return std::nullopt;
  // The shortest: a fill step past the bubble's end delays the main job, one short of it only
  // leaves a little unused (a median overruns every other bubble of a jittering job).
  int64_t shortest = same[0]->length_ns;
  for (const Stretch* s : same) shortest = std::min(shortest, s->length_ns);
  return shortest;
}

std::optional<int64_t> BubbleDetector::PredictEnd(int64_t start_ns) const {
  // Each end moved on by the periods it lies back. Taken from the ends, not start plus length:
  // a start is known to a window late, so start plus the shortest length would need a window's
  // margin, an end none.
  const std::vector<const Stretch*> same = SamePosition(start_ns);
  if (same.size() < 2) return std::nullopt;
  std::optional<int64_t> earliest;
  for (size_t i = 0; i < same.size(); ++i) {
    const int64_t end =
        same[i]->start_ns + same[i]->length_ns + static_cast<int64_t>(i + 1) * period_ns_;
    earliest = earliest ? std::min(*earliest, end) : end;
  }
  // A period estimated a little long moves older ends later, and the earliest is then the
  // newest's: one period's error. One estimated short makes the oldest the earliest, five
  // periods' error, on the safe side: less is given, nothing overrun (FindPeriod keeps the
  // estimate whose matches agree best).
  return earliest;
}

std::optional<int64_t> BubbleDetector::NextDueNs(int64_t now_ns) const {
  if (phase() != DetectionPhase::kStable || idle_since_ns_ || history_.empty()) return std::nullopt;
  // The last period's stretches, each a whole number of periods on, the first after now.
  const int64_t newest = history_.back().start_ns;
  const int64_t tolerance = ToleranceNs(period_ns_);
  std::optional<int64_t> due;
  for (auto it = history_.rbegin(); it != history_.rend(); ++it) {
    if (it->start_ns <= newest - period_ns_ + tolerance) break;
    const int64_t periods = now_ns < it->start_ns ? 1 : (now_ns - it->start_ns) / period_ns_ + 1;
    const int64_t at = it->start_ns + periods * period_ns_;
    due = due ? std::min(*due, at) : at;
  }
  return due;
}

absl::Duration BubbleDetector::Expect(int64_t start_ns, int64_t now_ns) const {
  const DetectionPhase now_phase = phase();
  if (now_phase == DetectionPhase::kConservative) return absl::ZeroDuration();
  const std::optional<int64_t> end = PredictEnd(start_ns);
  if (!end) return absl::ZeroDuration();
  const int64_t elapsed = now_ns - start_ns;
  const int64_t remaining = *end - now_ns;
  if (remaining <= 0) return absl::ZeroDuration();
  const double share = now_phase == DetectionPhase::kStable ? 1.0 : 0.5;
  return absl::Nanoseconds(elapsed + static_cast<int64_t>(share * static_cast<double>(remaining)));
}

std::optional<BubbleCycle> BubbleDetector::Cycle(int64_t free_bytes) const {
  if (phase() == DetectionPhase::kConservative) return std::nullopt;
  // The last period's stretches, each with its position's length, from the earliest of them.
  BubbleCycle cycle;
  cycle.period = absl::Nanoseconds(period_ns_);
  const int64_t newest = history_.back().start_ns;
  const int64_t tolerance = ToleranceNs(period_ns_);
  std::optional<int64_t> first;
  for (const Stretch& s : history_) {
    if (s.start_ns <= newest - period_ns_ + tolerance) continue;
    const std::optional<int64_t> length = PredictLength(s.start_ns);
    if (!length) continue;
    if (!first) first = s.start_ns;
    cycle.bubbles.push_back(
        {absl::Nanoseconds(s.start_ns - *first), absl::Nanoseconds(*length), free_bytes});
  }
  // None with no bubble to fill (a cycle of none would tell the fill side there is nothing here).
  if (cycle.bubbles.empty() || !ValidateBubbleCycle(cycle).ok()) return std::nullopt;
  return cycle;
}

}  // namespace pswitch::fill
