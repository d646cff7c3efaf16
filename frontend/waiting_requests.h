// HTTP requests waiting on the controller (an infer's task, a load, an unload, a copy's
// registration): each answered exactly once, by the controller's callback, by the sweeper past
// its deadline (504), or at shutdown (503). The controller's callbacks hold this object, not the
// server: one that fires after the HTTP server is gone finds it stopped and does nothing.
#ifndef PSWITCH_FRONTEND_WAITING_REQUESTS_H_
#define PSWITCH_FRONTEND_WAITING_REQUESTS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "frontend/handler_pool.h"
#include "frontend/http_message.h"

namespace pswitch::frontend {

// Thread-safe.
class WaitingRequests {
 public:
  // `*pool` runs Run()'s work until Stop(); it must outlive that.
  WaitingRequests(HandlerPool* pool, absl::Duration timeout) : timeout_(timeout), pool_(pool) {}
  WaitingRequests(const WaitingRequests&) = delete;
  WaitingRequests& operator=(const WaitingRequests&) = delete;

  // Holds `respond` until Take(id), its deadline (now + timeout: 504 naming `what`) or Stop()
  // (503). 0 when already stopped: `respond` has then been answered 503.
  uint64_t Add(HttpRespond respond, std::string what);
  // The request's responder, once; null if it was answered already (deadline, shutdown).
  HttpRespond Take(uint64_t id);
  // Runs `work` on the handler pool (past its bound: work already admitted); false once stopped.
  bool Run(std::function<void()> work);
  // Answers every request past its deadline with 504; then waits up to `period` or until Stop().
  // False once stopped.
  bool SweepAndWait(absl::Duration period);
  // Answers every waiting request 503 and forgets the pool. Idempotent.
  void Stop();

 private:
  bool Stopped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pool_ == nullptr; }
  struct Waiting {
    HttpRespond respond;
    absl::Time deadline;
    std::string what;
  };

  const absl::Duration timeout_;
  absl::Mutex mu_;
  HandlerPool* pool_ ABSL_GUARDED_BY(mu_);  // null once stopped
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Waiting> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_WAITING_REQUESTS_H_
