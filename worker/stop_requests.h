// The worker's Stop commands, as its running task sees them. A Stop arrives on the control thread
// at once (the flag is set, so the run before it in the command queue stops at its next sync
// point) and is handled later, in order, on the serving thread. Counted: handling one Stop must
// not clear a later one that arrived meanwhile, which targets the Run queued between the two
// (clearing it once left a preempted training running until the drain timeout killed it).
#ifndef PSWITCH_WORKER_STOP_REQUESTS_H_
#define PSWITCH_WORKER_STOP_REQUESTS_H_

#include <atomic>
#include <cstdint>

#include "absl/synchronization/mutex.h"

namespace pswitch::worker {

class StopRequests {
 public:
  // Control thread: a Stop command arrived.
  void Received() {
    absl::MutexLock lock(&mu_);
    ++received_;
    pending_.store(true);
  }
  // Serving thread: the oldest Stop command was handled.
  void Handled() {
    absl::MutexLock lock(&mu_);
    if (handled_ < received_) ++handled_;
    pending_.store(received_ > handled_);
  }
  // Whether a received Stop is not yet handled: what a running task polls.
  const std::atomic<bool>& pending() const { return pending_; }

 private:
  std::atomic<bool> pending_{false};
  absl::Mutex mu_;
  uint64_t received_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t handled_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_STOP_REQUESTS_H_
