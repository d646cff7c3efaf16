// The life cycle of a fill task (FreeRide's side task, §3.1 and Figure 3a) as a state machine.
//
//   SUBMITTED --Create--> CREATED --Init--> PAUSED --Start--> RUNNING --RunNextStep--> RUNNING
//                                             ^                  |
//                                             +------Pause-------+
//   SUBMITTED, CREATED, PAUSED or RUNNING --Stop--> STOPPED (terminal)
//
// The states say which resources the task holds: CREATED has host memory only, PAUSED also
// holds its GPU memory, RUNNING also uses the SMs (inside a bubble), STOPPED holds nothing.
//
// Choices where the paper leaves room:
// - Stop is legal from CREATED, PAUSED and RUNNING, as in the paper, so a user can cancel a
//   task that is waiting between bubbles. We also allow it from SUBMITTED (a cancel before a
//   worker created the process; there is nothing to release), so every cancel ends in STOPPED.
// - Pause is legal only from RUNNING. FreeRide's Algorithm 2 (line 6) pauses the current task
//   at every bubble end, even one it only initialised (already PAUSED) in that bubble; our
//   manager must skip that pause. Rejecting it catches a manager whose idea of the state is
//   wrong, which matters more here than saving the caller one check.
// - RunNextStep is the only self-loop (RUNNING -> RUNNING); everything else is an error.
#ifndef PSWITCH_FILL_STATE_MACHINE_H_
#define PSWITCH_FILL_STATE_MACHINE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "api/types.h"

namespace pswitch::fill {

// The states are the ones clients see (api/types.h): one definition.
using api::FillState;
using api::FillStateName;

// FreeRide's CreateSideTask, InitSideTask, StartSideTask, RunNextStep, PauseSideTask,
// StopSideTask.
enum class FillEvent { kCreate, kInit, kStart, kRunNextStep, kPause, kStop };

// "CreateSideTask", "InitSideTask", ... (the paper's names, for logs).
absl::string_view FillEventName(FillEvent event);

// The state after `event` in `state`; FailedPrecondition naming both for an illegal transition,
// e.g. "fill task: PauseSideTask is not allowed in state PAUSED".
absl::StatusOr<FillState> NextState(FillState state, FillEvent event);

// One task's current state. Starts in SUBMITTED. Not thread-safe: owned by the task's manager.
class FillTaskStateMachine {
 public:
  FillTaskStateMachine() = default;

  FillState state() const { return state_; }
  bool stopped() const { return state_ == FillState::kStopped; }
  // Successful Apply calls, RunNextStep self-loops included.
  int64_t transitions() const { return transitions_; }
  // Successful RunNextStep calls: the steps the task has run.
  int64_t steps_run() const { return steps_run_; }

  // Moves to NextState(state(), event). On error the state and counters are unchanged.
  absl::Status Apply(FillEvent event);

 private:
  FillState state_ = FillState::kSubmitted;
  int64_t transitions_ = 0;
  int64_t steps_run_ = 0;
};

}  // namespace pswitch::fill

#endif  // PSWITCH_FILL_STATE_MACHINE_H_
