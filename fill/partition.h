// PipeFill's fill-job execution plan (Algorithm 1): which bubbles of a stage's cycle run how
// many steps of a fill job, and when the job completes.
//
// The job is N equal steps (duration d, memory m) rather than PipeFill's graph nodes, so the
// greedy packing reduces to a count per bubble: walking bubbles in time order, cycle after
// cycle, a bubble with free_bytes < m runs nothing and any other runs the largest k with
// o + k*d < duration (o: the switch-in overhead paid at the start of every bubble used), capped
// at the steps left. The inequality is strict as in Algorithm 1 line 12 and FreeRide's gate
// ("remaining time exceeds the step"), so a step never ends exactly at the bubble's end and
// the plan never counts a step the runtime gate (step_gate.h) would refuse.
//
// Times are on the cycle timeline: 0 is the start of cycle 0, cycle c covers
// [c * period, (c + 1) * period). A plan starting at `start` uses only bubbles that begin at or
// after it; a bubble already under way is skipped.
#ifndef PSWITCH_FILL_PARTITION_H_
#define PSWITCH_FILL_PARTITION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fill/bubble_cycle.h"

namespace pswitch::fill {

// What the planner needs to know about a fill job's remaining work on one stage.
struct FillWork {
  int64_t steps = 0;               // >= 0
  absl::Duration step_duration;    // > 0: the gate's prediction (plus margin, if any)
  int64_t memory_bytes = 0;        // >= 0
  absl::Duration switch_overhead;  // >= 0, paid at the start of every bubble the job uses
};

// `steps` steps run in bubble `bubble` of cycle `cycle`.
struct PlanChunk {
  int64_t cycle = 0;
  int bubble = 0;
  int64_t steps = 0;

  friend bool operator==(const PlanChunk&, const PlanChunk&) = default;
};

struct PartitionPlan {
  std::vector<PlanChunk> chunks;  // in time order, each with steps > 0
  absl::Duration completion;      // when the last step ends, on the cycle timeline
};

// PartitionFillJob refuses plans with more chunks than this; PredictFillCompletion has no limit.
inline constexpr int64_t kMaxPlanChunks = int64_t{1} << 20;

// Steps of `work` one run of `bubble` can hold (0 when its memory or time is too small),
// ignoring how many steps the job has left.
int64_t StepsPerBubble(const Bubble& bubble, const FillWork& work);

// InvalidArgument naming the first field out of the ranges above.
absl::Status ValidateFillWork(const FillWork& work);

// The plan for `work` from `start` (finite, >= 0). InvalidArgument for an invalid cycle, work
// or start; ResourceExhausted when no bubble of the cycle can hold a single step (saying
// whether memory or time is short); OutOfRange when the plan would exceed kMaxPlanChunks.
// Zero steps give an empty plan completing at `start`.
absl::StatusOr<PartitionPlan> PartitionFillJob(const BubbleCycle& cycle, const FillWork& work,
                                               absl::Duration start);

// PartitionFillJob(...).completion without listing the chunks: O(bubbles) whatever the steps.
absl::StatusOr<absl::Duration> PredictFillCompletion(const BubbleCycle& cycle, const FillWork& work,
                                                     absl::Duration start);

}  // namespace pswitch::fill

#endif  // PSWITCH_FILL_PARTITION_H_
