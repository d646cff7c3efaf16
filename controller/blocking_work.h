// One thread for the work a scheduler's event loop must not wait for: a stopped training run's
// checkpoint (waiting for its transmission's end, copying its weights and optimizer state out of
// the arena, allocating and freeing pinned memory) and a starting run's restore (leasing its
// optimizer area, copying its checkpoint in). Jobs run one at a time, in order, and post their
// results back to the loop themselves.
#ifndef PSWITCH_CONTROLLER_BLOCKING_WORK_H_
#define PSWITCH_CONTROLLER_BLOCKING_WORK_H_

#include <deque>
#include <functional>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"

namespace pswitch::controller {

// Thread-safe. Every job must be bounded (each wait in it has a timeout). The destructor runs
// the jobs still queued, then joins: what they save is saved even at shutdown, and nothing they
// use may be destroyed before this object.
class BlockingWork {
 public:
  BlockingWork() : thread_([this] { Run(); }) {}
  ~BlockingWork() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }
  BlockingWork(const BlockingWork&) = delete;
  BlockingWork& operator=(const BlockingWork&) = delete;

  // Queues `job`; returns at once.
  void Add(std::function<void()> job) {
    absl::MutexLock lock(&mu_);
    jobs_.push_back(std::move(job));
  }

 private:
  void Run() {
    while (true) {
      std::function<void()> job;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !jobs_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (jobs_.empty()) return;  // stopping, and every queued job ran
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();  // destroyed here too, with what it captured, off the loop
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest exists
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_BLOCKING_WORK_H_
