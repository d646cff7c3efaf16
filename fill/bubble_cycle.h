// A pipeline stage's bubble cycle: the bubbles one GPU sees in every iteration of the main
// training job, which repeat with the iteration's period (PipeFill §4.3, "a cycle of bubbles
// that repeats every minibatch iteration").
//
// JSON form (all fields required, no others allowed, integers only):
//   {"period_ns": int, "bubbles": [{"offset_ns": int, "duration_ns": int, "free_bytes": int}]}
// Nanoseconds keep a round trip exact.
#ifndef PSWITCH_FILL_BUBBLE_CYCLE_H_
#define PSWITCH_FILL_BUBBLE_CYCLE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace pswitch::fill {

// One bubble: [offset, offset + duration) from the start of the cycle, with `free_bytes` of
// GPU memory the main job leaves free for its whole length.
struct Bubble {
  absl::Duration offset;
  absl::Duration duration;
  int64_t free_bytes = 0;

  absl::Duration end() const { return offset + duration; }
  friend bool operator==(const Bubble&, const Bubble&) = default;
};

struct BubbleCycle {
  absl::Duration period;        // the main job's iteration time
  std::vector<Bubble> bubbles;  // in time order; may be empty (a stage with nothing to fill)

  friend bool operator==(const BubbleCycle&, const BubbleCycle&) = default;
};

// OK when the period is positive and finite and the bubbles have offset >= 0, duration > 0,
// free_bytes >= 0, end within the period, and each starts no earlier than the previous one ends
// (touching is allowed). Otherwise InvalidArgument naming the field and index, e.g.
// "bubble cycle: bubbles[2].offset_ns 40000000 is before the end of bubbles[1] (45000000)".
absl::Status ValidateBubbleCycle(const BubbleCycle& cycle);

nlohmann::ordered_json BubbleCycleToJson(const BubbleCycle& cycle);

// Inverse of BubbleCycleToJson, then ValidateBubbleCycle. Never throws: a missing, unknown or
// wrongly typed field is InvalidArgument naming it.
absl::StatusOr<BubbleCycle> BubbleCycleFromJson(const nlohmann::json& json);
// Parses `text` as JSON first; malformed text is InvalidArgument.
absl::StatusOr<BubbleCycle> ParseBubbleCycleJson(absl::string_view text);

// Builds a cycle from bubbles observed over several iterations of the main job. The caller
// marks each iteration's start; an iteration is complete once the next one starts, and Build
// uses complete iterations only. A bubble is known by its position in the stage's schedule (the
// op it waits before), not by its rank in the iteration: a short wait that comes and goes (a
// message arriving just in time, or already waiting) must not shift the others. Positions seen
// in more than half the iterations form the cycle; per position it takes the (lower) median
// offset and duration, so one disturbed iteration does not move the cycle, and the minimum free
// memory, since a fill job sized to the median would run out of memory in the leaner
// iterations. Not thread-safe.
class BubbleCycleProfiler {
 public:
  BubbleCycleProfiler() = default;

  // Ends the current iteration (if any) and starts the next at `start`, which must be after
  // the previous start and not before the last recorded bubble's end. InvalidArgument otherwise.
  absl::Status StartIteration(absl::Time start);

  // Records the bubble at schedule `position` of the current iteration. FailedPrecondition
  // before the first StartIteration; InvalidArgument unless begin < end, free_bytes >= 0, begin
  // is not before the iteration's start (an iteration boundary must not fall inside a bubble)
  // nor before the previous bubble's end, and the iteration has no bubble at `position` yet.
  absl::Status RecordBubble(int position, absl::Time begin, absl::Time end, int64_t free_bytes);

  int complete_iterations() const;

  // The cycle over the complete iterations (period: median iteration time).
  // FailedPrecondition with no complete iteration; InvalidArgument when the medians do not form
  // a valid cycle.
  absl::StatusOr<BubbleCycle> Build() const;

 private:
  struct ObservedBubble {
    int position = 0;
    absl::Duration offset;  // from its iteration's start
    absl::Duration duration;
    int64_t free_bytes = 0;
  };
  struct Iteration {
    absl::Time start;
    std::vector<ObservedBubble> bubbles;
  };

  std::vector<Iteration> iterations_;  // the last one is still open
};

}  // namespace pswitch::fill

#endif  // PSWITCH_FILL_BUBBLE_CYCLE_H_
