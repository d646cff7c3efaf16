// What a pipeline run measured, next to what the simulator predicted: per-iteration wall time,
// per-stage busy and bubble time, and the bubble ratio. Stages measure their own ops and waits;
// the coordinator measures each iteration's wall time and, from it, every stage's idle tail.
// Thread-compatible value types.
#ifndef PSWITCH_PIPELINE_REPORT_H_
#define PSWITCH_PIPELINE_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"

namespace pswitch::pipeline {

// One wait of a stage inside an iteration, announced to its BubbleReporter.
struct MeasuredWait {
  int before_op = 0;     // as IdleInterval::before_op; ops.size(): the tied-weight exchange
  absl::Duration start;  // offset from the iteration's start
  absl::Duration duration;
  absl::Duration expected;  // the simulator's prediction for this point
};

// One stage's account of one iteration.
struct StageIterationStats {
  int stage = 0;
  absl::Duration finish;    // offset from the iteration's start when the stage was done
  absl::Duration forward;   // time in forward ops
  absl::Duration backward;  // time in backward ops
  absl::Duration step;      // optimizer step
  std::vector<MeasuredWait> waits;
  int peak_in_flight = 0;  // most micro-batches held between forward and backward
  double loss = 0;         // last stage only
  // Set by the coordinator: wall time - finish, the wait at the barrier for the other stages.
  absl::Duration tail;

  absl::Duration Busy() const { return forward + backward + step; }
  absl::Duration Waiting() const;  // waits + tail
};

struct IterationStats {
  int iteration = 0;
  bool warmup = false;
  absl::Duration wall;  // coordinator: Start sent -> the last stage's Done received
  double loss = 0;
  std::vector<StageIterationStats> stages;
};

struct PipelineReport {
  ScheduleKind schedule = ScheduleKind::kGpipe;
  int stages = 0;
  int microbatches = 0;
  std::vector<StageCost> costs;  // per stage, as profiled or configured
  SimulatedIteration predicted;
  std::vector<IterationStats> iterations;  // warm-up ones first
};

struct StageSummary {
  absl::Duration busy, bubble, other;  // means per measured iteration
  int peak_in_flight = 0;
};

// Means over the iterations that are not warm-up.
struct ReportSummary {
  int iterations = 0;
  absl::Duration wall_mean, wall_min, wall_max;
  double bubble_ratio = 0;  // sum of stage bubbles / (stages * wall), over all iterations
  double final_loss = 0;
  std::vector<StageSummary> stages;
};

ReportSummary Summarize(const PipelineReport& report);

// A human-readable table; `mode` describes the compute ("simulated 5 ms / 10 ms", "gpt2 ...").
std::string FormatSummary(const PipelineReport& report, const std::string& mode);

// The report and its summary as JSON text (durations in milliseconds).
std::string ReportJson(const PipelineReport& report, const std::string& mode);
// Writes ReportJson to `path`; an error names the path.
absl::Status WriteReportJson(const PipelineReport& report, const std::string& mode,
                             const std::string& path);

}  // namespace pswitch::pipeline

#endif  // PSWITCH_PIPELINE_REPORT_H_
