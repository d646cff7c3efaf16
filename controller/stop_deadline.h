// The running task's stop deadline: it was told to stop (preempted, cancelled, shut down, or a
// fill run paused at its bubble's end) and its worker is killed if it has not answered by then,
// so a tenant that never answers cannot hold the GPU. One task at a time (only the running task
// is ever told to stop); for that task the earliest deadline stands. Pure logic, time passed in;
// not thread-safe (the scheduler loop owns it).
#ifndef PSWITCH_CONTROLLER_STOP_DEADLINE_H_
#define PSWITCH_CONTROLLER_STOP_DEADLINE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/time.h"

namespace pswitch::controller {

class StopDeadline {
 public:
  struct Expired {
    uint64_t task = 0;
    std::string reason;  // why it is killed, for its answer
  };

  // `task` must have answered by `deadline`, or be killed for `reason`. A later deadline for the
  // task already armed does not postpone it; one for another task replaces it.
  void Arm(uint64_t task, absl::Time deadline, std::string reason) {
    if (task_ == task && deadline_ <= deadline) return;
    task_ = task;
    deadline_ = deadline;
    reason_ = std::move(reason);
  }
  // `task` answered in time.
  void Met(uint64_t task) {
    if (task_ == task) *this = StopDeadline();
  }
  // The expired deadline at `now`, once.
  std::optional<Expired> Due(absl::Time now) {
    if (task_ == 0 || now < deadline_) return std::nullopt;
    Expired expired{task_, std::move(reason_)};
    *this = StopDeadline();
    return expired;
  }
  absl::Time deadline() const { return deadline_; }  // InfiniteFuture: none

 private:
  uint64_t task_ = 0;
  absl::Time deadline_ = absl::InfiniteFuture();
  std::string reason_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_STOP_DEADLINE_H_
