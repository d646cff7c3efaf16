// When a fill task's bubble run gets this GPU (fill/ decides what runs in which bubble). At
// most one at a time: admitted while none is waiting or running, it waits until no task wants
// the GPU (any task that arrives preempts it), and at its bubble's end one that never started
// is answered as paused at once. A running one is told to stop then, and killed past its grace
// (StopDeadline). Pure bookkeeping; not thread-safe (the scheduler loop owns it).
#ifndef PSWITCH_CONTROLLER_BUBBLE_ADMISSION_H_
#define PSWITCH_CONTROLLER_BUBBLE_ADMISSION_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "controller/task_queue.h"

namespace pswitch::controller {

class BubbleAdmission {
 public:
  // Admits `run` unless one waits already or `fill_running`. FailedPrecondition otherwise.
  absl::Status Admit(const TaskTicket& run, bool fill_running) {
    if (waiting_ || fill_running) {
      return absl::FailedPreconditionError("a fill run is already on this GPU");
    }
    waiting_ = run;
    return absl::OkStatus();
  }
  // The run waiting for the GPU, when no task wants it; null when none waits or a task does.
  const TaskTicket* Next(bool tasks_waiting) const {
    return waiting_ && !tasks_waiting ? &*waiting_ : nullptr;
  }
  bool waiting() const { return waiting_.has_value(); }
  // The waiting run got the GPU (or its answer).
  void Taken() { waiting_.reset(); }
  // Run `id` is withdrawn before it started (true; it is to be answered as paused).
  bool Withdraw(uint64_t id) {
    if (!waiting_ || waiting_->id != id) return false;
    waiting_.reset();
    return true;
  }
  // The bubble ended: the waiting run, which never started and is to be answered as paused.
  std::optional<uint64_t> EndBubble() {
    std::optional<uint64_t> id;
    if (waiting_) id = waiting_->id;
    waiting_.reset();
    return id;
  }

 private:
  std::optional<TaskTicket> waiting_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_BUBBLE_ADMISSION_H_
