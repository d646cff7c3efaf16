#include "controller/task_queue.h"

#include "absl/strings/str_cat.h"

namespace pswitch::controller {

absl::StatusOr<Policy> ParsePolicy(absl::string_view name) {
  if (name == "fcfs") return Policy::kFcfs;
  if (name == "edf") return Policy::kEdf;
  if (name == "priority") return Policy::kPriority;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown policy '", name, "' (expected fcfs, edf or priority)"));
}

absl::string_view PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kFcfs:
      return "fcfs";
    case Policy::kEdf:
      return "edf";
    case Policy::kPriority:
      return "priority";
  }
  return "unknown";
}

void TaskQueue::Push(TaskTicket task) {
  task.arrival_seq = next_seq_++;
  tasks_.push_back(std::move(task));
}

void TaskQueue::PushFront(TaskTicket task) {
  // A sequence number below every arrival's keeps a preempted task first among equals.
  task.arrival_seq = next_front_seq_--;
  tasks_.push_front(std::move(task));
}

bool TaskQueue::RanksBefore(const TaskTicket& a, const TaskTicket& b) const {
  // Consistent with preemption: a waiting inference that would preempt a training task must
  // also be picked before it, or a preempted task would be resumed straight away.
  if (inference_preempts_training_ && a.kind != b.kind) return a.kind == TaskKind::kInference;
  switch (policy_) {
    case Policy::kFcfs:
      break;
    case Policy::kEdf:
      if (a.deadline != b.deadline) return a.deadline < b.deadline;
      break;
    case Policy::kPriority:
      if (a.priority != b.priority) return a.priority > b.priority;
      break;
  }
  return a.arrival_seq < b.arrival_seq;
}

std::list<TaskTicket>::const_iterator TaskQueue::Best() const {
  auto best = tasks_.begin();
  for (auto it = tasks_.begin(); it != tasks_.end(); ++it) {
    if (RanksBefore(*it, *best)) best = it;
  }
  return best;
}

std::optional<TaskTicket> TaskQueue::Pop() {
  if (tasks_.empty()) return std::nullopt;
  auto best = Best();
  TaskTicket task = *best;
  tasks_.erase(best);
  return task;
}

const TaskTicket* TaskQueue::Peek() const {
  if (tasks_.empty()) return nullptr;
  return &*Best();
}

const TaskTicket* TaskQueue::PeekIf(absl::FunctionRef<bool(const TaskTicket&)> eligible) const {
  const TaskTicket* best = nullptr;
  for (const TaskTicket& task : tasks_) {
    if (eligible(task) && (best == nullptr || RanksBefore(task, *best))) best = &task;
  }
  return best;
}

bool TaskQueue::Remove(uint64_t id) {
  for (auto it = tasks_.begin(); it != tasks_.end(); ++it) {
    if (it->id == id) {
      tasks_.erase(it);
      return true;
    }
  }
  return false;
}

bool TaskQueue::ShouldPreempt(const TaskTicket& running, const TaskTicket& waiting) const {
  if (running.kind != TaskKind::kTraining) return false;
  if (inference_preempts_training_ && waiting.kind == TaskKind::kInference) return true;
  if (policy_ == Policy::kFcfs) return false;
  return RanksBefore(waiting, running);
}

}  // namespace pswitch::controller
