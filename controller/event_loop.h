// One GPU scheduler's event loop: an Asio io_context run on its own thread. Any thread may post
// to it; once it has ended, posts are dropped. Shared (not owned by the scheduler alone) so that
// callbacks which can fire on other threads after the scheduler is gone (a worker's reader
// thread, a copy engine's completion) post to a closed loop instead of a freed one.
#ifndef PSWITCH_CONTROLLER_EVENT_LOOP_H_
#define PSWITCH_CONTROLLER_EVENT_LOOP_H_

#include <functional>
#include <memory>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "asio/io_context.hpp"
#include "asio/post.hpp"

namespace pswitch::controller {

// Thread-safe.
class EventLoop {
 public:
  // `after_each` runs on the loop thread after every posted handler: the owner's reaction to
  // whatever just happened.
  explicit EventLoop(std::function<void()> after_each) : after_each_(std::move(after_each)) {}

  // Runs `fn`, then after_each, on the loop thread unless the loop has ended. False when
  // dropped.
  bool Post(std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    asio::post(io_, [this, fn = std::move(fn)] {
      fn();
      after_each_();
    });
    return true;
  }
  // Runs handlers on the calling thread until Stop; posts after it are dropped.
  void Run() {
    auto work = asio::make_work_guard(io_);
    io_.run();
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  // Ends Run after the handler now running (loop thread).
  void Stop() { io_.stop(); }
  // For timers (loop thread).
  asio::io_context& io() { return io_; }

 private:
  const std::function<void()> after_each_;
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  asio::io_context io_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_EVENT_LOOP_H_
