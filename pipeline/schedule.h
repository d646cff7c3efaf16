// Pipeline-parallel schedules: the order in which each stage runs the forward and backward pass
// of every micro-batch in one training iteration (one optimizer step, flushed at the end).
//
// GPipe runs all M forwards, then all M backwards, so a stage keeps M micro-batches' activations
// alive. 1F1B (PipeDream-flush, as in Megatron-LM) runs S-s-1 warm-up forwards on stage s, then
// alternates one forward and one backward, then drains the remaining backwards: the same bubble
// time as GPipe for uniform op costs, but at most S-s micro-batches in flight on stage s.
// Backwards run in micro-batch order in both, so each link carries messages in FIFO order.
//
// Pure logic, no libtorch; thread-compatible value types.
#ifndef PSWITCH_PIPELINE_SCHEDULE_H_
#define PSWITCH_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pswitch::pipeline {

enum class ScheduleKind { kGpipe, kOneFOneB };

// "gpipe" or "1f1b"; InvalidArgument names the accepted spellings otherwise.
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view text);
absl::string_view ScheduleKindName(ScheduleKind kind);

enum class OpKind { kForward, kBackward };

struct Op {
  OpKind kind = OpKind::kForward;
  int microbatch = 0;

  bool operator==(const Op& other) const = default;
};

// "F3" / "B3".
std::string OpName(const Op& op);

struct Schedule {
  ScheduleKind kind = ScheduleKind::kGpipe;
  int stages = 0;
  int microbatches = 0;
  std::vector<std::vector<Op>> ops;  // ops[s]: stage s's sequence, 2 * microbatches ops
};

// Upper bounds that keep a mistyped flag from allocating gigabytes of schedule.
inline constexpr int kMaxStages = 64;
inline constexpr int kMaxMicrobatches = 4096;

// The schedule of `kind` for `stages` x `microbatches`; InvalidArgument when either is < 1 or
// above the limits.
absl::StatusOr<Schedule> BuildSchedule(ScheduleKind kind, int stages, int microbatches);

// OK when every stage runs each micro-batch's forward and backward exactly once, forward first.
// (Cross-stage order is checked by the simulator, which reports a deadlock.)
absl::Status ValidateSchedule(const Schedule& schedule);

// Most micro-batches whose forward has run and backward has not, over `ops` (one stage): the
// number of activation sets the stage holds at its peak.
int PeakInFlight(const std::vector<Op>& ops);

}  // namespace pswitch::pipeline

#endif  // PSWITCH_PIPELINE_SCHEDULE_H_
