// What clients can ask about tasks: each task's state, progress and error, from submission until
// long after it finished. The scheduler loop writes it; client threads read it. Thread-safe.
#ifndef PSWITCH_CONTROLLER_TASK_REGISTRY_H_
#define PSWITCH_CONTROLLER_TASK_REGISTRY_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "api/types.h"

namespace pswitch::controller {

// What clients see of a task (api/types.h): one definition.
using api::TaskState;
using api::TaskStateName;
using api::TaskStatus;

// A task whose worker pswitchd killed (it did not stop, pause or drain in time) fails with a
// status that says so in a payload, so callers count kills without matching error text.
absl::Status MarkKilled(absl::Status status);
bool WasKilled(const absl::Status& status);

class TaskRegistry {
 public:
  // Beyond `max_finished` entries the oldest finished tasks are forgotten (NotFound).
  explicit TaskRegistry(size_t max_finished = 10000) : max_finished_(max_finished) {}

  // A new task, queued; ids are 1, 2, 3, ...
  uint64_t Add(absl::string_view model);
  void SetState(uint64_t task_id, TaskState state, uint32_t iterations = 0, int worker_pid = 0);
  // Its model is fully transmitted: a switching task is now simply running.
  void MarkTransmitted(uint64_t task_id);
  // Preempted: back in the queue with `iterations` done.
  void Requeue(uint64_t task_id, uint32_t iterations);
  void RecordCleaning(uint64_t task_id, absl::Duration clean, bool after_drain);
  // A running task, or one whose run just ended, has `iterations` done (never fewer than known).
  void Progress(uint64_t task_id, uint32_t iterations);
  // Succeeded with `iterations` done, or failed / cancelled (Cancelled code) with `error`,
  // keeping the iterations done so far (Progress).
  void Finish(uint64_t task_id, const absl::Status& error, uint32_t iterations);

  absl::StatusOr<TaskStatus> Query(uint64_t task_id) const;
  // The `limit` most recent tasks, newest first.
  std::vector<TaskStatus> Recent(size_t limit) const;

 private:
  const size_t max_finished_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, TaskStatus> infos_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_TASK_REGISTRY_H_
