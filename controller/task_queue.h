// Pending tasks of one GPU and the scheduling policy that orders them.
//
// Policies (pswitchd --policy):
//   fcfs      arrival order.
//   edf       earliest deadline first; tasks without a deadline come after all that have one,
//             in arrival order.
//   priority  highest priority first, arrival order among equals.
// With inference preempting training (the default), inference tasks also rank before training
// tasks in every policy; the policy orders tasks of the same kind.
// Preemption applies only to a running training task (inference batches always finish; a
// training task stops at its next iteration boundary and resumes later without losing
// progress). A waiting task preempts it when it is inference (unless disabled), or when the
// policy ranks it strictly ahead of the running task.
#ifndef PSWITCH_CONTROLLER_TASK_QUEUE_H_
#define PSWITCH_CONTROLLER_TASK_QUEUE_H_

#include <cstdint>
#include <list>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pswitch::controller {

enum class Policy { kFcfs, kEdf, kPriority };
absl::StatusOr<Policy> ParsePolicy(absl::string_view name);
absl::string_view PolicyName(Policy policy);

enum class TaskKind { kInference, kTraining };

struct TaskTicket {
  uint64_t id = 0;
  std::string model;
  TaskKind kind = TaskKind::kInference;
  int priority = 0;
  absl::Time deadline = absl::InfiniteFuture();
  int64_t arrival_seq = 0;  // assigned by Push (> 0) and PushFront (< 0)
};

// Not thread-safe: owned by one GPU's scheduler thread.
class TaskQueue {
 public:
  explicit TaskQueue(Policy policy, bool inference_preempts_training = true)
      : policy_(policy), inference_preempts_training_(inference_preempts_training) {}

  void Push(TaskTicket task);
  // Re-queues a preempted task ahead of later arrivals with the same rank.
  void PushFront(TaskTicket task);
  // The next task per policy, removed from the queue; nullopt when empty.
  std::optional<TaskTicket> Pop();
  const TaskTicket* Peek() const;
  // The next task per policy among those `eligible` accepts; null when none.
  const TaskTicket* PeekIf(absl::FunctionRef<bool(const TaskTicket&)> eligible) const;
  // Removes a waiting task (cancel); false when it is not waiting.
  bool Remove(uint64_t id);
  size_t size() const { return tasks_.size(); }
  bool empty() const { return tasks_.empty(); }

  // True when `running` should stop at its next synchronisation point for `waiting`.
  bool ShouldPreempt(const TaskTicket& running, const TaskTicket& waiting) const;
  // True when `a` is scheduled before `b` under the policy.
  bool RanksBefore(const TaskTicket& a, const TaskTicket& b) const;

 private:
  std::list<TaskTicket>::const_iterator Best() const;

  const Policy policy_;
  const bool inference_preempts_training_;
  int64_t next_seq_ = 1;
  int64_t next_front_seq_ = -1;  // counts down: PushFront'ed tasks precede every arrival
  std::list<TaskTicket> tasks_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_TASK_QUEUE_H_
