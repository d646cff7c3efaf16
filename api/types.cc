#include "api/types.h"

namespace pswitch::api {

absl::string_view TaskStateName(TaskState state) {
  switch (state) {
    case TaskState::kQueued:
      return "queued";
    case TaskState::kSwitching:
      return "switching";
    case TaskState::kRunning:
      return "running";
    case TaskState::kSucceeded:
      return "succeeded";
    case TaskState::kFailed:
      return "failed";
    case TaskState::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

absl::string_view FillStateName(FillState state) {
  switch (state) {
    case FillState::kSubmitted:
      return "SUBMITTED";
    case FillState::kCreated:
      return "CREATED";
    case FillState::kPaused:
      return "PAUSED";
    case FillState::kRunning:
      return "RUNNING";
    case FillState::kStopped:
      return "STOPPED";
  }
  return "UNKNOWN";
}

}  // namespace pswitch::api
