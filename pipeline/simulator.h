// Predicts one iteration of a pipeline schedule from per-stage op costs, with zero
// communication time: each stage runs its ops in schedule order, an op starting as soon as the
// stage is free and its input has been produced (the forward on the stage before, or the
// backward on the stage after). The gaps are the bubbles a co-located job can fill; their offsets
// and durations are what a stage announces through BubbleReporter::BubbleBegin.
//
// Every iteration ends with a flush (the optimizer step, taken as free here), so the prediction
// for one iteration holds for every iteration. Pure logic; thread-compatible value types.
#ifndef PSWITCH_PIPELINE_SIMULATOR_H_
#define PSWITCH_PIPELINE_SIMULATOR_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pipeline/schedule.h"

namespace pswitch::pipeline {

// What one micro-batch's forward and backward cost on one stage.
struct StageCost {
  absl::Duration forward;
  absl::Duration backward;
};

struct TimedOp {
  Op op;
  absl::Duration start;  // offsets from the iteration's start
  absl::Duration end;
};

// A stretch of time a stage spends waiting. `before_op` is the index (into the stage's ops) of
// the op the stage waits to run; ops.size() for the wait at the iteration's end for the stages
// still running.
struct IdleInterval {
  int before_op = 0;
  absl::Duration start;  // offset from the iteration's start
  absl::Duration duration;
};

struct StageTimeline {
  std::vector<TimedOp> ops;        // in schedule order
  std::vector<IdleInterval> idle;  // non-empty gaps only, in time order
  absl::Duration busy;             // sum of op durations
  absl::Duration idle_total;       // iteration - busy

  // The predicted idle time before op `index` (ops.size(): the end-of-iteration wait); zero
  // where the stage should not wait.
  absl::Duration IdleBefore(int index) const;
};

struct SimulatedIteration {
  absl::Duration iteration;           // last op's end on any stage
  std::vector<StageTimeline> stages;  // one per stage
  double bubble_ratio = 0;            // total idle / (stages * iteration)
};

// Simulates `schedule` with `costs[s]` for stage s. InvalidArgument when the sizes disagree, a
// cost is negative, or the schedule is invalid; FailedPrecondition naming the stuck ops when the
// schedule deadlocks (an op waits for one that is ordered after it).
absl::StatusOr<SimulatedIteration> Simulate(const Schedule& schedule,
                                            const std::vector<StageCost>& costs);

// The analytic bubble ratio of GPipe and 1F1B with uniform op costs: (S-1) / (M+S-1).
double UniformBubbleRatio(int stages, int microbatches);

}  // namespace pswitch::pipeline

#endif  // PSWITCH_PIPELINE_SIMULATOR_H_
