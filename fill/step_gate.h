// FreeRide's program-directed limit on GPU execution time (§3.2.3): before each RunNextStep the
// task checks that the bubble has room for the whole step, so a step never runs into the main
// job's next operation. Pure functions of durations; the caller reads the clock.
//
// The prediction a gate compares against comes from StepProfile, which starts at the offline
// profiled step time and follows measured steps. It is deliberately pessimistic: an overrun
// slows the main training job, a step left out only idles the rest of one bubble. The
// prediction is the larger of
//   - the longest of the last `window` samples (the profiled time counts as the first sample),
//     which reacts to a slow step at once and forgets it after `window` steps; and
//   - mean + deviation_multiplier * mean deviation, both exponentially weighted (the
//     Jacobson/Karels estimator TCP uses for its retransmission timeout, RFC 6298), which
//     covers jitter that the recent window happens not to contain.
// With steady samples both terms equal the step time; the estimate only grows with variance.
#ifndef PSWITCH_FILL_STEP_GATE_H_
#define PSWITCH_FILL_STEP_GATE_H_

#include <cstdint>
#include <deque>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pswitch::fill {

// True when a step predicted to take `predicted_step` may start with `bubble_remaining` left in
// the bubble: remaining > predicted + margin (strictly, as the paper's "exceeds"). A negative
// margin counts as zero; an infinite remaining time admits any finite step.
bool MayStartStep(absl::Duration bubble_remaining, absl::Duration predicted_step,
                  absl::Duration safety_margin);

// A resident run's training step that does not end in its bubble waits at its cut point for the
// next one (worker/fill_steps.h, SetSuspendable): it may start with room for this fraction of it,
// and placement sees such a job's steps as this many parts.
inline constexpr int64_t kSuspendParts = 8;

// The same rule for a bubble that ends at `bubble_end`, checked at `now`.
bool MayStartStep(absl::Time now, absl::Time bubble_end, absl::Duration predicted_step,
                  absl::Duration safety_margin);

struct StepProfileOptions {
  int window = 32;                    // recent samples kept for the max rule, >= 1
  double mean_gain = 0.125;           // EWMA weight of a new sample, in (0, 1] (RFC 6298 alpha)
  double deviation_gain = 0.25;       // EWMA weight of a new deviation, in (0, 1] (beta)
  double deviation_multiplier = 4.0;  // >= 0 (RFC 6298 K)
};

// A task's predicted step duration. Not thread-safe: owned by the task's gate.
class StepProfile {
 public:
  // Starts from the offline profiled step time, which must be positive and finite; the options
  // must be in the ranges above. InvalidArgument otherwise.
  static absl::StatusOr<StepProfile> Create(absl::Duration profiled_step,
                                            StepProfileOptions options = {});

  // Adds a measured step duration; InvalidArgument (and no change) unless it is finite and >= 0.
  absl::Status Record(absl::Duration measured_step);

  // The duration to pass to MayStartStep for the next step (see the file comment).
  absl::Duration Predicted() const;

  // Measured samples recorded so far (the profiled time is not counted).
  int64_t samples() const { return samples_; }
  absl::Duration mean() const { return mean_; }
  absl::Duration deviation() const { return deviation_; }

 private:
  StepProfile(absl::Duration profiled_step, StepProfileOptions options);

  StepProfileOptions options_;
  std::deque<absl::Duration> recent_;  // at most options_.window, newest at the back
  absl::Duration mean_;
  absl::Duration deviation_ = absl::ZeroDuration();
  int64_t samples_ = 0;
};

}  // namespace pswitch::fill

#endif  // PSWITCH_FILL_STEP_GATE_H_
