#include "controller/task_registry.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace pswitch::controller {

absl::string_view TaskPhaseName(TaskPhase phase) {
  switch (phase) {
    case TaskPhase::kQueued:
      return "queued";
    case TaskPhase::kSwitching:
      return "switching";
    case TaskPhase::kRunning:
      return "running";
    case TaskPhase::kSucceeded:
      return "succeeded";
    case TaskPhase::kFailed:
      return "failed";
    case TaskPhase::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

namespace {
constexpr absl::string_view kKilledPayload = "type.pswitch.dev/killed";
}  // namespace

absl::Status MarkKilled(absl::Status status) {
  status.SetPayload(kKilledPayload, absl::Cord("1"));
  return status;
}

bool WasKilled(const absl::Status& status) {
  return status.GetPayload(kKilledPayload).has_value();
}

uint64_t TaskRegistry::Add(absl::string_view model) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  TaskInfo& info = infos_[id];
  info.task_id = id;
  info.model = std::string(model);
  return id;
}

void TaskRegistry::SetPhase(uint64_t task_id, TaskPhase phase, uint32_t iterations,
                            int worker_pid) {
  absl::MutexLock lock(&mu_);
  TaskInfo& info = infos_[task_id];
  info.phase = phase;
  info.iterations_done = iterations;
  info.worker_pid = worker_pid;
}

void TaskRegistry::MarkTransmitted(uint64_t task_id) {
  absl::MutexLock lock(&mu_);
  auto it = infos_.find(task_id);
  if (it != infos_.end() && it->second.phase == TaskPhase::kSwitching) {
    it->second.phase = TaskPhase::kRunning;
  }
}

void TaskRegistry::Requeue(uint64_t task_id, uint32_t iterations) {
  absl::MutexLock lock(&mu_);
  TaskInfo& info = infos_[task_id];
  info.phase = TaskPhase::kQueued;
  info.iterations_done = iterations;
  info.worker_pid = 0;
  ++info.preemptions;
}

void TaskRegistry::RecordCleaning(uint64_t task_id, absl::Duration clean, bool after_drain) {
  absl::MutexLock lock(&mu_);
  auto it = infos_.find(task_id);
  if (it == infos_.end()) return;
  it->second.clean_time = clean;
  it->second.cleaned_after_drain = after_drain;
}

void TaskRegistry::Finish(uint64_t task_id, const absl::Status& error, uint32_t iterations) {
  absl::MutexLock lock(&mu_);
  TaskInfo& info = infos_[task_id];
  info.worker_pid = 0;
  if (error.ok()) {
    info.phase = TaskPhase::kSucceeded;
    info.iterations_done = iterations;
  } else {
    info.phase = absl::IsCancelled(error) ? TaskPhase::kCancelled : TaskPhase::kFailed;
    info.error = error;
  }
  // Only finished tasks are forgotten, oldest first; a long-queued one stays visible.
  for (auto it = infos_.begin(); infos_.size() > max_finished_ && it != infos_.end();) {
    it = it->second.phase >= TaskPhase::kSucceeded ? infos_.erase(it) : std::next(it);
  }
}

absl::StatusOr<TaskInfo> TaskRegistry::Query(uint64_t task_id) const {
  absl::MutexLock lock(&mu_);
  auto it = infos_.find(task_id);
  if (it == infos_.end()) return absl::NotFoundError(absl::StrCat("no task ", task_id));
  return it->second;
}

std::vector<TaskInfo> TaskRegistry::Recent(size_t limit) const {
  absl::MutexLock lock(&mu_);
  std::vector<TaskInfo> out;
  for (auto it = infos_.rbegin(); it != infos_.rend() && out.size() < limit; ++it) {
    out.push_back(it->second);
  }
  return out;
}

}  // namespace pswitch::controller
