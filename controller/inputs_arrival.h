// A task's inputs that were still arriving when it was queued: a raw TCP payload being received
// into the task's staging region (docs/dataplane.md). The front end receiving them ends the
// arrival once, with OK or why the bytes will never all come; the scheduler watches it, so the
// task's switch (preemption, placement, Prepare, the weights' copy) starts from the header while
// the bytes arrive, and its Run goes out only once they are in.
//
// Thread-safe: End runs on a front end's thread, Watch and Unwatch on the scheduler's loop.
#ifndef PSWITCH_CONTROLLER_INPUTS_ARRIVAL_H_
#define PSWITCH_CONTROLLER_INPUTS_ARRIVAL_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"

namespace pswitch::controller {

class InputsArrival {
 public:
  InputsArrival() = default;
  InputsArrival(const InputsArrival&) = delete;
  InputsArrival& operator=(const InputsArrival&) = delete;

  // The inputs are all in (OK) or never will be (why). The first call counts; later ones are
  // ignored. The watcher, if any, runs on this thread, after the state changed.
  void End(absl::Status status) {
    std::function<void()> watcher;
    {
      absl::MutexLock lock(&mu_);
      if (status_) return;
      if (status.ok()) arrived_ns_ = base::MonotonicNowNs();
      status_ = std::move(status);
      watcher = std::move(on_end_);
      on_end_ = nullptr;
    }
    if (watcher) watcher();
  }
  // nullopt while they are arriving; then OK, or why they never will.
  std::optional<absl::Status> ended() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  // When they were all in (CLOCK_MONOTONIC ns); 0 while arriving, or when they never came.
  int64_t arrived_ns() const {
    absl::MutexLock lock(&mu_);
    return arrived_ns_;
  }
  // `on_end` runs once, when End is called: on End's thread, or at once on this one if it was
  // already. Replaces an earlier watcher.
  void Watch(std::function<void()> on_end) {
    {
      absl::MutexLock lock(&mu_);
      if (!status_) {
        on_end_ = std::move(on_end);
        return;
      }
    }
    on_end();
  }
  // No watcher any more (the task is answered).
  void Unwatch() {
    absl::MutexLock lock(&mu_);
    on_end_ = nullptr;
  }

 private:
  mutable absl::Mutex mu_;
  std::optional<absl::Status> status_ ABSL_GUARDED_BY(mu_);
  int64_t arrived_ns_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void()> on_end_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_INPUTS_ARRIVAL_H_
