#include "fill/fill_job.h"

#include "absl/strings/str_cat.h"

namespace pswitch::fill {

absl::Status ValidateFillJob(const FillJob& job) {
  const auto invalid = [&job](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("fill job ", job.id, ": ", parts...));
  };
  if (job.steps_total <= 0) return invalid("steps_total must be > 0, got ", job.steps_total);
  if (job.steps_done < 0 || job.steps_done >= job.steps_total) {
    return invalid("steps_done must be in [0, ", job.steps_total, "), got ", job.steps_done);
  }
  if (job.step_duration <= absl::ZeroDuration() || job.step_duration == absl::InfiniteDuration()) {
    return invalid("step_duration must be finite and > 0, got ",
                   absl::FormatDuration(job.step_duration));
  }
  if (job.memory_bytes <= 0) return invalid("memory_bytes must be > 0, got ", job.memory_bytes);
  if (job.submitted == absl::InfinitePast() || job.submitted == absl::InfiniteFuture()) {
    return invalid("submitted must be a finite time");
  }
  if (job.deadline.has_value() &&
      (*job.deadline == absl::InfinitePast() || *job.deadline == absl::InfiniteFuture())) {
    return invalid("deadline must be a finite time when set");
  }
  return absl::OkStatus();
}

}  // namespace pswitch::fill
