// One GPU scheduler's event loop: an Asio io_context run on its own thread. Any thread may post
// to it; once it has ended, posts are dropped. Shared (not owned by the scheduler alone) so that
// callbacks which can fire on other threads after the scheduler is gone (a worker's reader
// thread, a copy engine's completion) post to a closed loop instead of a freed one.
#ifndef PSWITCH_CONTROLLER_EVENT_LOOP_H_
#define PSWITCH_CONTROLLER_EVENT_LOOP_H_

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "asio/io_context.hpp"
#include "asio/post.hpp"

namespace pswitch::controller {

// The loop thread's role, as a capability for clang's thread-safety analysis: what only the
// loop touches is ABSL_GUARDED_BY the role, and code that runs on the loop says so (AssertHeld),
// which the analysis takes as holding it and which checks, at run time, that the caller is the
// loop's thread (a handler on another thread aborts with the reason rather than race).
class ABSL_LOCKABLE LoopRole {
 public:
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {
    const std::thread::id loop = thread_.load(std::memory_order_acquire);
    if (loop != std::thread::id() && loop != std::this_thread::get_id()) {
      std::fprintf(stderr, "pswitch: loop-only code ran off its event loop's thread\n");
      std::abort();
    }
  }

 private:
  friend class EventLoop;
  // The thread running the loop; none before Run (the owner's constructor sets state up).
  std::atomic<std::thread::id> thread_{};
};

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
      role_.AssertHeld();
      fn();
      after_each_();
    });
    return true;
  }
  // Runs handlers on the calling thread until Stop; posts after it are dropped.
  void Run() {
    role_.thread_.store(std::this_thread::get_id(), std::memory_order_release);
    auto work = asio::make_work_guard(io_);
    io_.run();
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  // Ends Run after the handler now running (loop thread).
  void Stop() { io_.stop(); }
  // For timers (loop thread).
  asio::io_context& io() { return io_; }
  // What the loop's owner guards its loop-only state with.
  const LoopRole& role() const { return role_; }

 private:
  LoopRole role_;
  const std::function<void()> after_each_;
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  asio::io_context io_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_EVENT_LOOP_H_
