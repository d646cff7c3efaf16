// Bubbles of a main job found from its device activity alone, with nothing in the job calling
// pswitch (issue 30 item 3; SpecInF's bubble monitor, ../shared/papers). A monitor counts the
// job's kernel launches (CUDA: an interposed library) or its holds of the device (host backend:
// the compute lock) in short windows, 2 ms by default, and feeds them here in order:
//   - a run of empty windows is an idle stretch; once it has lasted `confirm_windows` windows it
//     is a bubble (a kernel launched just before may still be running: the conservative part of
//     SpecInF's phases), announced from the stretch's first empty window; once the phase is
//     kStable, a stretch where a bubble is due is announced once it has lasted a quarter
//     window, and the monitor looks at the device then (NextDueNs) rather than at the next
//     window's end: a window there may be shorter than the others;
//   - the stretches' starts and lengths give the main job's cycle: the period is the shift that
//     maps most stretches onto a later one of about the same length, and the stretches fall
//     into positions within it (PipeFill's cycle of bubbles, fill::BubbleCycle);
//   - a bubble is given until the earliest of its position's last five ends, each moved on by
//     the periods since: an end is seen at the window with the launch that ended it, never
//     after the true one, so a job that repeats itself is not overrun (its jitter aside, which
//     the earliest of five takes up). Until the period is known nothing is given (the phase
//     is kConservative: fill work would only guess); then half of what is left (kIncremental),
//     and all of it once `stable_hits` bubbles in a row came where and as long as predicted
//     (kStable). A prediction that misses drops back to kIncremental.
// A bubble ends at the first window with a launch. Not thread-safe; O(history^2) per stretch,
// with a bounded history.
#ifndef PSWITCH_FILL_BUBBLE_DETECTOR_H_
#define PSWITCH_FILL_BUBBLE_DETECTOR_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "fill/bubble_cycle.h"

namespace pswitch::fill {

// One window of the main job's device activity.
struct ActivityWindow {
  int64_t start_ns = 0;  // CLOCK_MONOTONIC
  int64_t end_ns = 0;
  uint64_t launches = 0;  // kernel launches, or device holds, that fell in it (0: idle)
};

struct BubbleDetectorOptions {
  absl::Duration window = absl::Milliseconds(2);
  // Empty windows before an idle stretch is a bubble.
  int confirm_windows = 2;
  // Shorter idle stretches are gaps between kernels, not bubbles: neither announced nor learnt.
  // (One window learns 1F1B's one-window stretches too, but they are found as one window or two
  // by turns, and the misses keep the phase from kStable: bench-bubbles used less with it.)
  absl::Duration min_bubble = absl::Milliseconds(4);
  // How far (a share of the period, and at least two windows) a stretch may start from where a
  // position predicts it.
  double tolerance = 0.02;
  // Stretches kept to find the period and the positions.
  int history = 48;
  // Predicted bubbles in a row that must come as predicted before the phase is kStable (a stage
  // with one bubble a cycle needs as many cycles).
  int stable_hits = 3;
  // An idle stretch this long is the job stopping (a restart, a checkpoint), not a bubble: what
  // was learnt is forgotten, and the job's cycle is found anew from what follows (a cycle
  // matched across such a gap would be off).
  absl::Duration forget_after = absl::Seconds(1);
};
absl::Status ValidateBubbleDetectorOptions(const BubbleDetectorOptions& options);

enum class DetectionPhase { kConservative, kIncremental, kStable };
const char* DetectionPhaseName(DetectionPhase phase);

class BubbleDetector {
 public:
  // `options` must be valid (ValidateBubbleDetectorOptions).
  explicit BubbleDetector(BubbleDetectorOptions options);

  struct Began {
    int64_t began_ns = 0;  // the stretch's first empty window
    // How long the bubble may be filled from began_ns (0: not to be filled, only learnt).
    absl::Duration expected;
    DetectionPhase phase = DetectionPhase::kConservative;
  };
  struct Ended {
    int64_t began_ns = 0;
    int64_t ended_ns = 0;  // the start of the window with the launch that ended it
  };
  struct Step {
    std::optional<Began> began;  // a bubble was confirmed in this window
    std::optional<Ended> ended;  // the bubble announced before ended in this window
  };
  // The next window (after the previous one; an older or overlapping one is ignored).
  Step Observe(const ActivityWindow& window);

  DetectionPhase phase() const;
  // Once kStable, and outside a stretch: where the next bubble is due after `now_ns` (its
  // position's start a period on), for the monitor to look there. nullopt otherwise.
  std::optional<int64_t> NextDueNs(int64_t now_ns) const;
  // The period found (zero: none yet).
  absl::Duration period() const { return absl::Nanoseconds(period_ns_); }
  // Periods other devices' detectors found (a pipeline's stages share theirs). One that maps
  // this device's stretches as a found period must is taken from three mapped stretches instead
  // of seven: two devices agreeing is no chance, and a stage with one bubble a cycle learns in
  // four cycles instead of eight. Looked at when a stretch ends.
  void SetPeriodHints(std::vector<int64_t> periods_ns);
  // Whether the period was taken from a hint and this device's own stretches do not yet carry
  // it alone: not to be passed on as a hint (an echo is no second opinion).
  bool period_hinted() const { return hinted_; }
  // The cycle of bubbles, as an instrumented job's profiler would register it, once a period is
  // known (not kConservative); `free_bytes` for every bubble (the job's memory is not seen).
  std::optional<BubbleCycle> Cycle(int64_t free_bytes) const;
  uint64_t bubbles() const { return bubbles_; }

 private:
  struct Stretch {
    int64_t start_ns = 0;
    int64_t length_ns = 0;
  };
  int64_t ToleranceNs(int64_t of_ns) const;
  // Whether two stretches' lengths may be the same position's.
  bool SimilarLength(int64_t a_ns, int64_t b_ns) const;
  // The stretch just ended: history, period, and whether it came as predicted.
  void Learn(const Stretch& stretch);
  void FindPeriod();
  // Up to five stretches of the position a stretch starting at `start_ns` is at: one period
  // before it, two, ..., newest first.
  std::vector<const Stretch*> SamePosition(int64_t start_ns) const;
  // How long a stretch starting at `start_ns` should last: the shortest of SamePosition's;
  // nullopt when fewer than two are.
  std::optional<int64_t> PredictLength(int64_t start_ns) const;
  // When a stretch starting at `start_ns` should end (see the file's comment); nullopt when
  // fewer than two of its position are known.
  std::optional<int64_t> PredictEnd(int64_t start_ns) const;
  absl::Duration Expect(int64_t start_ns, int64_t now_ns) const;

  const BubbleDetectorOptions options_;
  const int64_t window_ns_;
  int64_t last_end_ns_ = INT64_MIN;
  std::optional<int64_t> idle_since_ns_;
  bool announced_ = false;
  std::deque<Stretch> history_;  // oldest first
  int64_t period_ns_ = 0;
  int hits_ = 0;  // predicted stretches in a row that came as predicted
  std::vector<int64_t> hints_;
  bool hinted_ = false;  // period_ns_ came from a hint (kept on the evidence it was taken on)
  uint64_t bubbles_ = 0;
};

}  // namespace pswitch::fill

#endif  // PSWITCH_FILL_BUBBLE_DETECTOR_H_
