// One pipeline stage's side of a run: it answers the coordinator's control messages and executes
// the stage's op sequence each iteration, moving activations and gradients over its links.
//
// Per iteration, for each op of the schedule: a forward takes the previous stage's activation
// (stage 0 reads its own data), computes, and sends its output on; a backward takes the next
// stage's gradient (the last stage starts from its loss), computes, and sends the input's
// gradient back. When the message an op needs has not arrived, the stage is in a bubble: it
// calls BubbleReporter::BubbleBegin with the simulator's expected idle time for that point,
// waits (bounded by the receive timeout), and calls BubbleEnd. After its last op the stage
// exchanges tied-weight gradients with the other end if it has any, steps its optimizer,
// reports its measurements, and waits for the others at the barrier (also a bubble).
#ifndef PSWITCH_PIPELINE_STAGE_RUNNER_H_
#define PSWITCH_PIPELINE_STAGE_RUNNER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "pipeline/bubble_reporter.h"
#include "pipeline/schedule.h"
#include "pipeline/stage_compute.h"
#include "pipeline/wire.h"
#include "base/unique_fd.h"

namespace pswitch::pipeline {

struct StageConfig {
  int stage = 0;
  Schedule schedule;
  uint64_t bubble_free_bytes = 0;  // passed to every BubbleBegin
  // Longest wait for a neighbour's message or for the coordinator's next iteration.
  absl::Duration receive_timeout = absl::Seconds(60);
  uint64_t max_payload_bytes = kDefaultMaxPayloadBytes;
  // Testing aid: the stage kills itself (SIGKILL) when this iteration starts; -1: never.
  int crash_at_iteration = -1;
};

// A stage's sockets; an absent neighbour's is invalid.
struct StageLinks {
  UniqueFd control;  // to the coordinator
  UniqueFd prev;     // to stage - 1
  UniqueFd next;     // to stage + 1
  UniqueFd tied;     // to the pipeline's other end, for tied weights
};

// Serves stage `config.stage` until the coordinator sends Stop (OK) or something fails (the
// error names the stage and what it was doing). `links`, `compute` and `reporter` are borrowed
// for the call. Sends no error report itself: the caller does (see coordinator.h).
absl::Status ServeStage(const StageConfig& config, StageLinks& links, StageCompute& compute,
                        BubbleReporter& reporter);

}  // namespace pswitch::pipeline

#endif  // PSWITCH_PIPELINE_STAGE_RUNNER_H_
