#include "controller/task_registry.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace pswitch::controller {

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
  TaskStatus& info = infos_[id];
  info.task_id = id;
  info.model = std::string(model);
  return id;
}

void TaskRegistry::SetState(uint64_t task_id, TaskState state, uint32_t iterations,
                            int worker_pid) {
  absl::MutexLock lock(&mu_);
  TaskStatus& info = infos_[task_id];
  info.state = state;
  info.iterations_done = iterations;
  info.worker_pid = worker_pid;
}

void TaskRegistry::MarkTransmitted(uint64_t task_id) {
  absl::MutexLock lock(&mu_);
  auto it = infos_.find(task_id);
  if (it != infos_.end() && it->second.state == TaskState::kSwitching) {
    it->second.state = TaskState::kRunning;
  }
}

void TaskRegistry::Requeue(uint64_t task_id, uint32_t iterations) {
  absl::MutexLock lock(&mu_);
  TaskStatus& info = infos_[task_id];
  info.state = TaskState::kQueued;
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

void TaskRegistry::Progress(uint64_t task_id, uint32_t iterations) {
  absl::MutexLock lock(&mu_);
  auto it = infos_.find(task_id);
  if (it == infos_.end() || it->second.state >= TaskState::kSucceeded) return;
  it->second.iterations_done = std::max(it->second.iterations_done, iterations);
}

void TaskRegistry::Finish(uint64_t task_id, const absl::Status& error, uint32_t iterations) {
  absl::MutexLock lock(&mu_);
  TaskStatus& info = infos_[task_id];
  info.worker_pid = 0;
  if (error.ok()) {
    info.state = TaskState::kSucceeded;
    info.iterations_done = iterations;
  } else {
    info.state = absl::IsCancelled(error) ? TaskState::kCancelled : TaskState::kFailed;
    info.error = error;
  }
  // Only finished tasks are forgotten, oldest first; a long-queued one stays visible.
  for (auto it = infos_.begin(); infos_.size() > max_finished_ && it != infos_.end();) {
    it = it->second.state >= TaskState::kSucceeded ? infos_.erase(it) : std::next(it);
  }
}

absl::StatusOr<TaskStatus> TaskRegistry::Query(uint64_t task_id) const {
  absl::MutexLock lock(&mu_);
  auto it = infos_.find(task_id);
  if (it == infos_.end()) return absl::NotFoundError(absl::StrCat("no task ", task_id));
  return it->second;
}

std::vector<TaskStatus> TaskRegistry::Recent(size_t limit) const {
  absl::MutexLock lock(&mu_);
  std::vector<TaskStatus> out;
  for (auto it = infos_.rbegin(); it != infos_.rend() && out.size() < limit; ++it) {
    out.push_back(it->second);
  }
  return out;
}

}  // namespace pswitch::controller
