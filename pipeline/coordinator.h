// Runs a whole pipeline: creates the links, launches one process (or, in tests, one thread) per
// stage, profiles the stages one at a time (so they do not compete for cores while measured),
// sends every stage the plan, then drives warm-up + measured iterations with a barrier at each
// iteration's end, and stops the stages.
//
// Failure: a stage that reports an error, dies, or misses the iteration deadline fails the run.
// The coordinator then gives the other stages a moment to report (a crash makes its neighbours
// fail with "peer closed"), kills what is left, reaps every child, and returns an error that
// names the root-cause stage first. No call blocks without a deadline.
#ifndef PSWITCH_PIPELINE_COORDINATOR_H_
#define PSWITCH_PIPELINE_COORDINATOR_H_

#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pipeline/report.h"
#include "pipeline/schedule.h"
#include "pipeline/stage_runner.h"

namespace pswitch::pipeline {

enum class StageLaunch {
  kProcesses,  // fork() per stage; the caller must be single-threaded or fork-safe
  kThreads,    // std::thread per stage, for tests that inspect the stages' state afterwards
};

struct PipelineOptions {
  ScheduleKind schedule = ScheduleKind::kGpipe;
  int stages = 4;
  int microbatches = 8;
  int warmup = 1;       // iterations run first and marked warm-up in the report
  int iterations = 10;  // measured iterations
  // Connect the first and last stage for a weight they share (GPT-2's tied embedding).
  bool tied_link = false;
  // A stage's longest wait for one message; the coordinator waits at most this long plus the
  // predicted iteration time for an iteration.
  absl::Duration receive_timeout = absl::Seconds(60);
  // Building and profiling one stage.
  absl::Duration setup_timeout = absl::Minutes(5);
  StageLaunch launch = StageLaunch::kProcesses;
};

// Runs one stage: builds its compute and bubble reporter, then calls ServeStage(config, links,
// ...). `config` arrives filled in (stage, schedule, timeout) for the body to complete. In
// process mode it runs in the forked child, which exits when it returns; an error it returns
// is sent to the coordinator. Exceptions are caught and reported as Internal.
using StageMain = std::function<absl::Status(StageConfig config, StageLinks& links)>;

// Runs the pipeline; InvalidArgument for bad options, otherwise the first failure as described
// above. All stage processes or threads have ended when it returns.
absl::StatusOr<PipelineReport> RunPipeline(const PipelineOptions& options,
                                           const StageMain& stage_main);

}  // namespace pswitch::pipeline

#endif  // PSWITCH_PIPELINE_COORDINATOR_H_
