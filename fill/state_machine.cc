#include "fill/state_machine.h"

#include "absl/strings/str_cat.h"

namespace pswitch::fill {

absl::string_view FillEventName(FillEvent event) {
  switch (event) {
    case FillEvent::kCreate:
      return "CreateSideTask";
    case FillEvent::kInit:
      return "InitSideTask";
    case FillEvent::kStart:
      return "StartSideTask";
    case FillEvent::kRunNextStep:
      return "RunNextStep";
    case FillEvent::kPause:
      return "PauseSideTask";
    case FillEvent::kStop:
      return "StopSideTask";
  }
  return "UnknownEvent";
}

absl::StatusOr<FillState> NextState(FillState state, FillEvent event) {
  switch (event) {
    case FillEvent::kCreate:
      if (state == FillState::kSubmitted) return FillState::kCreated;
      break;
    case FillEvent::kInit:
      if (state == FillState::kCreated) return FillState::kPaused;
      break;
    case FillEvent::kStart:
      if (state == FillState::kPaused) return FillState::kRunning;
      break;
    case FillEvent::kRunNextStep:
      if (state == FillState::kRunning) return FillState::kRunning;
      break;
    case FillEvent::kPause:
      if (state == FillState::kRunning) return FillState::kPaused;
      break;
    case FillEvent::kStop:
      if (state != FillState::kStopped) return FillState::kStopped;
      break;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "fill task: ", FillEventName(event), " is not allowed in state ", FillStateName(state)));
}

absl::Status FillTaskStateMachine::Apply(FillEvent event) {
  absl::StatusOr<FillState> next = NextState(state_, event);
  if (!next.ok()) return next.status();
  state_ = *next;
  ++transitions_;
  if (event == FillEvent::kRunNextStep) ++steps_run_;
  return absl::OkStatus();
}

}  // namespace pswitch::fill
