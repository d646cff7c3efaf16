// A fill job as the scheduler sees it: a number of equal steps (training iterations or
// inference batches) with a profiled step time and GPU memory need.
#ifndef PSWITCH_FILL_FILL_JOB_H_
#define PSWITCH_FILL_FILL_JOB_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace pswitch::fill {

struct FillJob {
  uint64_t id = 0;
  int64_t steps_total = 0;             // > 0
  int64_t steps_done = 0;              // in [0, steps_total)
  absl::Duration step_duration;        // > 0, finite: the profiled (or gate-predicted) step time
  int64_t memory_bytes = 0;            // > 0: GPU memory the job holds while PAUSED or RUNNING
  absl::Time submitted;                // finite
  std::optional<absl::Time> deadline;  // finite when set

  int64_t steps_left() const { return steps_total - steps_done; }
};

// InvalidArgument naming the job and the first field out of the ranges above, e.g.
// "fill job 7: memory_bytes must be > 0, got 0". Zero memory is rejected because it is almost
// always a field the submitter forgot to fill in.
absl::Status ValidateFillJob(const FillJob& job);

}  // namespace pswitch::fill

#endif  // PSWITCH_FILL_FILL_JOB_H_
