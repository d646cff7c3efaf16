#include "api/client_codec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "proto/wire_status.h"

namespace pswitch::api {
namespace {

absl::Status Unknown(absl::string_view what, int value) {
  return absl::InvalidArgumentError(
      absl::StrCat("unknown ", what, " ", value, " on the wire (a newer peer?)"));
}

uint64_t NonNegativeUs(absl::Duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(absl::ToInt64Microseconds(d), 0));
}

}  // namespace

proto::TaskState ToWire(TaskState state) {
  switch (state) {
    case TaskState::kQueued:
      return proto::TaskState::Queued;
    case TaskState::kSwitching:
      return proto::TaskState::Switching;
    case TaskState::kRunning:
      return proto::TaskState::Running;
    case TaskState::kSucceeded:
      return proto::TaskState::Succeeded;
    case TaskState::kFailed:
      return proto::TaskState::Failed;
    case TaskState::kCancelled:
      return proto::TaskState::Cancelled;
  }
  return proto::TaskState::Failed;
}

absl::StatusOr<TaskState> FromWire(proto::TaskState state) {
  switch (state) {
    case proto::TaskState::Queued:
      return TaskState::kQueued;
    case proto::TaskState::Switching:
      return TaskState::kSwitching;
    case proto::TaskState::Running:
      return TaskState::kRunning;
    case proto::TaskState::Succeeded:
      return TaskState::kSucceeded;
    case proto::TaskState::Failed:
      return TaskState::kFailed;
    case proto::TaskState::Cancelled:
      return TaskState::kCancelled;
  }
  return Unknown("task state", static_cast<int>(state));
}

proto::FillState ToWire(FillState state) {
  switch (state) {
    case FillState::kSubmitted:
      return proto::FillState::Submitted;
    case FillState::kCreated:
      return proto::FillState::Created;
    case FillState::kPaused:
      return proto::FillState::Paused;
    case FillState::kRunning:
      return proto::FillState::Running;
    case FillState::kStopped:
      return proto::FillState::Stopped;
  }
  return proto::FillState::Stopped;
}

absl::StatusOr<FillState> FromWire(proto::FillState state) {
  switch (state) {
    case proto::FillState::Submitted:
      return FillState::kSubmitted;
    case proto::FillState::Created:
      return FillState::kCreated;
    case proto::FillState::Paused:
      return FillState::kPaused;
    case proto::FillState::Running:
      return FillState::kRunning;
    case proto::FillState::Stopped:
      return FillState::kStopped;
  }
  return Unknown("fill state", static_cast<int>(state));
}

proto::FillKind ToWire(FillKind kind) {
  switch (kind) {
    case FillKind::kInference:
      return proto::FillKind::Inference;
    case FillKind::kTraining:
      return proto::FillKind::Training;
    case FillKind::kSynthetic:
      return proto::FillKind::Synthetic;
  }
  return proto::FillKind::Synthetic;
}

absl::StatusOr<FillKind> FromWire(proto::FillKind kind) {
  switch (kind) {
    case proto::FillKind::Inference:
      return FillKind::kInference;
    case proto::FillKind::Training:
      return FillKind::kTraining;
    case proto::FillKind::Synthetic:
      return FillKind::kSynthetic;
  }
  return Unknown("fill job kind", static_cast<int>(kind));
}

flatbuffers::Offset<proto::TaskStatus> Encode(flatbuffers::FlatBufferBuilder& b,
                                              const TaskStatus& s) {
  auto error = s.error.ok() ? 0 : proto::CreateWireError(b, s.error);
  return proto::CreateTaskStatus(
      b, s.task_id, ToWire(s.state), b.CreateString(s.model), s.iterations_done, error,
      s.preemptions, s.worker_pid,
      static_cast<uint64_t>(std::max<int64_t>(absl::ToInt64Nanoseconds(s.clean_time), 0)),
      s.cleaned_after_drain);
}

absl::StatusOr<TaskStatus> Decode(const proto::TaskStatus& wire) {
  TaskStatus s;
  PSWITCH_ASSIGN_OR_RETURN(s.state, FromWire(wire.state()));
  s.task_id = wire.task_id();
  s.model = wire.model() != nullptr ? wire.model()->str() : "";
  s.iterations_done = wire.iterations_done();
  s.preemptions = wire.preemptions();
  s.worker_pid = wire.worker_pid();
  s.clean_time = absl::Nanoseconds(static_cast<int64_t>(wire.clean_ns()));
  s.cleaned_after_drain = wire.cleaned_after_drain();
  if (wire.error() != nullptr) s.error = proto::FromWireError(wire.error());
  return s;
}

flatbuffers::Offset<proto::FillStatus> Encode(flatbuffers::FlatBufferBuilder& b,
                                              const FillJobStatus& s) {
  auto error = s.error.ok() ? 0 : proto::CreateWireError(b, s.error);
  return proto::CreateFillStatus(b, s.job_id, ToWire(s.state), s.gpu, s.steps_done,
                                 s.steps_total, s.bubbles, NonNegativeUs(s.predicted_remaining),
                                 s.meets_deadline, error);
}

absl::StatusOr<FillJobStatus> Decode(const proto::FillStatus& wire) {
  FillJobStatus s;
  PSWITCH_ASSIGN_OR_RETURN(s.state, FromWire(wire.state()));
  s.job_id = wire.job_id();
  s.gpu = wire.gpu();
  s.steps_done = wire.steps_done();
  s.steps_total = wire.steps_total();
  s.bubbles = wire.bubbles();
  s.predicted_remaining = absl::Microseconds(static_cast<int64_t>(
      std::min<uint64_t>(wire.predicted_completion_us(), uint64_t{1} << 62)));
  s.meets_deadline = wire.meets_deadline();
  if (wire.error() != nullptr) s.error = proto::FromWireError(wire.error());
  return s;
}

flatbuffers::Offset<proto::FillStats> Encode(flatbuffers::FlatBufferBuilder& b,
                                             const FillStats& s) {
  return proto::CreateFillStats(
      b, s.bubbles, NonNegativeUs(s.bubble_time), NonNegativeUs(s.fill_step_time), s.steps,
      absl::ToDoubleMicroseconds(s.pause_p50), absl::ToDoubleMicroseconds(s.pause_p99), s.killed,
      s.runs, s.bell_wakes);
}

FillStats Decode(const proto::FillStats& wire) {
  FillStats s;
  s.bubbles = wire.bubbles();
  s.bubble_time = absl::Microseconds(static_cast<int64_t>(wire.bubble_us()));
  s.fill_step_time = absl::Microseconds(static_cast<int64_t>(wire.fill_step_us()));
  s.steps = wire.steps();
  s.pause_p50 = absl::Microseconds(wire.pause_latency_p50_us());
  s.pause_p99 = absl::Microseconds(wire.pause_latency_p99_us());
  s.killed = wire.killed();
  s.runs = wire.runs();
  s.bell_wakes = wire.bell_wakes();
  return s;
}

}  // namespace pswitch::api
