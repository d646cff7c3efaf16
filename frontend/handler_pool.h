// A fixed set of threads running the HTTP port's handlers, with a bounded queue: a handler may
// read a file or wait briefly on a scheduler's snapshot, which the event loop must never do.
#ifndef PSWITCH_FRONTEND_HANDLER_POOL_H_
#define PSWITCH_FRONTEND_HANDLER_POOL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pswitch::frontend {

// Thread-safe.
class HandlerPool {
 public:
  HandlerPool(size_t threads, size_t max_queued);
  // Stop().
  ~HandlerPool();
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  // Queues `work`; false (and `work` dropped) when the queue is full or the pool stopped.
  bool TrySubmit(std::function<void()> work);
  // Queues `work` past the bound (what finishes work already admitted, such as encoding a
  // task's answer); false only once stopped.
  bool Submit(std::function<void()> work);
  // Runs what is queued, then joins the threads; later submissions are refused. Idempotent.
  void Stop();

 private:
  void Run();
  bool HasWorkOrStopped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || !queue_.empty();
  }
  bool Push(std::function<void()> work, bool bounded);

  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_HANDLER_POOL_H_
