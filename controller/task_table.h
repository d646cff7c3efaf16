// The scheduler's one record per unfinished task (what it asked for, how to answer it, where a
// preempted run resumes, why it was told to stop), and the index of their deadlines, kept in
// step with the records here rather than in parallel maps. Loop thread only.
#ifndef PSWITCH_CONTROLLER_TASK_TABLE_H_
#define PSWITCH_CONTROLLER_TASK_TABLE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "controller/task_spec.h"

namespace pswitch::controller {

struct TaskRecord {
  TaskSpec spec;
  TaskCallback done;
  // Iterations a preempted training task already did: its next run resumes there.
  uint32_t resume_iteration = 0;
  // Why it was told to stop for good (cancelled, past its deadline, its model unloaded): its
  // answer, whatever the run then reports. The first reason stands.
  std::optional<absl::Status> stop_reason;
  // It yielded the GPU while its inputs arrived (YieldUnrun): no second hold.
  bool inputs_yielded = false;
  // Requeued once because its worker died before its Run: a second death fails it (the
  // placement itself may be what kills workers).
  bool requeued_after_death = false;
  // Preempted, its trained weights stayed in its model's region unsaved (issue 29 item 6): its
  // next run must find them there, or they were lost. Cleared once they are written back.
  bool weights_unsaved = false;
  // Its optimizer state, kept on the GPU while it was preempted, could not be saved when the
  // pool needed the room: it fails rather than resume from zeros.
  std::optional<absl::Status> state_lost;

  void StopFor(absl::Status why) {
    if (!stop_reason) stop_reason = std::move(why);
  }
  // The stop reason, now answered: cleared so it is used once.
  std::optional<absl::Status> TakeStopReason() {
    std::optional<absl::Status> why = std::move(stop_reason);
    stop_reason.reset();
    return why;
  }
};

class TaskTable {
 public:
  // Task `id` (not present yet); with `deadline`, one with an expiry is indexed by it.
  TaskRecord& Add(uint64_t id, TaskSpec spec, TaskCallback done, bool deadline = true) {
    if (deadline && spec.expires != absl::InfiniteFuture()) deadlines_.emplace(spec.expires, id);
    TaskRecord& r = records_[id];
    r.spec = std::move(spec);
    r.done = std::move(done);
    return r;
  }
  TaskRecord* Find(uint64_t id) {
    auto it = records_.find(id);
    return it == records_.end() ? nullptr : &it->second;
  }
  const TaskRecord* Find(uint64_t id) const {
    auto it = records_.find(id);
    return it == records_.end() ? nullptr : &it->second;
  }
  // Task `id`, which must be unfinished.
  TaskRecord& at(uint64_t id) { return records_.at(id); }
  const TaskRecord& at(uint64_t id) const { return records_.at(id); }
  // Removes task `id` and its deadline; nullopt when it is not here (answered already).
  std::optional<TaskRecord> Take(uint64_t id) {
    auto it = records_.find(id);
    if (it == records_.end()) return std::nullopt;
    deadlines_.erase({it->second.spec.expires, id});
    TaskRecord r = std::move(it->second);
    records_.erase(it);
    return r;
  }
  // The earliest deadline of a task still indexed; InfiniteFuture when none.
  absl::Time NextDeadline() const {
    return deadlines_.empty() ? absl::InfiniteFuture() : deadlines_.begin()->first;
  }
  // The tasks whose deadline is at or before `now`, earliest first, out of the index (their
  // records stay until they are answered).
  std::vector<uint64_t> TakeExpired(absl::Time now) {
    std::vector<uint64_t> out;
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      out.push_back(deadlines_.begin()->second);
      deadlines_.erase(deadlines_.begin());
    }
    return out;
  }
  // Every unfinished task, by id.
  const std::map<uint64_t, TaskRecord>& all() const { return records_; }

 private:
  std::map<uint64_t, TaskRecord> records_;
  std::set<std::pair<absl::Time, uint64_t>> deadlines_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_TASK_TABLE_H_
